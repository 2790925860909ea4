"""Failed points grouped by their cause: the points that failed the same way are one line, the cause quoted once.

A cause is an error kind and the failure's one-line reason with what differs between two servers of one set-up
left out (the port, the server's URL). A point that was not started because its build's canary failed at start-up
(ddsweep.point.canary) joins the canary's cause; the points the time budget did not let start are one group of
points not started. The overview says whether the study lost so much that its summary must open with it: nothing
measured, or more than half of its points lost. No pandas here: `ddsweep status` uses it too."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ddsweep.analysis.text import first_line

if TYPE_CHECKING:
    from ddsweep.analysis.results import PointRecord

NOT_STARTED = "not_started"
# A job the invocation's time budget did not let start (ddsweep.budget.KIND): not started, not failed. Its refusal
# names the estimate and the seconds left, which differ from job to job; the group's cause leaves them out.
TIME_BUDGET = "time_budget"
BUDGET_FIGURES = re.compile(r"its estimate \(.*?\) does not fit the \d+ s left of ")
INFRASTRUCTURE = "infrastructure"
CONFIGURATION = "configuration"
# What differs between two servers that failed the same way.
PORT = re.compile(r" \(port \d+\)")
URL = re.compile(r"https?://[^\s/,;)]+")
# What to do next, by whose failure it was.
NEXT = {
    INFRASTRUCTURE: "Failures on the machine or in its software: fix the cause (each failed point's failure.json and "
                    "server.log under results/ name it) and run the same command again; those points and the "
                    "points not started run again, no other point does.",
    CONFIGURATION: "Failures of a configuration are results and are not run again: change the preset or the points "
                   "(config/README.md) to measure them.",
    None: "Points without a readable record run again when the same command runs again.",
}


@dataclass(frozen=True)
class Failure:
    """One point that did not complete: its error kind and message, whose failure it was, and for a point that
    was not started, its build's canary (`point_id`, `family`, `error_kind`, `error`)."""

    point_id: str
    error_kind: str | None
    error: str | None
    failure_class: str | None = None
    canary: dict[str, Any] | None = None


@dataclass
class FailureGroup:
    """Points that failed with one cause: those that failed, those not started because of it, and the builds
    whose canary it was."""

    error_kind: str | None
    cause: str
    failure_class: str | None
    failed: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)
    canaries: dict[str, str] = field(default_factory=dict)  # a failed point that was its build's canary -> build

    @property
    def size(self) -> int:
        """Points the cause cost."""
        return len(self.failed) + len(self.not_started)


def cause_text(error: str | None) -> str:
    """A failure's one-line reason without its port and server URL, so that two servers of one set-up that failed
    the same way have one cause."""
    line = first_line(error) or "no error message"
    return URL.sub("the server", PORT.sub("", line))


def group_failures(failures: Iterable[Failure]) -> list[FailureGroup]:
    """The failures grouped by (error kind, cause), a not-started point under its canary's; the largest first,
    then in the order they came."""
    groups: dict[tuple[str | None, str], FailureGroup] = {}
    for f in failures:
        if f.error_kind == NOT_STARTED and f.canary:
            key = (f.canary.get("error_kind"), cause_text(f.canary.get("error")))
            group = groups.setdefault(key, FailureGroup(key[0], key[1], INFRASTRUCTURE))
            group.not_started.append(f.point_id)
            group.canaries[str(f.canary.get("point_id"))] = str(f.canary.get("family"))
            continue
        if f.error_kind == TIME_BUDGET:
            key = (f.error_kind, BUDGET_FIGURES.sub("its estimate did not fit the time left of ", cause_text(f.error)))
            groups.setdefault(key, FailureGroup(key[0], key[1], f.failure_class)).not_started.append(f.point_id)
            continue
        key = (f.error_kind, cause_text(f.error))
        group = groups.setdefault(key, FailureGroup(key[0], key[1], f.failure_class))
        group.failed.append(f.point_id)
        group.failure_class = group.failure_class or f.failure_class
    order = list(groups)
    return sorted(groups.values(), key=lambda g: (-g.size, order.index((g.error_kind, g.cause))))


def failure_of(point: PointRecord) -> Failure:
    """A point record that did not complete, as a Failure."""
    outcome = point.outcome or {}
    return Failure(point.point_id, point.error_kind or point.status, point.error, outcome.get("failure_class"),
                   outcome.get("canary") if isinstance(outcome.get("canary"), dict) else None)


def _names(ids: list[str]) -> str:
    """`a`, `b`, `c`."""
    return ", ".join(f"`{p}`" for p in ids)


def group_text(group: FailureGroup) -> str:
    """One line for a group: the cause quoted once, then its points, e.g. `startup_exit`, the machine's: "the
    server exited …" — 2 failed: `ar`, `bs8-…` (the canary of build …); 5 not started because of it: …"""
    whose = {INFRASTRUCTURE: ", the machine's", CONFIGURATION: ", the configuration's"}.get(group.failure_class, "")
    points = []
    if group.failed:
        names = ", ".join(f"`{p}`" + (f" (the canary of build {group.canaries[p]})" if p in group.canaries else "")
                          for p in group.failed)
        points.append(f"{len(group.failed)} failed: {names}")
    if group.not_started:
        why = "within this invocation's time budget" if group.error_kind == TIME_BUDGET else "because of it"
        points.append(f"{len(group.not_started)} not started {why}: {_names(group.not_started)}")
    return f"`{group.error_kind or 'unknown'}`{whose}: \"{group.cause}\" — " + "; ".join(points)


def overview(total: int, measured: int, failures: list[Failure]) -> dict[str, Any]:
    """The failures of a study of `total` points, `measured` of them with figures, as JSON: counts, the groups
    by cause, what to do next, and `alarm` when nothing was measured or more than half of the points were lost."""
    groups = group_failures(failures)
    not_started = sum(len(g.not_started) for g in groups)
    lost = total - measured
    alarm = total > 0 and (measured == 0 or lost * 2 > total)
    headline = (f"{measured} of {total} points measured; {lost} lost: {lost - not_started} failed, "
                f"{not_started} not started.")
    classes = list(dict.fromkeys(g.failure_class if g.failure_class in NEXT else None for g in groups))
    return {"total": total, "measured": measured, "lost": lost, "not_started": not_started, "alarm": alarm,
            "headline": headline, "groups": [{**asdict(g), "text": group_text(g)} for g in groups],
            "next": [NEXT[c] for c in classes]}
