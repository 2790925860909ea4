"""Load a results directory into tidy pandas tables, tolerating missing or malformed files.

Every point directory under ``results/points/`` becomes one :class:`PointRecord`; its benchmark cells, groups
and coding problems become rows of the tidy tables described in ``docs/results-schema.md``. A file that is
missing or unreadable never raises: the point is recorded with the reason so the summary can list it.

Longer than the ~500-line guide because every point file a crashed or interrupted job can leave half-written
is read defensively here, in one place; the tables, statistics and decisions built on it live in sibling modules.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ddsweep.analysis.admission import admission_limits
from ddsweep.analysis.interruptions import interrupted_attempts
from ddsweep.analysis.launch_model import (
    point_estimates,
    read_launch_map,
)
from ddsweep.analysis.raw import figures_from_cells_document, figures_from_requests, gpu_figures, warmups_settled
from ddsweep.analysis.text import first_line
from ddsweep.config.knobs import KNOBS
from ddsweep.figures import METRICS

GROUP_METRICS: tuple[str, ...] = (
    "output_throughput_tok_s",
    "decode_tok_s",
    "acceptance_length",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "requests_per_s",
)
# The per-repeat cell column of each metric (the decode figure of a repeat is its median request).
METRIC_COLUMNS: dict[str, str] = {m: ("decode_tok_s_median" if m == "decode_tok_s" else m) for m in GROUP_METRICS}
METRIC_LABELS: dict[str, str] = {**{name: m.label for name, m in METRICS.items()},
                                 "requests_per_s": "completed requests per second"}
# The effective draft tree (from results/plan.json) beside the requested knobs, and the alias group.
TREE_COLUMNS: tuple[str, ...] = ("tree_shape", "tree_width", "tree_depth_limit", "tree_nodes", "alias_group",
                                 "alias_of", "twin_group")
POINT_COLUMNS: tuple[str, ...] = (
    "point_id", "kind", "preset", *KNOBS, *TREE_COLUMNS, "status", "error_kind", "missing_cells", "simulated",
    "gpu_name", "gpu_count", "interconnect", "engine_version", "git_commit", "hostname", "max_running_requests",
    "max_total_num_tokens",
)
CELL_COLUMNS: tuple[str, ...] = (
    "point_id", "kind", *KNOBS, "workload", "context", "concurrency", "repeat", "completed", "failed", "wall_s",
    "output_throughput_tok_s", "throughput_window", "whole_output_throughput_tok_s", "requests_per_s",
    "decode_tok_s_median", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
    "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "chunk_gap_p50_s", "token_gap_p50_s", "e2e_p50_s", "e2e_p99_s",
    "acceptance_length", "cached_share", "distinct_prompts", "source", "simulated", "launch",
    "subwindow_spread", "stable", "warmup_settled", "stalls", "worst_stall_s", "saturated",
    "energy_j_per_output_token", "gpu_power_w_mean", "gpu_utilization_pct_mean",
)
GROUP_COLUMNS: tuple[str, ...] = (
    "point_id", "kind", *KNOBS, "context", "concurrency", "metric", "mean", "ci_low", "ci_high", "repeats",
    "confidence", "simulated",
)
REQUEST_COLUMNS: tuple[str, ...] = (
    "point_id", "workload", "ignore_eos", "context", "concurrency", "repeat", "ok", "completion_tokens",
    "spec_verify_ct", "prompt_tokens", "cached_tokens", "start_ts", "end_ts", "ttft_s", "tpot_s", "e2e_s",
)
FAILURE_COLUMNS: tuple[str, ...] = (
    "point_id", "kind", "preset", *KNOBS, "status", "error_kind", "failure_class", "reason", "step", "duration_s",
    "host",
    "slurm_job_id", "simulated",
)
JOB_COLUMNS: tuple[str, ...] = (
    "point_id", "status", "host", "slurm_job_id", "slurm_nodelist", "slurm_partition", "gpu_name", "started_utc",
    "duration_s", "simulated",
)
CODING_COLUMNS: tuple[str, ...] = (
    "point_id", "task_id", "passed", "error_kind", "finish_reason", "truncated", "completion_tokens",
    "isolation", "simulated",
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
    workloads: list[dict[str, Any]] = field(default_factory=list)  # cells.json `workloads` (stopping rules)
    unverified: list[dict[str, Any]] = field(default_factory=list)  # verification.json `unverified` knobs
    off_target_cells: list[dict[str, Any]] = field(default_factory=list)  # cells whose prompts missed the context
    failed_cells: list[dict[str, Any]] = field(default_factory=list)  # a partial point's failed cells (not used)
    infeasible_cells: list[dict[str, Any]] = field(default_factory=list)  # cells no prompt could be sized to
    # attempts of its jobs that never finished (a lost machine, a signal, a time limit): done.json
    # `interrupted_attempts` of the point and of its launches
    interruptions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def shown_status(self) -> str:
        """The status tables and the summary show: `partial` for a completed point with failed or infeasible cells."""
        return "partial" if self.status == "ok" and (self.failed_cells or self.infeasible_cells) else self.status
    cache_cells: list[dict[str, Any]] = field(default_factory=list)  # cells with repeated or over-cached prompts
    limits: dict[str, int | None] = field(default_factory=dict)  # admission limits from server_info.json

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
    plan: dict[str, dict[str, Any]] = field(default_factory=dict)  # point id -> its entry in plan.json
    requests: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(REQUEST_COLUMNS)))
    confidence: float = 0.95
    ignored: list[str] = field(default_factory=list)  # point directories found but not of this study

    def aliases(self) -> list[dict[str, Any]]:
        """Plan entries of points that did not run because another point is the same server configuration."""
        return [entry for entry in self.plan.values() if entry.get("alias_of") and not entry.get("runs")]

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
                "point_id": p.point_id, "kind": p.kind, "preset": p.preset, **p.knobs(),
                **_tree_columns(self.plan.get(p.point_id)), "status": p.shown_status,
                "error_kind": p.error_kind, "missing_cells": failed_cells_text(p), "simulated": p.simulated,
                "gpu_name": gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None,
                "gpu_count": p.environment.get("gpu_count"),
                "interconnect": p.environment.get("interconnect"),
                "engine_version": engine.get("version"),
                "git_commit": p.environment.get("git_commit"),
                "hostname": p.environment.get("hostname"), **p.limits,
            })
        for entry in self.aliases():
            rows.append({"point_id": entry["point_id"], "kind": entry.get("kind"), "preset": entry.get("preset"),
                         **{k: (entry.get("knobs") or {}).get(k) for k in KNOBS}, **_tree_columns(entry),
                         "status": "alias", "simulated": self.simulated})
        return _frame(rows, POINT_COLUMNS)

    def failures_frame(self) -> pd.DataFrame:
        """Return one row per point that did not complete: its kind, knobs, error kind and a one-line reason."""
        rows = [{"point_id": p.point_id, "kind": p.kind, "preset": p.preset, **p.knobs(), "status": p.shown_status,
                 "error_kind": p.error_kind or ("failed_cells" if p.failed_cells else
                                                "infeasible_cells" if p.infeasible_cells else None),
                 "failure_class": p.outcome.get("failure_class"), "reason": first_line(p.error) or failed_cells_text(p),
                 "step": next((k for k, v in p.outcome.get("steps", {}).items() if v == "started"), None)
                 if isinstance(p.outcome.get("steps"), dict) else None,
                 "duration_s": p.outcome.get("duration_s"), "host": p.outcome.get("host"),
                 "slurm_job_id": p.outcome.get("slurm_job_id"), "simulated": p.simulated}
                for p in self.points if p.shown_status != "ok"]
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


def failed_cells_text(point: PointRecord) -> str | None:
    """The cells a partial point lacks in one line, e.g. `coding ctx=128 C=32 repeat 0 (9 of 32 requests failed);
    chat ctx=64 (not measurable: no prompt can be sized ...)`."""
    if not point.failed_cells and not point.infeasible_cells:
        return None
    return "; ".join([*(f"{c.get('workload')} ctx={c.get('context')} C={c.get('concurrency')} repeat "
                        f"{c.get('repeat')} ({c.get('failed')} of {c.get('requests')} requests failed)"
                        for c in point.failed_cells),
                      *(f"{c.get('workload')} ctx={c.get('context')} (not measurable: {c.get('reason')})"
                        for c in point.infeasible_cells)])


def _tree_columns(entry: dict[str, Any] | None) -> dict[str, Any]:
    """The effective-tree and alias-group columns of a plan.json entry (empty without a plan)."""
    tree = entry.get("tree") if entry and isinstance(entry.get("tree"), dict) else {}
    return {"tree_shape": tree.get("shape"), "tree_width": tree.get("width"),
            "tree_depth_limit": tree.get("depth_limit"), "tree_nodes": tree.get("nodes"),
            "alias_group": entry.get("alias_group") if entry else None,
            "alias_of": entry.get("alias_of") if entry else None,
            "twin_group": entry.get("twin_group") if entry else None}


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
    for knob in (*KNOBS, "tree_width", "tree_depth_limit", "tree_nodes"):
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


def read_coding_repeat(results_dir: Path, point_id: str) -> list[dict[str, Any]] | None:
    """The second pass of a point's coding answers (`coding/problems_repeat.jsonl`), None when it has none."""
    path = results_dir / "points" / point_id / "coding" / "problems_repeat.jsonl"
    return _read_jsonl(path, []) if path.is_file() else None


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


