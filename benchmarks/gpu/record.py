"""Write the committed record of a GPU check (benchmarks/gpu/check.sh) from its run directory: every figure is read
from the files the workflow and capture.py wrote, nothing is typed in.
Usage: python3 record.py RUN_DIR OUT_DIR [--log CHECK_LOG] [--fixtures DIR] [--gpu-seconds S]
Writes OUT_DIR/README.md (provenance, start-up times, acceptance beside SGLang's own, speed-ups over ar, spread
between repeats and launches, failures) and copies the tables, the summary and summary.json beside it."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

import pandas as pd


def _json(path: Path) -> dict:
    """A JSON file, or {} when absent."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _table(rows: list[list], columns: list[str]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def launches(run: Path, point: str) -> list[Path]:
    """The directories of a point's server launches (grid launches, else the point directory itself)."""
    found = sorted((run / "results" / "launches" / point).glob("launch-*"))
    return found or [run / "results" / "points" / point]


def startup_rows(run: Path, points: list[str]) -> list[list]:
    """Per point: each launch's start-up time and outcome."""
    rows = []
    for point in points:
        for directory in launches(run, point):
            status = _json(directory / "status.json") or _json(directory / "failure.json")
            if not status:
                continue
            rows.append([point, directory.name, status.get("status"), status.get("startup_s") and
                         f"{status['startup_s']:.1f}", status.get("duration_s") and f"{status['duration_s']:.0f}",
                         (status.get("error") or "").splitlines()[0][:160] if status.get("error") else ""])
    return rows


def acceptance_rows(run: Path, points: list[str]) -> list[list]:
    """Per point: acceptance as ddsweep computes it (completion tokens over verify steps, measured requests)
    beside the mean of SGLang's own per-request spec_accept_length, and their ratio."""
    rows = []
    for point in points:
        path = run / "results" / "points" / point / "bench" / "requests.jsonl"
        if not path.exists():
            continue
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        measured = [r for r in records if not r.get("warmup") and r.get("error") is None and r.get("spec_verify_ct")]
        if not measured:
            continue
        ours = sum(r["completion_tokens"] for r in measured) / sum(r["spec_verify_ct"] for r in measured)
        per_request = [r["acceptance_length"] for r in measured]
        engine = [r["engine_accept_length"] for r in measured if r.get("engine_accept_length") is not None]
        engine_mean = statistics.fmean(engine) if engine else None
        rows.append([point, len(measured), f"{ours:.3f}", f"{statistics.fmean(per_request):.3f}",
                     f"{engine_mean:.3f}" if engine_mean is not None else "not sent",
                     f"{statistics.fmean(per_request) / engine_mean:.4f}" if engine_mean else ""])
    return rows


def spread_rows(run: Path) -> list[list]:
    """Per point and cell: output throughput of every repeat (with its launch), the spread max/min - 1."""
    cells = run / "results" / "tables" / "bench_cells.csv"
    if not cells.exists():
        return []
    frame = pd.read_csv(cells)
    rows = []
    for (point, context, concurrency), group in frame.groupby(["point_id", "context", "concurrency"], sort=True):
        values = group.sort_values("repeat")["output_throughput_tok_s"].dropna().tolist()
        walls = group["wall_s"].dropna().tolist()
        if not values:
            continue
        rows.append([point, int(context), int(concurrency), ", ".join(f"{v:.0f}" for v in values),
                     f"{(max(values) / min(values) - 1) * 100:.1f}%" if min(values) > 0 else "",
                     f"{min(walls):.1f}–{max(walls):.1f}" if walls else ""])
    return rows


AGREEMENT = 0.05


def _fmt(value: object, digits: int = 0) -> str:
    """A number with `digits` decimals, blank when missing."""
    return "" if value is None or pd.isna(value) else f"{float(value):.{digits}f}"


def _fmt_all(values: pd.Series, digits: int = 0) -> str:
    """Each value formatted, comma-separated; blank when none was measured (no NVML, a simulated study)."""
    return ", ".join(_fmt(v, digits) for v in values) if values.notna().any() else ""


def agreement_rows(run: Path) -> list[list]:
    """Per point and cell: the output throughput of each server launch, how far the launches are apart (max/min
    - 1), and whether they agree within AGREEMENT or a launch's cell is flagged unstable; the window, warm-up and
    energy figures of each launch's cell beside them."""
    cells = run / "results" / "tables" / "bench_cells.csv"
    if not cells.exists():
        return []
    frame = pd.read_csv(cells)
    rows = []
    for (point, context, concurrency), group in frame.groupby(["point_id", "context", "concurrency"], sort=True):
        group = group.sort_values(["launch", "repeat"])
        by_launch = group.groupby("launch", sort=True)["output_throughput_tok_s"].mean().dropna()
        apart = by_launch.max() / by_launch.min() - 1 if len(by_launch) > 1 and by_launch.min() > 0 else None
        unstable = not group["stable"].fillna(False).astype(bool).all()
        verdict = ("one launch" if apart is None else "agree" if apart <= AGREEMENT
                   else "flagged unstable" if unstable else "**apart, not flagged**")
        settled = group["warmup_settled"].dropna()
        rows.append([point, int(context), int(concurrency),
                     ", ".join(_fmt(v) for v in by_launch), "" if apart is None else f"{apart * 100:.1f}%", verdict,
                     _fmt_all(group["wall_s"], 1), _fmt_all(group["subwindow_spread"], 3),
                     f"{int(settled.astype(bool).sum())}/{len(settled)}" if len(settled) else "",
                     _fmt_all(group["energy_j_per_output_token"], 4), _fmt_all(group["gpu_power_w_mean"])])
    return rows


