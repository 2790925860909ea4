"""`ddsweep status` written for people: the table of every point's state and its footer (failures by cause, GPU
hours, ETA), and the study's outcome in one line, from the status ddsweep.findings.progress computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
    if status["failure_groups"]:
        lines += ["", "Failures by cause:", *(f"- {text}" for text in status["failure_groups"])]
    lines += ["", f"{len(status['points'])} points: {counts}{label}",
              f"GPU hours spent {status['gpu_hours_spent']:.2f} of {status['gpu_hours_planned']:.2f} planned "
              "(ddsweep plan)", f"ETA {eta} (mean measured point duration x points left / points running)"]
    return "\n".join(lines)


def outcome_line(status: dict[str, Any], summary: Path) -> str:
    """The study's outcome in one line, e.g. `5 of 7 points measured; 2 failed, 1 of them not started (run again by
    the next invocation) — see reports/optimization_summary.md`."""
    counts, total = status["counts"], len(status["points"])
    budget = status["not_started_by_budget"]
    lost, not_started = status["lost"] - budget, counts["not_started"] - budget
    line = f"{counts['done']} of {total} points measured"
    if lost:
        line += f"; {lost} failed" + (f", {not_started} of them not started (their build's canary failed at "
                                      "start-up; run again by the next invocation)" if not_started else "")
    if budget:
        line += f"; {budget} not started within this invocation's time budget (run by the next invocation)"
    others = total - counts["done"] - lost - budget
    if others:
        line += f"; {others} without an outcome"
    return line + (f" — see {summary}" if summary.exists() else "")