def _load_point(directory: Path) -> tuple[PointRecord, dict[str, Any] | None, list[dict], list[dict], dict | None]:
    """Read one point directory into its record, cells document, request records, coding problems and coding
    summary."""
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
        record.infeasible_cells = [c for c in outcome.get("infeasible_cells") or [] if isinstance(c, dict)]
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

    record.interruptions = interrupted_attempts(directory)
    environment = _read_json(directory / "environment.json", issues, required=record.status == "ok")
    if isinstance(environment, dict):
        record.environment = environment
        simulated_flags.append(bool(environment.get("simulated")))

    verification = _read_json(directory / "verification.json", issues, required=False)
    if isinstance(verification, dict) and "ok" in verification:
        record.verification_ok = bool(verification["ok"])
    if isinstance(verification, dict) and isinstance(verification.get("unverified"), list):
        record.unverified = [u for u in verification["unverified"] if isinstance(u, dict)]

    cells = _read_json(directory / "bench" / "cells.json", issues, required=False)
    if cells is not None and not isinstance(cells, dict):
        issues.append("bench/cells.json is not a JSON object")
        cells = None
    if isinstance(cells, dict):
        simulated_flags.append(bool(cells.get("simulated")))
        record.off_target_cells = [c for c in cells.get("cells") or []
                                   if isinstance(c, dict) and c.get("prompt_tokens_off_target")]
        record.failed_cells = [c for c in cells.get("cells") or [] if isinstance(c, dict) and c.get("cell_failed")]
        record.cache_cells = [c for c in cells.get("cells") or [] if isinstance(c, dict)
                              and (c.get("cached_beyond_common_prefix") or c.get("repeated_prompts"))]
    record.limits = admission_limits(_read_json(directory / "server_info.json", issues, required=False))

    requests = _read_jsonl(directory / "bench" / "requests.jsonl", issues)
    measured = any(not r.get("warmup") for r in requests)
    if record.status == "ok" and cells is None and not measured:
        issues.append("bench/cells.json missing" if not (directory / "bench" / "cells.json").exists()
                      else "bench/cells.json unusable and bench/requests.jsonl has no measured request")
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
    elif record.status == "ok" and cells is None and not measured:
        record.status = "malformed"
        record.error = "completed, but " + "; ".join(i for i in issues if "cells.json" in i)
    record.simulated = any(simulated_flags)
    return record, cells, requests, problems, coding_summary


