"""The adaptive study's selection: which screened points could still be the best.

Per priority (with `sweep.screen.select_on: regimes`, per regime and priority), a point is dropped only when the
band of its relative difference to the best point lies entirely below `sweep.screen.tolerance`; every other point
survives, together with the `ar` and DFlash baselines (measured once, in one full launch: references that take
part in the comparisons but are never dropped, capped or raced). A figure whose cell did not settle keeps its
evidence with a band widened by its instability, and is never the best at its own value: the best is the highest
figure that settled, or an unsettled one only where even its lower bound, widened, lies above every settled
figure. Where the study has several launches, the screening stands for a candidate's first launch, and the
final selection (after the refinement) is the race's first round: it keeps at most `sweep.screen.race_keep` of the
remaining candidates per place, the best by their figures so far (a place whose leader no rival can still beat
keeps the leader alone). The same selection runs again after each confirmation launch but the last (the race,
adaptive/race.py), on every launch of each point so far, with the same cap. See docs/adaptive.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ddsweep.adaptive.refinement import refine_candidates
from ddsweep.adaptive.screening import (
    ScreenedFigure,
    load_launch,
    load_screen,
    priority_scores,
    regime_scores,
    two_sided_z,
)
from ddsweep.adaptive.stages import (
    baseline_ids,
    first_confirm_launch,
    running_baselines,
    screen_settings,
    selection_places,
)


@dataclass
class Verdict:
    """Why a point was dropped: the comparison that excluded it."""

    point_id: str
    where: str
    relative: float
    low: float
    high: float
    best: str
    level: float
    rank: int = 0
    kept: int = 0
    widened: float = 0.0  # the instabilities of the two figures, on the log scale, in the band

    @property
    def reason(self) -> str:
        """A sentence such as '−18% vs best at latency (bs8-b8-t4-w2048), band −21%…−15% (±1.64 se)', with the
        widening where a figure did not settle, and the point's rank when the race's cap, not the band, dropped it.
        The band is the selection rule's, not a confidence interval: the best is chosen from the same data
        (docs/adaptive.md)."""
        spread = f" and ±{math.expm1(self.widened) * 100:.0f}% unsettled" if self.widened else ""
        text = (f"{_pct(self.relative)} vs best at {self.where} ({self.best}), "
                f"band {_pct(self.low)}…{_pct(self.high)} (±{two_sided_z(self.level):.2f} se{spread})")
        return text + (f"; ranked {self.rank} there, and the race keeps {self.kept}" if self.rank else "")

    @property
    def rule(self) -> str:
        """The rule that dropped the point (RULES)."""
        return "race cap" if self.rank else "widened band" if self.widened else "band"


# The rules that drop a point: its band below the tolerance (figures that settled), the same with a band widened
# because a cell did not settle, and the race's cap (sweep.screen.race_keep).
RULES = ("band", "widened band", "race cap")


@dataclass
class Selection:
    """The outcome of one selection round."""

    screened: list[str]
    survivors: list[str]
    dropped: dict[str, str]
    best: dict[str, str]
    refine: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    unstable: dict[str, list[str]] = field(default_factory=dict)  # point -> where its figure did not settle
    settle: list[str] | None = None
    extra_launches: dict[str, list[int]] = field(default_factory=dict)
    race_launches: dict[str, int] = field(default_factory=dict)
    dropped_by: dict[str, str] = field(default_factory=dict)  # point -> the rule (RULES) of its reason

    def to_json(self) -> dict:
        """The record written to results/screen/*.json and results/confirm/race-*.json (docs/results-schema.md);
        a race round's also lists `race_launches`, a settling round's `settle` and `extra_launches`."""
        record = {"screened": self.screened, "survivors": self.survivors, "dropped": self.dropped,
                  "dropped_by": self.dropped_by, "best": self.best, "refine": self.refine, "failed": self.failed,
                  "rounds": self.rounds}
        if self.unstable:
            record["unstable"] = self.unstable
        if self.race_launches:
            record["race_launches"] = self.race_launches
        if self.settle is not None:
            record.update(settle=self.settle, extra_launches=self.extra_launches)
        return record


def _pct(x: float) -> str:
    """A relative difference as a signed percentage with a real minus sign."""
    return f"{x * 100:+.0f}%".replace("-", "\u2212")


def leader(scores: dict[str, ScreenedFigure]) -> str:
    """The point the others are compared with: the one whose figure, lowered by its instability, is highest. A
    settled figure counts at its value, so an unsettled one leads only where even its widened lower bound lies above
    every settled figure (or where no figure settled)."""
    return max(scores, key=lambda p: (math.log(scores[p].value) - scores[p].instability, scores[p].value, p))


def bands(scores: dict[str, ScreenedFigure], where: str, confidence: float, best: str | None = None) -> list[Verdict]:
    """Every point's relative difference to `best` (default: the highest figure) with its band,
    ±(√(h_p² + h_best²) + u_p + u_best) on the log scale, h each figure's half width at `confidence` (z·se, the
    within-launch part at Student's t) and u its instability (0 where its cells settled: a bound, so it adds);
    `best` first, then by figure."""
    if not scores:
        return []
    ranked = sorted(scores, key=lambda p: (scores[p].value, p), reverse=True)
    best = best or ranked[0]
    top = scores[best]
    out = []
    for pid in [best, *(p for p in ranked if p != best)]:
        figure = scores[pid]
        diff = math.log(figure.value / top.value)
        widened = figure.instability + top.instability if pid != best else 0.0
        width = math.hypot(figure.half_width(confidence), top.half_width(confidence)) + widened
        out.append(Verdict(pid, where, math.expm1(diff), math.expm1(diff - width), math.expm1(diff + width),
                           best, confidence, widened=widened))
    return out


def _compare(scores: dict[str, ScreenedFigure], where: str, confidence: float, dropped: dict[str, Verdict],
             tolerance: float = 0.0, keep_at_most: int | None = None,
             uncapped: frozenset[str] = frozenset()) -> str | None:
    """Drop from `scores` every point whose band of the relative difference to the leader lies below +`tolerance`
    (clearly worse, or at most a near-tie), then, with `keep_at_most`, every remaining point ranked below that
    many (the leader first, the others by figure; the `uncapped` points, the baselines, neither count nor are
    capped); returns the leader. A figure whose cell did not settle keeps
    its evidence: its band is widened by its instability, so it is dropped only when even its widened upper bound
    lies below the leader's lower bound, and it leads only by its widened lower bound (`leader`).
    (Bonferroni-adjusted bands gave no more correct recommendations in benchmarks/bench_adaptive.py on the
    62-job grid, 27 vs 28 of 30, and confirmed about 1.7 times as many.)"""
    ranked = bands(scores, where, confidence, leader(scores)) if scores else []
    remaining = 0
    for verdict in ranked:
        if verdict.point_id != verdict.best and verdict.high < tolerance:
            dropped[verdict.point_id] = verdict
            continue
        if verdict.point_id in uncapped:
            continue
        remaining += 1
        if keep_at_most and remaining > keep_at_most:
            verdict.rank, verdict.kept = remaining, keep_at_most
            dropped[verdict.point_id] = verdict
    return ranked[0].best if ranked else None


def select(config: dict, launches: dict[str, list[list[dict]]], where: str = "", race: bool = False) -> Selection:
    """Keep, per place (`selection_places`: each priority, or each selected regime and priority), every point
    that could still be the best (in a `race` round at most `sweep.screen.race_keep` of them), plus the baselines.
    `launches` holds per point the request records of each of its launches (screening, then confirmation
    launches).

    A point survives if some regime or priority keeps it; its reason for being dropped is its worst comparison
    (prefixed with `where`, the stage that dropped it)."""
    settings = screen_settings(config)
    keep_at_most = settings.get("race_keep") if race else None
    always = frozenset(baseline_ids(config))
    per_regime = regime_scores(config, launches)
    places = selection_places(config)
    compared = [(f"regime {n}", s) for n, s in per_regime.items() if f"regime {n}" in places]
    compared += [(f"priority {n}", s) for n, s in priority_scores(config, per_regime).items()
                 if f"priority {n}" in places]
    verdicts: dict[str, dict[str, Verdict]] = {}
    best: dict[str, str] = {}
    unstable: dict[str, list[str]] = {}
    for place, scores in compared:
        for pid, figure in scores.items():
            if figure.stable is False:
                unstable.setdefault(pid, []).append(f"{where}{place}")
        dropped: dict[str, Verdict] = {}
        kind, name = place.split(" ", 1)
        top = _compare(scores, name if kind == "regime" else place, settings["confidence"], dropped,
                       settings["tolerance"], keep_at_most, always)
        if top:
            best[f"{kind}:{name}"] = top
        verdicts[f"{kind}:{name}"] = dropped
    survivors, reasons, rules = [], {}, {}
    for pid in launches:
        excluded = [v[pid] for v in verdicts.values() if pid in v]
        if pid in always or len(excluded) < len(verdicts) or not verdicts:
            survivors.append(pid)
        else:
            closest = max(excluded, key=lambda v: v.high)
            reasons[pid], rules[pid] = where + closest.reason, closest.rule
    return Selection(screened=list(launches), survivors=survivors, dropped=reasons, best=best, unstable=unstable,
                     dropped_by=rules)


def select_round(config: dict, screen_dir: Path, point_ids: list[str], previous: dict | None,
                 confirm_dir: Path | None = None) -> Selection:
    """Round 1 (previous None): select among the configured points and list refinement points around the
    screening's best points (`sweep.refine_around: best`) or all its survivors. Final round: select again among
    round-1 survivors and the refinement points; where the screening stands for the candidates' first launch
    (`first_confirm_launch`), this is the race's first round, with its cap. A baseline's figures come from its one
    full launch (CONFIRM_DIR/<id>/launch-0, default beside SCREEN_DIR), which stands for its screening."""
    baselines = running_baselines(config)
    candidates = ([*point_ids, *(p for p in baselines if p not in point_ids)] if previous is None
                  else list(dict.fromkeys([*previous["survivors"], *previous["refine"]])))
    confirm_dir = Path(confirm_dir) if confirm_dir is not None else Path(screen_dir).parent / "confirm"
    requests, failed = load_screen(screen_dir, [p for p in candidates if p not in baselines])
    for pid in (p for p in candidates if p in baselines):
        records = load_launch(confirm_dir / pid / "launch-0")
        if records is None:
            failed.append(pid)
        else:
            requests[pid] = [records]
    race = previous is not None and first_confirm_launch(config) == 1
    selection = select(config, requests, race=race)
    selection.failed = failed
    stage = {"stage": "screen" if previous is None else "refine, race cap" if race else "refine",
             "entered": len(candidates),
             "kept": len(selection.survivors)}
    if previous is None:
        around = (selection.survivors if config["sweep"].get("refine_around") == "survivors"
                  else settled_leaders(selection.best, selection.unstable))
        selection.refine = [p.point_id for p in refine_candidates(config, around)]
        selection.rounds = [stage]
    else:
        carry_over(previous, selection, stage)
    return selection


def settled_leaders(best: dict[str, str], unstable: dict[str, list[str]]) -> list[str]:
    """The best points (`best`, per `regime:NAME` and `priority:NAME`) whose figure there settled (`unstable`: where
    each point's did not): refinement spends screening jobs around a point the screening found best, and a lead
    that rests on a cell that did not settle is not found yet (the race measures it again)."""
    return sorted({pid for place, pid in best.items() if " ".join(place.split(":", 1)) not in unstable.get(pid, [])})


def carry_over(previous: dict, selection: Selection, stage: dict) -> None:
    """A later round's record keeps the earlier rounds': screened, dropped and failed points, the refinement
    points, the launches of the points the race dropped and the rounds, with this round's added."""
    selection.race_launches = {**previous.get("race_launches", {}), **selection.race_launches}
    selection.dropped = {**previous["dropped"], **selection.dropped}
    selection.dropped_by = {**previous.get("dropped_by", {}), **selection.dropped_by}
    selection.screened = list(dict.fromkeys([*previous["screened"], *selection.screened]))
    selection.failed = list(dict.fromkeys([*previous.get("failed", []), *selection.failed]))
    selection.refine = list(previous.get("refine", []))
    selection.rounds = [*previous.get("rounds", []), stage]
    unstable = {pid: list(where) for pid, where in previous.get("unstable", {}).items()}
    for pid, where in selection.unstable.items():
        unstable[pid] = list(dict.fromkeys([*unstable.get(pid, []), *where]))
    selection.unstable = unstable
