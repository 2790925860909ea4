"""Resolve a tie the way an operator would: of points the data cannot separate from the leader, recommend the
cheapest that no other member of the tied set beats with confidence.

A tied set is tested against its leader only, so two members can still differ clearly from each other; the
recommendation skips a member that another member beats. Cost is the target's verify width (slots verified per
step: the preset's `tree.verify_width` in plan.json, budget + 1 under DDTree; 1 for plain decoding), then the
drafter's block size, then the point id, so the choice is reproducible. The other members are reported as
equivalent to the leader, not as losers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ddsweep.analysis.results import ResultSet

RULE = ("the cheapest of the tied set that no other member beats with confidence: smallest verify width, then "
        "smallest block size")


@dataclass(frozen=True)
class Cost:
    """What one verify step of a point costs the target: verify width and drafter block size."""

    verify_width: int
    block_size: int
    source: str  # plan.json, or the knobs when the plan does not say

    def text(self) -> str:
        """'verify width 9, block size 8'."""
        return f"verify width {self.verify_width}, block size {self.block_size}"


def point_cost(results: ResultSet, point_id: str) -> Cost:
    """The point's verify width from its plan.json tree, else budget + 1 (a tree or chain of `budget` draft
    tokens), else the block size (a DFlash chain), else 1 (no speculation)."""
    entry = results.plan.get(point_id) or {}
    tree = entry.get("tree") if isinstance(entry.get("tree"), dict) else {}
    record = results.point(point_id)
    budget = record.budget if record else None
    block = record.block_size if record else None
    width = tree.get("verify_width")
    if isinstance(width, int) and width > 0:
        return Cost(width, block or 0, "plan.json")
    if budget is not None:
        return Cost(budget + 1, block or 0, "knobs")
    return Cost(block or 1, block or 0, "knobs")


def cheapest(results: ResultSet, point_ids: list[str]) -> str | None:
    """The member of `point_ids` an operator would deploy when they are equivalent: smallest verify width,
    then smallest block size, then the first id in sort order."""
    if not point_ids:
        return None
    return min(point_ids, key=lambda pid: (point_cost(results, pid).verify_width,
                                           point_cost(results, pid).block_size, pid))


def cheapest_unbeaten(results: ResultSet, point_ids: list[str], beats: Callable[[str, str], bool]) -> str | None:
    """The cheapest member of `point_ids` (as `cheapest` orders them) that no other member beats, where
    `beats(a, b)` says a is better than b with confidence; the cheapest when every member is beaten."""
    if not point_ids:
        return None
    ranked = sorted(point_ids, key=lambda pid: (point_cost(results, pid).verify_width,
                                                point_cost(results, pid).block_size, pid))
    for pid in ranked:
        if not any(beats(other, pid) for other in ranked if other != pid):
            return pid
    return ranked[0]