def _cell_rows(record: PointRecord, cells: dict[str, Any] | None, requests: list[dict[str, Any]]
               ) -> tuple[list[dict], list[dict]]:
    """Per-repeat cell rows from the raw request records, else from cells.json's per-repeat cells; and the
    measured request rows (for goodput)."""
    base = {"point_id": record.point_id, "kind": record.kind, **record.knobs(), "simulated": record.simulated}
    cell_rows, request_rows = figures_from_requests(requests)
    if not cell_rows and cells is not None:
        cell_rows = figures_from_cells_document(cells)
        if len(cell_rows) < len(cells.get("cells") or []):
            record.issues.append("bench/cells.json: a cell without a context was skipped")
    record.workloads = cells.get("workloads") if cells and isinstance(cells.get("workloads"), list) else []
    # A failed cell of a partial point enters no figure; its other cells count.
    failed = {(c.get("workload", ""), c.get("context"), c.get("concurrency"), c.get("repeat"))
              for c in record.failed_cells}
    recorded = {_cell_key(c): c for c in (cells or {}).get("cells") or [] if isinstance(c, dict)}
    cell_rows = [{**r, **gpu_figures(recorded.get(_cell_key(r)))} for r in cell_rows if _cell_key(r) not in failed]
    request_rows = [r for r in request_rows if _cell_key(r) not in failed]
    primary = primary_workload(record, cell_rows)
    # The decisions compare points on the primary (first configured) workload; every workload's cells stay
    # in the requests frame for acceptance per workload.
    return ([{**base, **row} for row in cell_rows if row.get("workload", "") == primary],
            [{"point_id": record.point_id, **row} for row in request_rows])