def speedup_rows(run: Path) -> list[list]:
    """Per point and regime: the speed-up over ar with its interval (overview.csv)."""
    overview = run / "results" / "tables" / "overview.csv"
    if not overview.exists():
        return []
    frame = pd.read_csv(overview)
    rows = []
    for column in [c for c in frame.columns if c.endswith("_speedup_vs_ar")]:
        regime = column.removesuffix("_speedup_vs_ar")
        low, high = f"{regime}_speedup_ci_low", f"{regime}_speedup_ci_high"
        for _, row in frame.iterrows():
            if pd.isna(row[column]):
                continue
            interval = (f"{row[low]:.2f}–{row[high]:.2f}" if low in frame and not pd.isna(row[low]) else "none")
            rows.append([row["point_id"], regime, f"{row[column]:.3f}", interval])
    return rows


def provenance(run: Path, points: list[str]) -> list[str]:
    """The platform as ddsweep recorded it for the first point that ran."""
    for point in points:
        env = _json(run / "results" / "points" / point / "environment.json")
        if env:
            return [f"- `{key}`: {json.dumps(env[key])[:300]}" for key in sorted(env)
                    if key in ("gpus", "gpu", "driver", "engine", "engine_version", "interconnect", "host",
                               "hostname", "python", "git_commit", "launcher", "cuda")]
    return ["- no environment.json was written"]


def fixture_rows(fixtures: Path) -> list[list]:
    """Per captured server: start-up time and SGLang's own speculative counts for one 64-token request."""
    rows = []
    for capture in _json_list(fixtures / "captures.json"):
        meta = capture.get("meta_info") or {}
        rows.append([capture.get("point"), capture.get("startup_s"), meta.get("completion_tokens"),
                     meta.get("spec_verify_ct"), meta.get("spec_accept_length"),
                     (capture.get("error") or "").split(";")[0][:200]])
    return rows


def _json_list(path: Path) -> list:
    """A JSON list, or [] when absent."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--log", type=Path, help="check.sh's output")
    parser.add_argument("--fixtures", type=Path)
    parser.add_argument("--gpu-seconds", type=float, help="device time the whole check held the GPU")
    args = parser.parse_args()
    run, out = args.run, args.out
    out.mkdir(parents=True, exist_ok=True)
    plan = _json(run / "results" / "plan.json")
    points = [p["point_id"] for p in plan.get("points", []) if p.get("runs", True)] or sorted(
        p.name for p in (run / "results" / "points").iterdir())
    sections = ["# GPU check record", "", "Written by `benchmarks/gpu/record.py` from the run directory of "
                "`benchmarks/gpu/check.sh`; every figure below is read from the files the workflow wrote.", ""]
    if args.gpu_seconds:
        sections += [f"Device time of the whole check (install, capture, study): {args.gpu_seconds:.0f} s.", ""]
    if args.log and args.log.exists():
        tail = [line for line in args.log.read_text(errors="replace").splitlines() if line.startswith("check.sh:")]
        sections += ["## What check.sh said", "", "```", *tail, "```", ""]
    sections += ["## Platform (environment.json of the first point)", "", *provenance(run, points), ""]
    sections += ["## Server launches", "", _table(startup_rows(run, points),
                                                  ["point", "launch", "status", "start-up s", "job s", "error"]), ""]
    sections += ["## Acceptance: ddsweep's against SGLang's own", "",
                 "ddsweep: sum of completion tokens over sum of verify steps of the measured requests, and the "
                 "mean of per-request ratios; SGLang: the mean of `meta_info.spec_accept_length`.", "",
                 _table(acceptance_rows(run, points), ["point", "requests", "ddsweep (ratio of sums)",
                                                       "ddsweep (mean per request)", "SGLang (mean)",
                                                       "ddsweep / SGLang"]), ""]
    sections += ["## Speed-ups over ar", "", _table(speedup_rows(run), ["point", "regime", "speed-up", "interval"]),
                 ""]
    sections += ["## Output throughput of every repeat (tok/s) and its spread", "",
                 "Repeats are in launch order: with `sweep.launches: 2` the first half ran on the first server "
                 "launch, the second half on the second.", "",
                 _table(spread_rows(run), ["point", "context", "C", "repeats (tok/s)", "max/min − 1",
                                           "cell wall s"]), ""]
    sections += ["## Launches side by side", "",
                 f"Output throughput of each cell per server launch (tok/s, launch order), how far apart the "
                 f"launches are (max/min − 1), and the verdict: `agree` within {AGREEMENT:.0%}, `flagged unstable` "
                 "when a launch's cell did not settle (its sub-windows disagreed at the cap), else **apart, not "
                 "flagged**. Beside them per launch: the cell's wall time (s), its sub-window spread, the warm-ups "
                 "that settled, energy per output token (J, NVML) and mean GPU power (W).", "",
                 _table(agreement_rows(run), ["point", "context", "C", "tok/s per launch", "apart", "verdict",
                                              "cell wall s", "sub-window spread", "warm-ups settled",
                                              "J per output token", "GPU W"]), ""]
    if args.fixtures and args.fixtures.exists():
        sections += ["## Captured servers (fixtures)", "", _table(fixture_rows(args.fixtures), [
            "point", "start-up s", "completion tokens", "spec_verify_ct", "spec_accept_length", "error"]), ""]
    (out / "README.md").write_text("\n".join(sections))
    for source in [run / "reports" / "optimization_summary.md", run / "reports" / "summary.json",
                   *sorted((run / "results" / "tables").glob("*.csv")), run / "results" / "plan.json"]:
        if source.exists():
            shutil.copy(source, out / source.name)
    print(out / "README.md")


if __name__ == "__main__":
    main()
