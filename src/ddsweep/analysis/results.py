"""Load a results directory into tidy pandas tables, tolerating missing or malformed files.

Every point directory under ``results/points/`` becomes one :class:`PointRecord`; its benchmark cells, groups
and coding problems become rows of the tidy tables described in ``docs/results-schema.md``. A file that is
missing or unreadable never raises: the point is recorded with the reason so the summary can list it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

KNOBS: tuple[str, ...] = ("budget", "topk", "block_size", "window")
GROUP_METRICS: tuple[str, ...] = (
    "output_throughput_tok_s",
    "decode_tok_s",
    "acceptance_length",
    "ttft_p50_s",
    "tpot_p50_s",
)
LOWER_IS_BETTER: frozenset[str] = frozenset({"ttft_p50_s", "tpot_p50_s"})
METRIC_LABELS: dict[str, str] = {
    "decode_tok_s": "single-request decode speed (tok/s)",
    "output_throughput_tok_s": "aggregate output throughput (tok/s)",
    "acceptance_length": "mean acceptance length (tokens/verify step)",
    "ttft_p50_s": "median time to first token (s)",
    "tpot_p50_s": "median time per output token (s)",
}
POINT_COLUMNS: tuple[str, ...] = (
    "point_id", "kind", "preset", *KNOBS, "status", "error_kind", "simulated", "gpu_name", "gpu_count",
    "interconnect", "engine_version", "git_commit", "hostname",
)
CELL_COLUMNS: tuple[str, ...] = (
    "point_id", "kind", *KNOBS, "context", "concurrency", "repeat", "completed", "failed",
    "output_throughput_tok_s", "decode_tok_s_median", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s",
    "itl_p50_s", "e2e_p50_s", "acceptance_length", "simulated",
)
GROUP_COLUMNS: tuple[str, ...] = (
    "point_id", "kind", *KNOBS, "context", "concurrency", "metric", "median", "ci_low", "ci_high", "repeats",
    "simulated",
)
FAILURE_COLUMNS: tuple[str, ...] = (
    "point_id", "kind", "preset", *KNOBS, "status", "error_kind", "reason", "step", "duration_s", "host",
    "slurm_job_id", "simulated",
)
JOB_COLUMNS: tuple[str, ...] = (
    "point_id", "status", "host", "slurm_job_id", "slurm_nodelist", "slurm_partition", "gpu_name", "started_utc",
    "duration_s", "simulated",
)
CODING_COLUMNS: tuple[str, ...] = (
    "point_id", "task_id", "passed", "error_kind", "finish_reason", "truncated", "completion_tokens",
    "simulated",
)


@dataclass
class PointRecord:
    """One sweep point as found on disk: knobs, outcome, platform and any problems reading its files."""

    point_id: str
    kind: str | None = None
    preset: str | None = None
    budget: int | None = None
    topk: int | None = None
    block_size: int | None = None
    window: int | None = None
    status: str = "incomplete"
    error_kind: str | None = None
    error: str | None = None
    simulated: bool = False
    environment: dict[str, Any] = field(default_factory=dict)
    verification_ok: bool | None = None
    issues: list[str] = field(default_factory=list)
    outcome: dict[str, Any] = field(default_factory=dict)

    def knobs(self) -> dict[str, int | None]:
        """Return the four knobs as a dict (None where a knob does not apply or the window is off)."""
        return {k: getattr(self, k) for k in KNOBS}

    def label(self) -> str:
        """Return a short human-readable description of the knobs, e.g. 'budget 8, topk 4, bs 8, window 2048'."""
        if self.kind == "ar":
            return "autoregressive baseline"
        parts = []
        for knob, name in (("budget", "budget"), ("topk", "topk"), ("block_size", "bs")):
            if getattr(self, knob) is not None:
                parts.append(f"{name} {getattr(self, knob)}")
        parts.append(f"window {window_label(self.window)}")
        return f"{self.kind or 'unknown kind'}: " + ", ".join(parts)


@dataclass
class ResultSet:
    """Everything loaded from one results directory, as records and tidy tables."""

    results_dir: Path
    points: list[PointRecord]
    cells: pd.DataFrame
    groups: pd.DataFrame
    coding: pd.DataFrame
    coding_records: dict[str, list[dict[str, Any]]]
    coding_summaries: dict[str, dict[str, Any]]

    @property
    def simulated(self) -> bool:
        """True when any point or record was produced by the simulated server."""
        return any(p.simulated for p in self.points)

    def point(self, point_id: str) -> PointRecord | None:
        """Return the record of `point_id`, or None."""
        return next((p for p in self.points if p.point_id == point_id), None)

    def ok_points(self) -> list[PointRecord]:
        """Return the points that completed."""
        return [p for p in self.points if p.status == "ok"]

    def points_frame(self) -> pd.DataFrame:
        """Return the points table (one row per point)."""
        rows = []
        for p in self.points:
            gpus = p.environment.get("gpus") if isinstance(p.environment.get("gpus"), list) else []
            engine = p.environment.get("engine") if isinstance(p.environment.get("engine"), dict) else {}
            rows.append({
                "point_id": p.point_id, "kind": p.kind, "preset": p.preset, **p.knobs(), "status": p.status,
                "error_kind": p.error_kind, "simulated": p.simulated,
                "gpu_name": gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None,
                "gpu_count": p.environment.get("gpu_count"),
                "interconnect": p.environment.get("interconnect"),
                "engine_version": engine.get("version"),
                "git_commit": p.environment.get("git_commit"),
                "hostname": p.environment.get("hostname"),
            })
        return _frame(rows, POINT_COLUMNS)

    def failures_frame(self) -> pd.DataFrame:
        """Return one row per point that did not complete: its kind, knobs, error kind and a one-line reason."""
        rows = [{"point_id": p.point_id, "kind": p.kind, "preset": p.preset, **p.knobs(), "status": p.status,
                 "error_kind": p.error_kind, "reason": first_line(p.error),
                 "step": next((k for k, v in p.outcome.get("steps", {}).items() if v == "started"), None)
                 if isinstance(p.outcome.get("steps"), dict) else None,
                 "duration_s": p.outcome.get("duration_s"), "host": p.outcome.get("host"),
                 "slurm_job_id": p.outcome.get("slurm_job_id"), "simulated": p.simulated}
                for p in self.points if p.status != "ok"]
        return _frame(rows, FAILURE_COLUMNS)

    def jobs_frame(self) -> pd.DataFrame:
        """Return where each point ran: host, Slurm job id, node list, partition, GPU model, duration."""
        rows = []
        for p in self.points:
            slurm = p.environment.get("slurm") if isinstance(p.environment.get("slurm"), dict) else {}
            gpus = p.environment.get("gpus") if isinstance(p.environment.get("gpus"), list) else []
            rows.append({"point_id": p.point_id, "status": p.status,
                         "host": p.outcome.get("host") or p.environment.get("hostname"),
                         "slurm_job_id": p.outcome.get("slurm_job_id") or slurm.get("job_id"),
                         "slurm_nodelist": p.outcome.get("slurm_nodelist") or slurm.get("nodelist"),
                         "slurm_partition": slurm.get("partition"),
                         "gpu_name": gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None,
                         "started_utc": p.outcome.get("started_utc"), "duration_s": p.outcome.get("duration_s"),
                         "simulated": p.simulated})
        return _frame(rows, JOB_COLUMNS)


def failure_patterns(points: list[PointRecord]) -> list[str]:
    """Sentences for knob thresholds that separate failed points from the rest, e.g. 'every point with budget >= 24
    failed (startup_exit): ...'; only where at least two points failed that way and some point below (or above)
    the threshold did not."""
    sentences = []
    for kind in sorted({p.error_kind for p in points if p.status == "failed" and p.error_kind}):
        failed = [p for p in points if p.status == "failed" and p.error_kind == kind]
        for knob in KNOBS:
            values = [getattr(p, knob) for p in failed]
            if len(failed) < 2 or any(v is None for v in values):
                continue
            for symbol, bound, beyond in ((">=", min(values), lambda v, b: v >= b),
                                          ("<=", max(values), lambda v, b: v <= b)):
                with_knob = [p for p in points if getattr(p, knob) is not None]
                inside = [p for p in with_knob if beyond(getattr(p, knob), bound)]
                if all(p in failed for p in inside) and len(inside) < len(with_knob):
                    sentences.append(f"every point with {knob} {symbol} {bound} failed ({kind}): "
                                     + ", ".join(p.point_id for p in inside))
                    break
    return sentences


def first_line(text: str | None) -> str | None:
    """The first non-empty line of a message (a failure's one-line reason)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else None


def window_label(window: int | float | None) -> str:
    """Render a window knob for people: 'off' when the sliding window is disabled."""
    if window is None or (isinstance(window, float) and math.isnan(window)):
        return "off"
    return str(int(window))


def is_missing(value: Any) -> bool:
    """True for None, NaN and pandas NA, so knob comparisons treat 'off' and 'not applicable' alike."""
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def same_knob(a: Any, b: Any) -> bool:
    """Compare two knob values, treating missing values as equal to each other."""
    if is_missing(a) or is_missing(b):
        return is_missing(a) and is_missing(b)
    return int(a) == int(b)


def _frame(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pd.DataFrame:
    """Build a DataFrame with exactly `columns`, knob columns as nullable integers."""
    frame = pd.DataFrame(rows, columns=list(columns))
    for knob in KNOBS:
        if knob in frame.columns:
            frame[knob] = pd.array(frame[knob].tolist(), dtype="Int64") if len(frame) else frame[knob]
    if "simulated" in frame.columns:
        frame["simulated"] = frame["simulated"].astype(bool)
    return frame


def _read_json(path: Path, issues: list[str], required: bool) -> Any:
    """Read a JSON file, appending a reason to `issues` when it is missing (and required) or malformed."""
    if not path.exists():
        if required:
            issues.append(f"{path.name} missing")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        issues.append(f"{path.parent.name}/{path.name} malformed: {exc}")
        return None


def _read_jsonl(path: Path, issues: list[str]) -> list[dict[str, Any]]:
    """Read JSON Lines, skipping (and reporting) lines that are not JSON objects."""
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        issues.append(f"{path.name} unreadable: {exc}")
        return []
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            bad += 1
    if bad:
        issues.append(f"{path.name}: {bad} malformed line(s) skipped")
    return records


def _int_or_none(value: Any) -> int | None:
    """Coerce a knob value to int, or None when absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _num(value: Any) -> float:
    """Coerce a figure to float, NaN when absent or not numeric."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _sub(record: dict[str, Any], key: str, sub: str) -> float:
    """Return record[key][sub] as float, NaN when any level is missing."""
    inner = record.get(key)
    return _num(inner.get(sub)) if isinstance(inner, dict) else math.nan


def _load_point(directory: Path) -> tuple[PointRecord, dict[str, Any] | None, list[dict], dict | None]:
    """Read one point directory into its record, cells document, coding problems and coding summary."""
    record = PointRecord(point_id=directory.name)
    issues = record.issues
    simulated_flags: list[bool] = []

    point = _read_json(directory / "point.json", issues, required=True)
    if isinstance(point, dict):
        record.point_id = str(point.get("point_id") or directory.name)
        record.kind = point.get("kind")
        record.preset = point.get("preset")
        knobs = point.get("knobs") if isinstance(point.get("knobs"), dict) else {}
        for knob in KNOBS:
            setattr(record, knob, _int_or_none(knobs.get(knob)))
        simulated_flags.append(bool(point.get("simulated")))
    elif point is not None:
        issues.append("point.json is not a JSON object")
    point_ok = isinstance(point, dict)

    status = _read_json(directory / "status.json", issues, required=False)
    failure = _read_json(directory / "failure.json", issues, required=False)
    outcome = failure if isinstance(failure, dict) else status
    if isinstance(outcome, dict):
        record.outcome = outcome
    if isinstance(failure, dict):
        record.status = "failed"
        record.error_kind = failure.get("error_kind")
        record.error = failure.get("error") or "failure.json gives no error message"
        simulated_flags.append(bool(failure.get("simulated")))
    elif isinstance(status, dict) and status.get("status") == "ok":
        record.status = "ok"
        simulated_flags.append(bool(status.get("simulated")))
    elif status is not None or failure is not None:
        record.status = "malformed"
        record.error = "status.json/failure.json unreadable or without a valid status"
    else:
        record.status = "incomplete"
        record.error = "neither status.json nor failure.json exists (the point never finished)"

    environment = _read_json(directory / "environment.json", issues, required=record.status == "ok")
    if isinstance(environment, dict):
        record.environment = environment
        simulated_flags.append(bool(environment.get("simulated")))

    verification = _read_json(directory / "verification.json", issues, required=False)
    if isinstance(verification, dict) and "ok" in verification:
        record.verification_ok = bool(verification["ok"])

    cells = _read_json(directory / "bench" / "cells.json", issues, required=record.status == "ok")
    if cells is not None and not isinstance(cells, dict):
        issues.append("bench/cells.json is not a JSON object")
        cells = None
    if isinstance(cells, dict):
        simulated_flags.append(bool(cells.get("simulated")))

    problems = _read_jsonl(directory / "coding" / "problems.jsonl", issues)
    coding_summary = _read_json(directory / "coding" / "summary.json", issues, required=False)
    if not isinstance(coding_summary, dict):
        coding_summary = None
    else:
        simulated_flags.append(bool(coding_summary.get("simulated")))
    simulated_flags.extend(bool(p.get("simulated")) for p in problems if "simulated" in p)

    if not point_ok and record.status != "failed":
        record.status = "malformed"
        record.error = "; ".join(i for i in issues if i.startswith("point")) or "point.json unreadable"
    elif record.status == "ok" and cells is None:
        record.status = "malformed"
        record.error = "completed, but " + "; ".join(i for i in issues if "cells.json" in i)
    record.simulated = any(simulated_flags)
    return record, cells, problems, coding_summary


def _cell_rows(record: PointRecord, cells: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """Turn a cells.json document into tidy cell rows and group rows."""
    base = {"point_id": record.point_id, "kind": record.kind, **record.knobs(), "simulated": record.simulated}
    cell_rows, group_rows = [], []
    for cell in cells.get("cells") or []:
        if not isinstance(cell, dict) or _int_or_none(cell.get("context")) is None:
            record.issues.append("bench/cells.json: a cell without a context was skipped")
            continue
        cell_rows.append({
            **base, "context": _int_or_none(cell.get("context")),
            "concurrency": _int_or_none(cell.get("concurrency")), "repeat": _int_or_none(cell.get("repeat")),
            "completed": _int_or_none(cell.get("completed")), "failed": _int_or_none(cell.get("failed")),
            "output_throughput_tok_s": _num(cell.get("output_throughput_tok_s")),
            "decode_tok_s_median": _sub(cell, "decode_tok_s", "median"),
            "ttft_p50_s": _sub(cell, "ttft_s", "p50"), "ttft_p90_s": _sub(cell, "ttft_s", "p90"),
            "ttft_p99_s": _sub(cell, "ttft_s", "p99"), "tpot_p50_s": _sub(cell, "tpot_s", "p50"),
            "itl_p50_s": _sub(cell, "itl_s", "p50"), "e2e_p50_s": _sub(cell, "e2e_s", "p50"),
            "acceptance_length": _num(cell.get("acceptance_length")),
        })
    for group in cells.get("groups") or []:
        if not isinstance(group, dict) or _int_or_none(group.get("context")) is None:
            record.issues.append("bench/cells.json: a group without a context was skipped")
            continue
        for metric in GROUP_METRICS:
            figure = group.get(metric)
            if not isinstance(figure, dict) or math.isnan(_num(figure.get("median"))):
                continue
            median = _num(figure.get("median"))
            low, high = _num(figure.get("ci_low")), _num(figure.get("ci_high"))
            group_rows.append({
                **base, "context": _int_or_none(group.get("context")),
                "concurrency": _int_or_none(group.get("concurrency")), "metric": metric, "median": median,
                "ci_low": median if math.isnan(low) else low, "ci_high": median if math.isnan(high) else high,
                "repeats": _int_or_none(group.get("repeats")),
            })
    return cell_rows, group_rows


def _coding_rows(record: PointRecord, problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn coding problem records into tidy rows."""
    return [{
        "point_id": record.point_id, "task_id": p.get("task_id"), "passed": bool(p.get("passed")),
        "error_kind": p.get("error_kind"), "finish_reason": p.get("finish_reason"),
        "truncated": is_truncated(p), "completion_tokens": _int_or_none(p.get("completion_tokens")),
        "simulated": record.simulated,
    } for p in problems]


def is_truncated(problem: dict[str, Any]) -> bool:
    """True when a coding answer hit the token limit (flag, error kind or finish reason say so)."""
    return bool(problem.get("truncated")) or problem.get("error_kind") == "truncated" or (
        problem.get("finish_reason") == "length")


def load_results(results_dir: str | Path, point_ids: list[str] | None = None) -> ResultSet:
    """Read the points under RESULTS_DIR/points (all, or only `point_ids`) into a ResultSet; never raises on a
    bad point. Directories of points no longer in the study are left out, so an old run cannot leak in."""
    results_dir = Path(results_dir)
    points: list[PointRecord] = []
    cell_rows: list[dict] = []
    group_rows: list[dict] = []
    coding_rows: list[dict] = []
    coding_records: dict[str, list[dict]] = {}
    coding_summaries: dict[str, dict] = {}
    points_dir = results_dir / "points"
    directories = sorted(d for d in points_dir.iterdir() if d.is_dir()) if points_dir.is_dir() else []
    if point_ids is not None:
        directories = [d for d in directories if d.name in set(point_ids)]
    for directory in directories:
        record, cells, problems, coding_summary = _load_point(directory)
        points.append(record)
        if cells is not None:
            cells_part, groups_part = _cell_rows(record, cells)
            cell_rows.extend(cells_part)
            group_rows.extend(groups_part)
        if problems:
            coding_records[record.point_id] = problems
            coding_rows.extend(_coding_rows(record, problems))
        if coding_summary is not None:
            coding_summaries[record.point_id] = coding_summary
    return ResultSet(
        results_dir=results_dir, points=points, cells=_frame(cell_rows, CELL_COLUMNS),
        groups=_frame(group_rows, GROUP_COLUMNS), coding=_frame(coding_rows, CODING_COLUMNS),
        coding_records=coding_records, coding_summaries=coding_summaries,
    )


@dataclass(frozen=True)
class Regime:
    """A decision regime: one metric at one (context, concurrency) cell."""

    name: str
    metric: str
    context: int
    concurrency: int

    @property
    def lower_is_better(self) -> bool:
        """True for latency-like metrics where a smaller figure wins."""
        return self.metric in LOWER_IS_BETTER

    def describe(self) -> str:
        """Human-readable definition of the regime as configured."""
        return f"{self.metric} at context {self.context}, C={self.concurrency}"


@dataclass
class ResolvedRegime:
    """A regime mapped onto the cell actually present in the data, with one row per point."""

    regime: Regime
    context: int | None
    concurrency: int | None
    note: str | None
    table: pd.DataFrame

    def cell(self) -> str:
        """The cell used, e.g. 'context 128, C=1'."""
        if self.context is None:
            return "no data"
        return f"context {self.context}, C={self.concurrency}"

    def figure(self, point_id: str) -> dict[str, float] | None:
        """Return {median, ci_low, ci_high} of `point_id` in this regime, or None."""
        rows = self.table[self.table["point_id"] == point_id]
        if rows.empty:
            return None
        row = rows.iloc[0]
        return {"median": float(row["median"]), "ci_low": float(row["ci_low"]), "ci_high": float(row["ci_high"])}


def resolve_regime(groups: pd.DataFrame, regime: Regime, point_ids: list[str] | None = None) -> ResolvedRegime:
    """Select the regime's metric at its cell (or the nearest cell present) for each point in `point_ids`."""
    data = groups[groups["metric"] == regime.metric]
    if point_ids is not None:
        data = data[data["point_id"].isin(point_ids)]
    if data.empty:
        return ResolvedRegime(regime, None, None, f"no {regime.metric} figures in the data", data.copy())
    data = data[(data["context"] > 0) & (data["concurrency"] > 0)]
    if data.empty:
        return ResolvedRegime(regime, None, None, f"no {regime.metric} figures at a valid cell", data.copy())
    contexts = sorted({int(c) for c in data["context"].dropna()})
    context = min(contexts, key=lambda c: (abs(math.log(c / regime.context)), c))
    at_context = data[data["context"] == context]
    concurrencies = sorted({int(c) for c in at_context["concurrency"].dropna()})
    concurrency = min(concurrencies, key=lambda c: (abs(math.log(c / regime.concurrency)), c))
    note = None
    if (context, concurrency) != (regime.context, regime.concurrency):
        note = (f"configured cell context {regime.context}, C={regime.concurrency} is not in the data; "
                f"used the nearest available, context {context}, C={concurrency}")
    table = data[(data["context"] == context) & (data["concurrency"] == concurrency)]
    table = table.sort_values("median", ascending=regime.lower_is_better).reset_index(drop=True)
    return ResolvedRegime(regime, context, concurrency, note, table)


def ratio_vs(value: float, reference: float, lower_is_better: bool) -> float | None:
    """Speed-up of `value` over `reference` (> 1 means better), or None when undefined."""
    if reference is None or value is None or reference <= 0 or value <= 0:
        return None
    return reference / value if lower_is_better else value / reference


def ar_point_id(results: ResultSet) -> str | None:
    """Return the id of the completed autoregressive baseline, preferring the id 'ar'."""
    candidates = [p for p in results.ok_points() if p.kind == "ar"]
    preferred = [p for p in candidates if p.point_id == "ar"]
    chosen = preferred or candidates
    return chosen[0].point_id if chosen else None


@dataclass
class LosslessResult:
    """Exact-match comparison of every point's coding outputs against the `ar` baseline's."""

    available: bool
    reason: str | None
    by_point: dict[str, dict[str, Any]]


def lossless_vs_ar(results: ResultSet) -> LosslessResult:
    """Compare each point's coding outputs with the ar baseline via ddsweep.coding.lossless.compare_outputs."""
    try:
        from ddsweep.coding.lossless import compare_outputs
    except ImportError as exc:
        return LosslessResult(False, f"ddsweep.coding.lossless is not importable ({exc})", {})
    ar_id = ar_point_id(results)
    if ar_id is None or ar_id not in results.coding_records:
        return LosslessResult(False, "no completed `ar` point with coding outputs to compare against", {})
    def usable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if isinstance(r.get("task_id"), str)]

    reference = usable(results.coding_records[ar_id])
    by_point = {pid: compare_outputs(reference, usable(records))
                for pid, records in results.coding_records.items() if pid != ar_id}
    return LosslessResult(True, None, by_point)


def coding_stats(results: ResultSet) -> pd.DataFrame:
    """Per point: problems, passed, pass rate, truncation failures and real failures, counted separately.

    Problems whose request failed are left out: they say nothing about the model's answers."""
    rows = []
    for point_id, all_records in results.coding_records.items():
        records = [r for r in all_records if r.get("error_kind") != "request"]
        failed = [r for r in records if not r.get("passed")]
        truncated = [r for r in failed if is_truncated(r)]
        retried_pass = sum(1 for r in truncated if isinstance(r.get("retry"), dict) and r["retry"].get("passed"))
        kinds: dict[str, int] = {}
        for r in failed:
            if not is_truncated(r):
                kind = str(r.get("error_kind") or "unknown")
                kinds[kind] = kinds.get(kind, 0) + 1
        rows.append({
            "point_id": point_id, "problems": len(records), "passed": len(records) - len(failed),
            "pass_rate": (len(records) - len(failed)) / len(records) if records else math.nan,
            "truncated_failures": len(truncated), "real_failures": len(failed) - len(truncated),
            "passed_after_retry": retried_pass,
            "real_failure_kinds": ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())),
        })
    columns = ["point_id", "problems", "passed", "pass_rate", "truncated_failures", "real_failures",
               "passed_after_retry", "real_failure_kinds"]
    return pd.DataFrame(rows, columns=columns)


def overview_table(results: ResultSet, regimes: list[ResolvedRegime], lossless: LosslessResult) -> pd.DataFrame:
    """One row per point: regime figures with CIs, speed-up over `ar` at the same cell, coding figures."""
    ar_id = ar_point_id(results)
    coding = coding_stats(results).set_index("point_id")
    rows = []
    for p in results.points:
        row: dict[str, Any] = {"point_id": p.point_id, "kind": p.kind, **p.knobs(), "status": p.status}
        for resolved in regimes:
            name = resolved.regime.name
            fig = resolved.figure(p.point_id)
            ref = resolved.figure(ar_id) if ar_id else None
            row[f"{name}_{resolved.regime.metric}"] = fig["median"] if fig else math.nan
            row[f"{name}_ci_low"] = fig["ci_low"] if fig else math.nan
            row[f"{name}_ci_high"] = fig["ci_high"] if fig else math.nan
            speedup = ratio_vs(fig["median"], ref["median"], resolved.regime.lower_is_better) if (
                fig and ref) else None
            row[f"{name}_speedup_vs_ar"] = math.nan if speedup is None else speedup
        has_coding = p.point_id in coding.index
        row["pass_rate"] = coding.at[p.point_id, "pass_rate"] if has_coding else math.nan
        row["truncated_failures"] = coding.at[p.point_id, "truncated_failures"] if has_coding else math.nan
        match = lossless.by_point.get(p.point_id)
        row["exact_match_rate_vs_ar"] = match.get("exact_match_rate") if match else (
            1.0 if p.point_id == ar_id and has_coding and lossless.available else math.nan)
        row["simulated"] = p.simulated
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    for knob in KNOBS:
        frame[knob] = pd.array(frame[knob].tolist(), dtype="Int64")
    return frame


def write_tables(results: ResultSet, tables_dir: str | Path, overview: pd.DataFrame) -> dict[str, Path]:
    """Write points, bench_cells, bench_groups, coding and overview CSVs atomically; return their paths."""
    from ddsweep.storage import write_text_atomic

    tables_dir = Path(tables_dir)
    frames = {
        "points": results.points_frame(), "bench_cells": results.cells, "bench_groups": results.groups,
        "coding": results.coding, "overview": overview, "failures": results.failures_frame(),
        "jobs": results.jobs_frame(),
    }
    paths = {}
    for name, frame in frames.items():
        if frame.empty and not len(frame.columns):
            frame = pd.DataFrame(columns=["point_id", "simulated"])
        if "simulated" not in frame.columns:
            frame = frame.assign(simulated=results.simulated)
        paths[name] = write_text_atomic(tables_dir / f"{name}.csv", frame.to_csv(index=False))
    return paths
