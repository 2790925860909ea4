"""The adaptive study's race: the selection after each confirmation launch, then the settling of the priorities'
picks after the last configured launch. See docs/adaptive.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ddsweep.adaptive.screening import load_launch, priority_scores, regime_scores
from ddsweep.adaptive.selection import Selection, bands, carry_over, select
from ddsweep.adaptive.stages import (
    baseline_ids,
    confirm_launches,
    first_confirm_launch,
    screen_settings,
    settle_launches,
)


def race_round(config: dict, screen_dir: Path, confirm_dir: Path, previous: dict, launch: int) -> Selection:
    """The selection after confirmation launch LAUNCH (0-based) of the points still in the race (`previous`'s
    survivors): each point's screening launch and its confirmation launches up to LAUNCH count as launches (where
    the screening stands for launch 0, a candidate has no launch 0 of its own). A point none of whose launches
    completed stays in (its merged result records the failure); the baselines always stay. From the last
    configured launch on, the round settles the priorities' picks instead (`settle_round`)."""
    if launch >= confirm_launches(config) - 1:
        return settle_round(config, screen_dir, confirm_dir, previous, launch)
    candidates = list(previous["survivors"])
    launches = {pid: _launch_records(screen_dir, confirm_dir, pid, range(launch + 1), screening=True)
                for pid in candidates}
    measured = {pid: runs for pid, runs in launches.items() if runs}
    selection = select(config, measured, where=f"after confirmation launch {launch + 1}: ", race=True)
    selection.survivors = [p for p in candidates if p in selection.survivors or p not in measured]
    selection.race_launches = {p: launch + 1 for p in candidates if p not in selection.survivors}
    selection.screened = []  # the race screens nothing new
    carry_over(previous, selection, {"stage": f"confirm launch {launch + 1}", "entered": len(candidates),
                                      "kept": len(selection.survivors)})
    return selection


def settle_round(config: dict, screen_dir: Path, confirm_dir: Path, previous: dict, launch: int) -> Selection:
    """After confirmation launch LAUNCH (the last configured one or a settling launch): per priority, over the
    confirmed points' launches (as merged: a candidate's screening where it stands for launch 0), the leader and
    the rivals whose band of their difference to it reaches `analysis.equivalence_margin` (they could beat it by
    more than the margin) run one more settling launch, at most `sweep.screen.race_keep` of them per priority,
    until none is unsettled or `sweep.screen.settle_launches` have run. The confirmed points do not change; the
    record lists the next launch's points (`settle`) and the settling launches each point ran (`extra_launches`)."""
    configured, settings = confirm_launches(config), screen_settings(config)
    extra = {pid: list(ks) for pid, ks in previous.get("extra_launches", {}).items()}
    if launch >= configured:
        for pid in previous.get("settle", []):
            extra.setdefault(pid, []).append(launch)
    confirmed, baselines = list(previous["survivors"]), set(baseline_ids(config))
    first = first_confirm_launch(config)
    launches = {pid: _launch_records(screen_dir, confirm_dir, pid, [*range(configured), *extra.get(pid, [])],
                                     screening=bool(first) and pid not in baselines)
                for pid in confirmed}
    measured = {pid: runs for pid, runs in launches.items() if runs}
    margin = float(config.get("analysis", {}).get("equivalence_margin", 0.02))
    keep = settings.get("race_keep")
    unsettled: dict[str, None] = {}
    best = dict(previous.get("best", {}))
    for name, scores in priority_scores(config, regime_scores(config, measured)).items():
        ranked = bands(scores, f"priority {name}", settings["confidence"])
        if not ranked:
            continue
        best[f"priority:{name}"] = ranked[0].point_id
        rivals = [v.point_id for v in ranked[1:] if v.high >= margin][:keep - 1 if keep else None]
        if rivals or scores[ranked[0].point_id].stable is False:  # a leader whose cell did not settle: again
            unsettled.update(dict.fromkeys([ranked[0].point_id, *rivals]))
    settle = list(unsettled) if launch + 1 < configured + settle_launches(config) else []
    selection = Selection(screened=[], survivors=confirmed, dropped={}, best=best)
    carry_over(previous, selection, {"stage": f"settle after launch {launch + 1}", "entered": len(confirmed),
                                      "kept": len(settle)})
    selection.settle, selection.extra_launches = settle, extra
    return selection


def _launch_records(screen_dir: Path, confirm_dir: Path, point_id: str, launches: Iterable[int],
                    screening: bool) -> list[list[dict]]:
    """The request records of each completed launch of a point: its screening job where it counts as a launch,
    then its confirmation launches `launches` (results/confirm/<id>/launch-<k>; those missing or failed are left
    out)."""
    dirs = [*([Path(screen_dir) / point_id] if screening else []),
            *(Path(confirm_dir) / point_id / f"launch-{k}" for k in launches)]
    return [records for d in dirs if (records := load_launch(d))]