def _cell_key(row: dict[str, Any]) -> tuple:
    """(workload, context, concurrency, repeat) of a cell or request row."""
    return row.get("workload", ""), row.get("context"), row.get("concurrency"), row.get("repeat")


def primary_workload(record: PointRecord, cell_rows: list[dict[str, Any]]) -> str:
    """The point's first configured workload (cells.json `workloads[0]`), else that of its first cell row."""
    named = [w.get("name") for w in record.workloads if isinstance(w, dict) and isinstance(w.get("name"), str)]
    if named:
        return named[0]
    return str(cell_rows[0].get("workload", "")) if cell_rows else ""


def group_table(cells: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Per point, cell and metric: the mean of the per-repeat figures with its interval, from the launches where a
    point ran in two or more, else Student's t over its repeats (`launch_model.point_estimates`)."""
    rows = []
    if cells.empty:
        return _frame(rows, GROUP_COLUMNS)
    for (context, concurrency), at in cells.groupby(["context", "concurrency"], sort=True, dropna=True):
        estimates = {metric: point_estimates(at, column, confidence) for metric, column in METRIC_COLUMNS.items()}
        for point_id, members in at.groupby("point_id", sort=True):
            first = members.iloc[0]
            base = {"point_id": point_id, "kind": first["kind"], **{k: first[k] for k in KNOBS},
                    "context": int(context), "concurrency": int(concurrency), "simulated": bool(first["simulated"])}
            for metric in METRIC_COLUMNS:
                estimate = estimates[metric][str(point_id)]
                if estimate.n:
                    rows.append({**base, "metric": metric, "mean": estimate.value, "ci_low": estimate.low,
                                 "ci_high": estimate.high, "repeats": estimate.n, "confidence": confidence})
    rows.sort(key=lambda row: (row["point_id"], row["context"], row["concurrency"]))  # by point, then cell
    return _frame(rows, GROUP_COLUMNS)


def _coding_rows(record: PointRecord, problems: list[dict[str, Any]], summary: dict | None) -> list[dict[str, Any]]:
    """Turn coding problem records into tidy rows, with the sandbox isolation mode from the point's summary."""
    sandbox = (summary or {}).get("sandbox")
    isolation = sandbox.get("isolation") if isinstance(sandbox, dict) else None
    return [{
        "point_id": record.point_id, "task_id": p.get("task_id"), "passed": bool(p.get("passed")),
        "error_kind": p.get("error_kind"), "finish_reason": p.get("finish_reason"),
        "truncated": is_truncated(p), "completion_tokens": _int_or_none(p.get("completion_tokens")),
        "isolation": isolation, "simulated": record.simulated,
    } for p in problems]


def is_truncated(problem: dict[str, Any]) -> bool:
    """True when a coding answer hit the token limit (flag, error kind or finish reason say so)."""
    return bool(problem.get("truncated")) or problem.get("error_kind") == "truncated" or (
        problem.get("finish_reason") == "length")


def load_results(results_dir: str | Path, point_ids: list[str] | None = None,
                 confidence: float = 0.95) -> ResultSet:
    """Read the points under RESULTS_DIR/points (all, or only `point_ids`) into a ResultSet; never raises on a
    bad point. Directories of points no longer in the study are left out, so an old run cannot leak in.
    Intervals of the groups table are at `confidence`."""
    results_dir = Path(results_dir)
    points_dir = results_dir / "points"
    directories = sorted(d for d in points_dir.iterdir() if d.is_dir()) if points_dir.is_dir() else []
    ignored = [d.name for d in directories if point_ids is not None and d.name not in set(point_ids)]
    if point_ids is not None:
        directories = [d for d in directories if d.name in set(point_ids)]
    plan_issues: list[str] = []
    plan = _read_json(results_dir / "plan.json", plan_issues, required=False)
    plan_points = plan.get("points") if isinstance(plan, dict) and isinstance(plan.get("points"), list) else []
    results = load_directories(results_dir, directories, confidence)
    results.plan = {e["point_id"]: e for e in plan_points
                    if isinstance(e, dict) and isinstance(e.get("point_id"), str)}
    results.ignored = ignored
    return results


def load_directories(results_dir: str | Path, directories: list[Path], confidence: float = 0.95,
                     names: list[str] | None = None) -> ResultSet:
    """Read run directories (each laid out as a point's) into a ResultSet without a plan; `names`, one per
    directory, replace the ids in their point.json (runs of one configuration, such as reference runs)."""
    points: list[PointRecord] = []
    cell_rows: list[dict] = []
    request_rows: list[dict] = []
    coding_rows: list[dict] = []
    coding_records: dict[str, list[dict]] = {}
    coding_summaries: dict[str, dict] = {}
    for index, directory in enumerate(directories):
        record, cells, requests, problems, coding_summary = _load_point(Path(directory))
        if names is not None:
            record.point_id = names[index]
        points.append(record)
        cells_part, requests_part = _cell_rows(record, cells, requests)
        launch_of = read_launch_map(Path(directory))  # the server launch of each repeat, when merged from several
        settled = warmups_settled(cells)
        cell_rows.extend({**row, "launch": launch_of.get(row["repeat"]),
                          "warmup_settled": settled.get((row.get("workload", ""), row["context"], row["concurrency"],
                                                         launch_of.get(row["repeat"])))} for row in cells_part)
        request_rows.extend(requests_part)
        if problems:
            coding_records[record.point_id] = problems
            coding_rows.extend(_coding_rows(record, problems, coding_summary))
        if coding_summary is not None:
            coding_summaries[record.point_id] = coding_summary
    cells_frame = _frame(cell_rows, CELL_COLUMNS)
    return ResultSet(
        results_dir=Path(results_dir), points=points, cells=cells_frame,
        groups=group_table(cells_frame, confidence), coding=_frame(coding_rows, CODING_COLUMNS),
        coding_records=coding_records, coding_summaries=coding_summaries,
        requests=pd.DataFrame(request_rows, columns=list(REQUEST_COLUMNS)), confidence=confidence,
    )


def ar_point_id(results: ResultSet) -> str | None:
    """Return the id of the completed autoregressive baseline, preferring the id 'ar'."""
    candidates = [p for p in results.ok_points() if p.kind == "ar"]
    preferred = [p for p in candidates if p.point_id == "ar"]
    chosen = preferred or candidates
    return chosen[0].point_id if chosen else None
