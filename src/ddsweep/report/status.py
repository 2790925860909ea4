"""`ddsweep status [--watch]`: where a running study stands, from results/ and squeue.

Each point is `waiting` (not submitted yet), `pending` or `running` (Slurm job id, node, elapsed time), `done`
(headline figure: the first analysis regime's median), `failed` (error kind and one-line reason; a result of the
study, or the machine's failure on every attempt of this invocation, which the next one reruns), `not_started`
(its build's canary failed at start-up on the machine; the next invocation runs it) or `interrupted` (stopped from
outside; the next run resubmits it). An adaptive study's point that has no confirmed record yet is shown from its
screening. Below the table: the failures grouped by cause, GPU hours spent against `ddsweep plan`'s estimate, and
an ETA from the measured point durations. `--expect-measured N` exits 1 when fewer than N points were measured."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddsweep.analysis.causes import NOT_STARTED, Failure, group_failures, group_text
from ddsweep.analysis.text import first_line
from ddsweep.config.plan import estimate_minutes, running_points
from ddsweep.config.study import ConfigError, load_config
from ddsweep.slurm import parse_slurm_duration

SQUEUE_FORMAT = "%i|%T|%M|%N|%k"
COMMENT_PREFIX = "rule_run_point_wildcards_"
# States in which a point has its outcome of this invocation.
FINISHED = ("done", "failed", NOT_STARTED)
SQUEUE_STATES = {"PENDING": "pending", "CONFIGURING": "pending", "RUNNING": "running", "COMPLETING": "running",
                 "REQUEUED": "pending", "SUSPENDED": "pending"}


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


def squeue_jobs() -> dict[str, dict[str, Any]]:
    """Point id -> {job_id, state, elapsed_s, node} of this user's run_point jobs in squeue ({} without Slurm)."""
    if shutil.which("squeue") is None:
        return {}
    try:
        done = subprocess.run(["squeue", "--me", "-h", "-o", SQUEUE_FORMAT], capture_output=True, text=True,
                              timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return {}
    jobs = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[4].startswith(COMMENT_PREFIX):
            continue
        job_id, state, elapsed, node, comment = parts
        jobs[comment[len(COMMENT_PREFIX):]] = {"job_id": job_id, "state": SQUEUE_STATES.get(state, state.lower()),
                                               "elapsed_s": parse_slurm_duration(elapsed),
                                               "node": node if node and not node.startswith("(") else None}
    return jobs


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
    elif done and done.get("error_kind") == NOT_STARTED:
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
    """A point's directory: its record under points/, or in an adaptive study before it has one, its screening."""
    merged = results_dir / "points" / point_id
    screened = results_dir / "screen" / point_id
    return screened if adaptive and not merged.exists() and screened.exists() else merged


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
    return {"points": rows, "counts": counts, "gpu_hours_spent": seconds * gpus_per_point / 3600,
            "gpu_hours_planned": estimate_minutes(config, len(ids))["gpu_hours"], "eta_s": eta_s,
            "simulated": bool(config.get("simulated"))}


def _clock(seconds: float | None) -> str:
    """Seconds as h:mm:ss, '-' when unknown."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def format_status(status: dict[str, Any]) -> str:
    """The status as a plain-text table and a footer."""
    header = f"{'point':<26} {'state':<12} {'job':>8} {'node':<12} {'elapsed':>8}  detail"
    lines = [header, "-" * len(header)]
    for r in status["points"]:
        lines.append(f"{r.point_id:<26} {r.state:<12} {r.job_id or '-':>8} {r.node or '-':<12} "
                     f"{_clock(r.elapsed_s if r.state == 'running' else r.duration_s):>8}  {r.detail}")
    counts = ", ".join(f"{n} {s}" for s, n in status["counts"].items() if n)
    label = " [SIMULATED: stand-in server]" if status["simulated"] else ""
    eta = "unknown (no point has finished yet)" if status["eta_s"] is None else _clock(status["eta_s"])
    groups = group_failures(r.failure for r in status["points"] if r.failure)
    if groups:
        lines += ["", "Failures by cause:", *(f"- {group_text(g)}" for g in groups)]
    lines += ["", f"{len(status['points'])} points: {counts}{label}",
              f"GPU hours spent {status['gpu_hours_spent']:.2f} of {status['gpu_hours_planned']:.2f} planned "
              "(ddsweep plan)", f"ETA {eta} (mean measured point duration x points left / points running)"]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    """`ddsweep status`: print the table once, or every --watch seconds until every point has finished."""
    try:
        config = load_config(*args.config)
    except ConfigError as exc:
        print(f"ddsweep status: {exc}", file=sys.stderr)
        return 2
    while True:
        status = study_status(config, Path(args.results), squeue_jobs())
        text = format_status(status)
        if args.watch and sys.stdout.isatty():
            text = "\033[H\033[2J" + text
        print(text, flush=True)
        finished = sum(status["counts"][state] for state in FINISHED) == len(status["points"])
        if not args.watch or finished:
            break
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            break
    measured = status["counts"]["done"]
    if measured < args.expect_measured:
        print(f"ddsweep status: {measured} point(s) measured, fewer than the {args.expect_measured} expected "
              "(--expect-measured)", file=sys.stderr)
        return 1
    return 0


def outcome_line(status: dict[str, Any], summary: Path) -> str:
    """The study's outcome in one line, e.g. `5 of 7 points measured; 2 failed, 1 of them not started (run again by
    the next invocation) — see reports/optimization_summary.md`."""
    counts, total = status["counts"], len(status["points"])
    lost = counts["failed"] + counts[NOT_STARTED]
    line = f"{counts['done']} of {total} points measured"
    if lost:
        line += f"; {lost} failed" + (f", {counts[NOT_STARTED]} of them not started (their build's canary failed at "
                                      "start-up; run again by the next invocation)" if counts[NOT_STARTED] else "")
    others = total - counts["done"] - lost
    if others:
        line += f"; {others} without an outcome"
    return line + (f" — see {summary}" if summary.exists() else "")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `status` subcommand."""
    parser = subparsers.add_parser("status", help="the state of every point of a running study, GPU hours, ETA",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", "-c", nargs="+", default=["config/config.yaml"], help="configuration file(s)")
    parser.add_argument("--results", default="results", help="the results directory (default results)")
    parser.add_argument("--watch", type=float, nargs="?", const=30.0, default=None, metavar="SECONDS",
                        help="refresh every SECONDS (default 30) until every point has finished")
    parser.add_argument("--expect-measured", type=int, default=0, metavar="N",
                        help="exit 1 when fewer than N points were measured (default 0: never)")
    parser.set_defaults(func=_run)
