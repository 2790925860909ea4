"""Grid versus adaptive through the real workflow on the stand-in, where screening cells do not settle (SIMULATED).

Each study runs twice with Snakemake, in a fresh copy of the workflow with a snapshot of the package (so editing the
sources while it runs changes nothing): as a grid and as `sweep.strategy: adaptive`, with the same stand-in.
Studies (`--studies`, comma-separated):

- `drift-18`: benchmarks/studies/drift-18.yaml over the demo: 18 configured points, 11 of which run, on a stand-in
  that varies 2% between launches and slows down under load like a GPU (`--sim-drift 0.3 --sim-drift-s 0.1`);
  adaptive with .test/adaptive.yaml's settings. The default `benchmark.stability_tolerance` (10%).
- `demo`: the shipped demo, `.test/config.yaml .test/adaptive.yaml`, against the same files with
  `sweep.strategy: grid` (so both use the adaptive demo's stand-in, 2% launch noise).
- `drift-all`: drift-18 with benchmarks/studies/drift-all.yaml over it: every screening cell drifts.

Per run it prints the point jobs' time (the sum of `duration_s` over every launch's status.json or failure.json: the
grid's launches; the adaptive study's screening, confirmation and settling launches; in both, the baselines' apart),
the adaptive funnel (screening cells that did not settle, points screened, kept, dropped by each rule, confirmed)
and each priority's pick and recommended point from reports/summary.json. The `latency_first` pick is scored against
the truth: the stand-in's model without noise or drift (`ddsweep.sim.model`, with the launcher's `--sim-*`
parameters) gives each point's median decode speed at the latency regime's cell, simulated request by request as its
scheduler runs at batch 1 (the first token after prefill, then one verify step of `step_time_s` per draw of accepted
tokens); the pick is compared with the best of the grid's running points.

`--strategies grid,adaptive,grid-settled,adaptive-settled` adds both with every cell taken as settled
(`benchmark.stability_tolerance: 100`: each cell stops at its minimum window and no figure is unsettled), a
reference for what the study costs where nothing is unsettled.

Usage: python benchmarks/bench_adaptive_workflow.py [--studies drift-18,demo,drift-all]
       [--strategies grid,adaptive,grid-settled,adaptive-settled] [--cores 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ddsweep.adaptive.refinement import resolve_point
from ddsweep.config.plan import running_points
from ddsweep.config.points import Point
from ddsweep.config.study import load_config
from ddsweep.sim.cli import build_parser
from ddsweep.sim.model import Knobs, ModelParams, depth_probabilities, step_time_s

ROOT = Path(__file__).resolve().parents[1]
DEMO = [".test/config.yaml"]
ADAPTIVE = ".test/adaptive.yaml"
DRIFT = ["benchmarks/studies/drift-18.yaml"]
ALL_DRIFT = [*DRIFT, "benchmarks/studies/drift-all.yaml"]
GRID = {"sweep": {"strategy": "grid"}}
# the adaptive study as before instability counted: every cell taken as settled
IGNORED = {"benchmark": {"stability_tolerance": 100.0}}
# study -> strategy -> config files (a dict is written to a file of its own); the `-settled` pair takes every cell
# as settled (a reference: what the study costs where no cell is unsettled, each at its minimum window)
STUDIES = {
    "drift-18": {"grid": [*DEMO, *DRIFT], "adaptive": [*DEMO, ADAPTIVE, *DRIFT],
                 "grid-settled": [*DEMO, *DRIFT, IGNORED], "adaptive-settled": [*DEMO, ADAPTIVE, *DRIFT, IGNORED]},
    "demo": {"grid": [*DEMO, ADAPTIVE, GRID], "adaptive": [*DEMO, ADAPTIVE],
             "grid-settled": [*DEMO, ADAPTIVE, GRID, IGNORED], "adaptive-settled": [*DEMO, ADAPTIVE, IGNORED]},
    "drift-all": {"grid": [*DEMO, *ALL_DRIFT], "adaptive": [*DEMO, ADAPTIVE, *ALL_DRIFT]},
}


def snapshot(dest: Path) -> Path:
    """A copy of the workflow and the package sources as they are now, which every run copies."""
    for name in ("Snakefile", "workflow", "config", ".test", "envs", "profiles", "benchmarks/studies", "src"):
        source, target = ROOT / name, dest / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    return dest


def copy_workflow(source: Path, dest: Path) -> Path:
    """A working copy of the snapshot (its own results/ and .snakemake/), the package imported from its src/."""
    shutil.copytree(source, dest)
    return dest


def config_files(workdir: Path, files: list) -> list[str]:
    """The config file arguments, writing the dict entries to files of their own."""
    out = []
    for i, entry in enumerate(files):
        if isinstance(entry, dict):
            path = workdir / f"overlay-{i}.yaml"
            path.write_text(yaml.safe_dump(entry))
            entry = path.name
        out.append(str(entry))
    return out


def run_study(workdir: Path, files: list[str], cores: int) -> float:
    """Run the workflow; returns its wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(workdir / "src"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    started = time.perf_counter()
    with open(workdir / "snakemake.log", "w") as log:
        result = subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "--configfile", *files],
                                cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if result.returncode:
        raise SystemExit(f"snakemake failed in {workdir} (exit {result.returncode}); see {workdir}/snakemake.log")
    return time.perf_counter() - started


