"""Where a running study stands (`ddsweep status`), from results/ and the scheduler's queue: each point's state,
GPU hours spent against the plan's estimate, the ETA, and the failures grouped by cause. Rendered by
ddsweep.report.status."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddsweep.analysis.causes import NOT_STARTED, TIME_BUDGET, Failure, group_failures, group_text
from ddsweep.analysis.text import first_line
from ddsweep.config.plan import estimate_minutes, running_points

# States in which a point has its outcome of this invocation.
FINISHED = ("done", "failed", NOT_STARTED)

@dataclass
class PointState:
    """One row of the status table."""

    point_id: str
    state: str = "waiting"
    job_id: str | None = None
    node: str | None = None
    elapsed_s: float | None = None
    detail: str = ""
    duration_s: float | None = None
    failure: Failure | None = None  # a failed or not-started point's failure, for the grouping by cause


def _read(path: Path) -> dict[str, Any] | None:
    """A JSON object from disk, or None when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _headline(directory: Path, regime: dict[str, Any] | None) -> str:
    """The median over repeats of the first analysis regime's metric at its cell, from bench/cells.json."""
    cells = _read(directory / "bench" / "cells.json")
    if not regime or not cells:
        return "completed"
    for group in cells.get("groups", []):
        if group.get("context") == regime["context"] and group.get("concurrency") == regime["concurrency"]:
            value = group.get(regime["metric"])
            value = value.get("median") if isinstance(value, dict) else None
            if isinstance(value, (int, float)):
                return f"{regime['metric']} {value:.4g} ({regime['name']}, context {regime['context']}, " \
                       f"concurrency {regime['concurrency']})"
    return "completed"


def point_state(directory: Path, job: dict[str, Any] | None, regime: dict[str, Any] | None) -> PointState:
    """The state of one point from its files and its squeue entry (the queue wins: a rerun may be under way)."""
    state = PointState(directory.name)
    done = _read(directory / "done.json")
    outcome = _read(directory / "status.json") or _read(directory / "failure.json")
    if outcome and isinstance(outcome.get("duration_s"), (int, float)):
        state.duration_s = float(outcome["duration_s"])
    if job:
        state.state, state.job_id, state.node, state.elapsed_s = job["state"], job["job_id"], job["node"], \
            job["elapsed_s"]
    elif done and done.get("status") == "ok":
        state.state, state.detail = "done", _headline(directory, regime)
    elif done and done.get("error_kind") in (NOT_STARTED, TIME_BUDGET):
        state.state, state.detail = NOT_STARTED, str(done.get("reason"))
    elif done:
        state.state, state.detail = "failed", f"{done.get('error_kind')}: {done.get('reason')}"
        if done.get("persisted"):
            state.detail += (f" (failed-infrastructure on all {done.get('attempts')} attempt(s); rerun by the next "
                             "invocation)")
    elif outcome and outcome.get("status") == "failed":
        kind = outcome.get("error_kind")
        state.state = "interrupted" if kind == "interrupted" else "failed"
        reason = first_line(outcome.get("error")) or ""
        label = "failed-infrastructure: " if outcome.get("failure_class") == "infrastructure" else ""
        rerun = "" if kind == "interrupted" else f" ({label}rerun by the next invocation)"
        state.detail = f"{kind}: {reason}{rerun}"
    if not job and outcome:
        state.job_id = outcome.get("slurm_job_id")
        state.node = outcome.get("slurm_nodelist") or outcome.get("host")
    if state.state in ("failed", NOT_STARTED) and outcome:
        canary = outcome.get("canary")
        state.failure = Failure(state.point_id, outcome.get("error_kind"), outcome.get("error"),
                                outcome.get("failure_class"), canary if isinstance(canary, dict) else None)
    return state


def point_directory(results_dir: Path, point_id: str, adaptive: bool) -> Path:
    """A point's directory: its record under points/, or in an adaptive study before it has one, its screening (a
    baseline's one launch, which stands for its screening)."""
    merged = results_dir / "points" / point_id
    if not adaptive or merged.exists():
        return merged
    for early in (results_dir / "screen" / point_id, results_dir / "confirm" / point_id / "launch-0"):
        if early.exists():
            return early
    return merged


def spent_seconds(directory: Path) -> float:
    """Wall time of every finished attempt of a point (the current one and those under attempts/)."""
    total = 0.0
    for path in [directory, *sorted((directory / "attempts").glob("*"))]:
        outcome = _read(path / "status.json") or _read(path / "failure.json")
        if outcome and isinstance(outcome.get("duration_s"), (int, float)):
            total += float(outcome["duration_s"])
    return total


def study_status(config: dict[str, Any], results_dir: Path, jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every point's state, GPU hours spent and planned, and the ETA."""
    ids = [p.point_id for p in running_points(config)]
    regimes = config.get("analysis", {}).get("regimes") or [None]
    adaptive = config.get("sweep", {}).get("strategy") == "adaptive"
    directories = {pid: point_directory(results_dir, pid, adaptive) for pid in ids}
    rows = [point_state(directories[pid], jobs.get(pid), regimes[0]) for pid in ids]
    resources = config.get("resources", {})
    gpus_per_point = resources.get("gpus", 8) * resources.get("nodes", 1)
    seconds = sum(spent_seconds(directories[r.point_id]) for r in rows)
    seconds += sum(r.elapsed_s or 0 for r in rows if r.state == "running")
    durations = [r.duration_s for r in rows if r.state in ("done", "failed") and r.duration_s is not None]
    remaining = [r for r in rows if r.state not in FINISHED]
    running = sum(r.state == "running" for r in rows)
    eta_s = None
    if durations and remaining:
        mean = sum(durations) / len(durations)
        left = sum(max(mean - (r.elapsed_s or 0), 0) if r.state == "running" else mean for r in remaining)
        eta_s = left / max(running, 1)
    elif not remaining:
        eta_s = 0.0
    counts = {s: sum(r.state == s for r in rows) for s in
              ("waiting", "pending", "running", "done", "failed", NOT_STARTED, "interrupted")}
    groups = group_failures(r.failure for r in rows if r.failure)
    return {"points": rows, "counts": counts, "gpu_hours_spent": seconds * gpus_per_point / 3600,
            "gpu_hours_planned": estimate_minutes(config, len(ids))["gpu_hours"], "eta_s": eta_s,
            "simulated": bool(config.get("simulated")), "failure_groups": [group_text(g) for g in groups],
            "finished": not remaining, "lost": counts["failed"] + counts[NOT_STARTED],
            "not_started_by_budget": sum(1 for r in rows if r.state == NOT_STARTED and r.failure
                                         and r.failure.error_kind == TIME_BUDGET)}