def job_seconds(results: Path) -> dict[str, float]:
    """Point-job seconds per stage: the grid's launches (its baselines' apart), the adaptive study's baselines' one
    launch each, screening and confirmation launches."""
    out: dict[str, float] = {}
    for stage, pattern in (("grid", "launches/*/launch-*"), ("screen", "screen/*"), ("confirm", "confirm/*/launch-*")):
        for directory in results.glob(pattern):
            point = directory.parent.name if stage != "screen" else directory.name
            key = "baselines" if point == "ar" or point.startswith("dflash") else stage
            for name in ("status.json", "failure.json"):
                if (directory / name).exists():
                    duration = json.loads((directory / name).read_text()).get("duration_s") or 0.0
                    out[key] = out.get(key, 0.0) + float(duration)
                    break
    return out


def picks(workdir: Path) -> dict[str, tuple[str, str]]:
    """Per priority, the summary's pick (best score) and its recommended point (cheapest of the tied set)."""
    summary = json.loads((workdir / "reports" / "summary.json").read_text())
    return {p["name"]: (p["pick"], p["recommended"]) for p in summary["priorities"]}


def funnel_counts(workdir: Path) -> dict:
    """The adaptive study's screening: cells that did not settle, points screened, unsettled, dropped by rule."""
    results = workdir / "results"
    cells = [c for path in (results / "screen").glob("*/bench/cells.json")
             for c in json.loads(path.read_text())["cells"]]
    doc = json.loads((results / "screen" / "funnel.json").read_text())
    return {"cells": len(cells), "unsettled_cells": sum(not c["window"]["stable"] for c in cells),
            "screened": sum(doc["stages"].get(s, {}).get("points", 0) for s in ("baselines", "screen", "refine")),
            "unsettled_points": len(doc.get("unstable", {})), "dropped_by": doc.get("dropped_by_rule", {}),
            "entered_confirm": doc["stages"]["confirm"]["points"], "confirmed": len(doc["survivors"]),
            "settle": doc["stages"]["settle"]["points"], "cost": doc.get("cost", {})}


def model_params(config: dict) -> ModelParams:
    """The stand-in's model parameters from the study's launcher (`--sim-*` flags), without noise or drift."""
    launcher = config["engine"]["launcher"]
    args, _ = build_parser().parse_known_args(["--model-path", "m", *launcher[launcher.index("sim-server") + 1:]])
    return ModelParams(step_ms=args.sim_step_ms, token_cost=args.sim_token_cost, draft_frac=args.sim_draft_frac,
                       draft_batch_frac=args.sim_draft_batch_frac, prefill_ms_per_1k=args.sim_prefill_ms_per_1k,
                       trained_block_size=args.sim_trained_block_size, trained_window=args.sim_trained_window)


def true_decode_speed(params: ModelParams, point: Point, max_tokens: int, per_cell: int, cells: int = 3000) -> float:
    """The expected latency figure of `point` in the stand-in's model: the mean over `cells` cells of the median
    per-request decode speed of `per_cell` requests at C=1. Each request stops at max_tokens or its natural end
    (16–2047 tokens), has its first token after prefill, then one verify step at batch 1 per draw of accepted tokens
    (depth by depth, as AcceptanceSampler draws; code prompts). With short answers a request takes a whole number
    of steps, so a point whose answers need 6 or 7 steps about equally often has no typical speed: the expected
    median of a cell is its figure."""
    knobs = Knobs(point.kind, point.budget, point.topk, point.block_size, point.window)
    probs = depth_probabilities(params, knobs, "code")
    step = step_time_s(params, knobs, 1)
    rng = random.Random(f"truth-{point.point_id}")

    def speed() -> float:
        tokens = min(max_tokens, 16 + rng.randrange(2032))
        produced, steps = 1, 0
        while produced < tokens:
            accepted = 1
            for p in probs:
                if rng.random() >= p:
                    break
                accepted += 1
            produced, steps = produced + accepted, steps + 1
        return (tokens - 1) / (steps * step)

    return statistics.fmean(statistics.median(speed() for _ in range(per_cell)) for _ in range(cells))


def truth(workdir: Path, extra: list[str], adaptive: Path) -> tuple[dict[str, float], float]:
    """Each running point's and each of `extra`'s (refinement points of the adaptive study run in ADAPTIVE) true
    latency figure (decode speed at the latency_first priority's regime cell, for cells of as many requests as the
    grid's measured there: their median), and the best of the running points' (the grid's)."""
    config = load_config(workdir / "results" / "study_config.yaml")
    refined = load_config(adaptive / "results" / "study_config.yaml")
    params = model_params(config)
    weights = config["analysis"]["priorities"]["latency_first"]
    (regime,) = [r for r in config["analysis"]["regimes"] if r["name"] in weights]
    assert regime["metric"] == "decode_tok_s" and regime["concurrency"] == 1, regime
    tokens = config["benchmark"]["max_new_tokens"]
    cell = (config["benchmark"]["workloads"][0]["name"], regime["context"], 1)
    per_cell = round(statistics.median(
        c["completed"] for path in (workdir / "results" / "points").glob("*/bench/cells.json")
        for c in json.loads(path.read_text())["cells"] if (c["workload"], c["context"], c["concurrency"]) == cell))
    grid = {p.point_id: true_decode_speed(params, p, tokens, per_cell) for p in running_points(config)}
    others = {pid: true_decode_speed(params, resolve_point(refined, pid), tokens, per_cell)
              for pid in extra if pid not in grid}
    return {**grid, **others}, max(grid.values())


def report(study: str, rows: dict) -> None:
    """Print each strategy's figures against the grid's."""
    grid = rows["grid"]
    adaptive = next(row for name, row in rows.items() if name.startswith("adaptive"))
    true, best = truth(grid["workdir"], [pick for row in rows.values() for pick, _ in row["picks"].values()],
                       adaptive["workdir"])
    leader = max(p for p in true if true[p] == best)
    print(f"\n## {study} (the grid: {' '.join(str(f) for f in STUDIES[study]['grid'])})")
    print("true latency figures (tok/s): " + ", ".join(f"{pid} {v:.0f}" for pid, v in
                                                        sorted(true.items(), key=lambda kv: -kv[1])))
    for strategy, row in rows.items():
        jobs = sum(row["jobs"].values())
        reference = strategy.replace("adaptive", "grid")
        grid_s = sum(rows[reference]["jobs"].values())
        line = [f"{strategy}: point jobs {jobs:.0f} s = {jobs / grid_s:.0%} of {reference}'s "
                f"({', '.join(f'{k} {v:.0f} s' for k, v in row['jobs'].items())}; workflow wall {row['wall']:.0f} s)"]
        if strategy.startswith("adaptive"):
            counts = funnel_counts(row["workdir"])
            line.append(f"  screening: {counts['unsettled_cells']} of {counts['cells']} cells did not settle; "
                        f"{counts['unsettled_points']} of {counts['screened']} points (baselines included) unsettled "
                        "somewhere; "
                        f"dropped by rule {counts['dropped_by'] or 'n/a'}; {counts['entered_confirm']} entered the "
                        f"confirmation, {counts['confirmed']} confirmed, {counts['settle']} settled further")
            if counts["cost"]:
                cost = counts["cost"]
                line.append(f"  funnel: jobs {cost['jobs_estimate_min']:.1f} min in the plan's cost model, "
                            f"{cost['ratio_to_grid']:.0%} of the grid's {cost['grid_estimate_min']:.1f} min "
                            f"(expected {cost['adaptive_expected_min']:.1f} min), {cost['unsettled_share']:.0%} of "
                            f"{cost['cells']} cells unsettled")
        for name, (pick, recommended) in row["picks"].items():
            text = f"  {name}: pick {pick} (recommended {recommended})"
            if name == "latency_first":
                text += f", true figure {true[pick] / best - 1:+.1%} vs the best grid point ({leader}, {best:.0f})"
            line.append(text)
        print("\n".join(line))
    sys.stdout.flush()


def main() -> int:
    """Run the studies and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--studies", default="drift-18,demo,drift-all")
    parser.add_argument("--strategies", default="grid,adaptive",
                        help="grid, adaptive, grid-settled and adaptive-settled (every cell taken as settled)")
    parser.add_argument("--cores", type=int, default=1, help="snakemake --cores (1: one point job at a time)")
    parser.add_argument("--keep", type=Path, help="keep the working copies under this directory; a run already "
                        "completed there (reports/summary.json) is read, not run again")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-adaptive-")) if args.keep is None else args.keep
    print(f"SIMULATED (the stand-in server); snakemake --cores {args.cores}; working copies in {base}")
    source = None
    for study in args.studies.split(","):
        rows = {}
        wanted = [s for s in args.strategies.split(",") if s in STUDIES[study]]
        for strategy in ["grid", *(s for s in wanted if s != "grid")]:
            workdir, wall = base / study / strategy, float("nan")
            if not (workdir / "reports" / "summary.json").exists():
                source = source or snapshot(base / f"snapshot-{time.strftime('%H%M%S')}")
                shutil.rmtree(workdir, ignore_errors=True)
                copy_workflow(source, workdir)
                wall = run_study(workdir, config_files(workdir, STUDIES[study][strategy]), args.cores)
            rows[strategy] = {"wall": wall, "jobs": job_seconds(workdir / "results"), "picks": picks(workdir),
                              "workdir": workdir}
        report(study, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
