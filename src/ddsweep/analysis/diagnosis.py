"""What bounds acceptance (drafter, tree budget, or cannot tell) and which knob comparisons are confounded.

The diagnosis compares acceptance only between points that differ in one knob, as ratios with intervals on
per-repeat figures: along each budget series (does the top budget step still buy acceptance?) and across
block sizes (does a block size above the drafter's trained one buy acceptance?). A gain counts as material
when it exceeds `analysis.diagnosis_gain`; a verdict needs intervals that settle it, else it is inconclusive.
Points that draft the same tree (aliases and acceptance twins in results/plan.json, e.g. budgets past a width-1
tree's capacity) accept alike by construction: a series keeps the first of them only, so they are neither
evidence nor members of the correction family. Matched budget series whose steps disagree in sign make the
verdict inconclusive (at a fixed width a larger budget's tree contains the smaller one's, so acceptance cannot
fall on a real engine), naming the disagreeing series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddsweep.analysis.regimes import ResolvedRegime, resolve_regime
from ddsweep.analysis.results import KNOBS, PointRecord, ResultSet, is_missing, same_knob, window_label
from ddsweep.analysis.settings import Regime, Settings
from ddsweep.analysis.statistics import Estimate

MAX_LIST = 12


def knob_text(knobs: dict[str, Any]) -> str:
    """Describe knob values, e.g. 'budget 8, topk 4, block_size 16, window 2048'."""
    parts = [f"{k} {window_label(v) if k == 'window' else v}" for k, v in knobs.items()
             if k == "window" or not is_missing(v)]
    return ", ".join(parts)


def gain_text(est: Estimate | None) -> str:
    """'+6.1% (95% CI +4.0% to +8.2%)' for a ratio estimate of acceptance."""
    if est is None:
        return "n/a"
    def pc(x: float) -> str:
        return f"{(x - 1) * 100:+.1f}%".replace("-", "−")
    if not est.has_interval:
        return f"{pc(est.value)} (no interval)"
    return f"{pc(est.value)} ({est.level * 100:.3g}% CI {pc(est.low)} to {pc(est.high)})"


@dataclass
class AcceptanceSeries:
    """Acceptance along one knob with every other knob held equal, with the whole and the top-step gains."""

    knob: str
    fixed: str
    values: list[int | None]
    acceptance: list[float]
    point_ids: list[str]
    gain: Estimate | None
    top_step: Estimate | None
    flat: list[str] = field(default_factory=list)  # left out: the same drafted tree as an earlier member


@dataclass
class BlockPair:
    """Two points that differ only in block size, with the acceptance gain of the larger one."""

    low: str
    high: str
    low_block: int
    high_block: int
    fixed: str
    gain: Estimate | None
    straddles: bool


@dataclass
class Diagnosis:
    """The verdict on what bounds acceptance, the sentence stating its evidence, and the series behind it."""

    cell: str
    verdict: str
    text: str
    threshold: float
    series: dict[str, list[AcceptanceSeries]]
    block_pairs: list[BlockPair] = field(default_factory=list)

    @property
    def drafter_bound(self) -> bool | None:
        """True for drafter-bound, False for budget-bound, None when inconclusive."""
        return {"drafter-bound": True, "budget-bound": False}.get(self.verdict)


def differing(p: PointRecord, q: PointRecord) -> list[str]:
    """The knobs whose values differ between two points."""
    return [k for k in KNOBS if not same_knob(getattr(p, k), getattr(q, k))]


def _value(p: PointRecord, knob: str) -> Any:
    """A knob value as used to group points ('off' for a disabled window)."""
    return window_label(p.window) if knob == "window" else getattr(p, knob)


def _sort_key(value: Any) -> float:
    """Order knob values with 'off' (missing) first."""
    return -1.0 if is_missing(value) else float(value)


def drafted_tree_key(point_id: str, plan: dict[str, dict[str, Any]]) -> str:
    """The plan's name for what a point drafts: its twin group, else its alias group, else the point itself."""
    entry = plan.get(point_id) or {}
    return str(entry.get("twin_group") or entry.get("alias_group") or point_id)


def _distinct_trees(members: list[PointRecord], plan: dict[str, dict[str, Any]]) -> tuple[list[PointRecord], list[str]]:
    """The members (in series order) with a drafted tree not seen earlier in the series, and the others' ids."""
    seen: set[str] = set()
    kept, flat = [], []
    for m in members:
        key = drafted_tree_key(m.point_id, plan)
        (flat.append(m.point_id) if key in seen else kept.append(m))
        seen.add(key)
    return kept, flat


def _series(points: list[PointRecord], resolved: ResolvedRegime, level: float,
            plan: dict[str, dict[str, Any]]) -> dict[str, list[AcceptanceSeries]]:
    """For each knob, the series of points that vary only that knob and draft distinct trees, with acceptance
    and its gains."""
    series: dict[str, list[AcceptanceSeries]] = {k: [] for k in KNOBS}
    for knob in KNOBS:
        groups: dict[tuple, list[PointRecord]] = {}
        for p in points:
            if knob != "window" and is_missing(getattr(p, knob)):
                continue
            key = (p.kind, *(_value(p, k) for k in KNOBS if k != knob))
            groups.setdefault(key, []).append(p)
        for _key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
            members.sort(key=lambda m: _sort_key(getattr(m, knob)))
            members, flat = _distinct_trees(members, plan)
            if len({_value(m, knob) for m in members}) < 2:
                continue
            fixed = {k: getattr(members[0], k) for k in KNOBS if k != knob}
            ids = [m.point_id for m in members]
            series[knob].append(AcceptanceSeries(
                knob, f"{members[0].kind}, {knob_text(fixed)}", [getattr(m, knob) for m in members],
                [resolved.figure(i)["mean"] for i in ids], ids, resolved.speedup(ids[-1], ids[0], level),
                resolved.speedup(ids[-1], ids[-2], level), flat))
    return series


def _sign_disagreement(series: list[AcceptanceSeries]) -> tuple[list[str], list[str]]:
    """Budget steps that rise and those that fall (by their estimates), when both occur and one is settled by its
    interval: at a fixed width acceptance cannot fall as the budget rises, so the two cannot both be true."""
    steps = [(f"budget {s.values[-2]} → {s.values[-1]} ({s.fixed})", s.top_step) for s in series
             if s.top_step is not None]
    rises = [(label, est) for label, est in steps if est.value > 1]
    falls = [(label, est) for label, est in steps if est.value < 1]
    settled = any(est.has_interval and (est.low > 1 or est.high < 1) for _, est in rises + falls)
    if not (rises and falls and settled):
        return [], []
    return ([f"{label}: {gain_text(est)}" for label, est in rises],
            [f"{label}: {gain_text(est)}" for label, est in falls])


def _block_pairs(points: list[PointRecord], resolved: ResolvedRegime, trained: int | None,
                 level: float) -> list[BlockPair]:
    """Every matched block-size pair (smaller first), marking those that straddle the trained block size."""
    pairs = []
    for p in points:
        for q in points:
            if (p.kind == q.kind and differing(p, q) == ["block_size"] and not is_missing(p.block_size)
                    and not is_missing(q.block_size) and p.block_size < q.block_size):
                fixed = knob_text({k: getattr(p, k) for k in KNOBS if k != "block_size"})
                pairs.append(BlockPair(p.point_id, q.point_id, p.block_size, q.block_size, fixed,
                                       resolved.speedup(q.point_id, p.point_id, level),
                                       trained is not None and p.block_size <= trained < q.block_size))
    return pairs


def _verdict(series: list[AcceptanceSeries], pairs: list[BlockPair], trained: int | None, gain: float,
             resolved: ResolvedRegime, level: float) -> tuple[str, str]:
    """Budget-bound when a top budget step or a larger block size raises acceptance beyond `gain` with
    confidence (Bonferroni over the comparisons: any one suffices, so the family needs the correction);
    drafter-bound when every comparison is below it at the plain level (all must hold, an intersection-union
    test needs no correction); else inconclusive."""
    limit = 1 + gain
    rises, falls = _sign_disagreement(series)
    if rises:
        return "inconclusive", (
            "**Inconclusive: matched budget series disagree in sign.** Acceptance rises with the budget in "
            f"{'; '.join(rises[:MAX_LIST])}, but falls in {'; '.join(falls[:MAX_LIST])}. At a fixed tree width a "
            "larger budget's tree contains the smaller one's, so on a real engine acceptance cannot fall as the "
            "budget rises: the difference is noise or the engine applies another tree rule (check the server "
            "logs), and neither series is evidence on its own. More repeats or launches would settle it.")
    used = [p for p in pairs if p.straddles] if trained is not None else pairs
    items = ([(f"budget {s.values[-2]} → {s.values[-1]} ({s.fixed})", s.top_step, s.point_ids[-1], s.point_ids[-2])
              for s in series]
             + [(f"block size {p.low_block} → {p.high_block} (`{p.low}` → `{p.high}`)", p.gain, p.high, p.low)
                for p in used])
    items = [item for item in items if item[1] is not None]
    evidence = "; ".join(f"{label}: {gain_text(est)}" for label, est, _, _ in items[:MAX_LIST])
    if not items:
        return "inconclusive", (
            "**Inconclusive.** No budget series and no matched block-size pair"
            + (f" straddling the drafter's trained block size ({trained})" if trained is not None else "")
            + " has acceptance figures at this cell, so what bounds acceptance cannot be judged from this sweep.")
    family = 1 - (1 - level) / len(items)
    rising = [(label, adjusted) for label, _, hi, lo in items
              if (adjusted := resolved.speedup(hi, lo, family)) is not None and adjusted.has_interval
              and adjusted.low > limit]
    flat = [label for label, est, _, _ in items if est.has_interval and est.high < limit]
    if rising:
        shown = "; ".join(f"{label}: {gain_text(est)}" for label, est in rising[:MAX_LIST])
        correction = f" (intervals at {family:.1%}, Bonferroni over {len(items)} comparisons)" if len(items) > 1 else ""
        return "budget-bound", (
            f"**Acceptance is budget-bound.** Acceptance still rises by more than {gain:.0%} with confidence"
            f"{correction}: {shown}. A larger tree budget or block size buys accepted tokens; the drafter is not yet "
            "the limit.")
    if len(flat) == len(items):
        note = ("" if trained is not None or not used else
                " (the drafter's trained block size is unknown, so every block-size pair was used)")
        return "drafter-bound", (
            f"**Acceptance is drafter-bound.** Every comparison gains less than {gain:.0%} with confidence{note}: "
            f"{evidence}. More budget or a larger block size buys little acceptance; a better-matched drafter "
            "would be needed for more.")
    shown = "; ".join(f"{label}: {gain_text(est)}" for label, est, _, _ in items if label not in flat)
    return "inconclusive", (
        f"**Inconclusive.** These intervals include both less and more than a {gain:.0%} gain, so neither a "
        f"drafter bound nor a budget bound is supported: {shown}. More repeats would narrow them.")


def _block_note(points: list[PointRecord], pairs: list[BlockPair], trained: int | None,
                resolved: ResolvedRegime, level: float) -> str:
    """A sentence when no matched block-size pair straddles the trained block size, naming the closest
    unmatched comparison and what else it changes."""
    if trained is None or any(p.straddles for p in pairs):
        return ""
    loose = sorted(((len(differing(p, q)), p.point_id, p, q) for p in points for q in points
                    if p.kind == q.kind and not is_missing(p.block_size) and not is_missing(q.block_size)
                    and p.block_size <= trained < q.block_size), key=lambda t: (t[0], t[1]))
    text = (f" No matched block-size pair (one knob changed) straddles the drafter's trained block size "
            f"({trained}), so whether a larger block size buys acceptance cannot be judged from this sweep.")
    if loose:
        _, _, p, q = loose[0]
        others = ", ".join(k for k in differing(p, q) if k != "block_size")
        text += (f" The closest comparison, `{p.point_id}` → `{q.point_id}` "
                 f"({gain_text(resolved.speedup(q.point_id, p.point_id, level))}), also changes {others}, so "
                 "the change cannot be attributed to the block size.")
    return text


def _acceptance_regime(settings: Settings, default: Regime) -> Regime:
    """The regime whose cell is used to study acceptance: max_acceptance, any acceptance regime, or default."""
    for regime in settings.regimes:
        if regime.name == "max_acceptance":
            return regime
    return next((r for r in settings.regimes if r.metric == "acceptance_length"), default)


def diagnose(results: ResultSet, settings: Settings, default: Regime) -> Diagnosis:
    """Study acceptance along each knob with matched comparisons and state what bounds it."""
    ok = [p for p in results.ok_points() if p.kind in ("ddtree", "dflash")]
    resolved = resolve_regime(results, _acceptance_regime(settings, default), [p.point_id for p in ok])
    present = [p for p in ok if resolved.figure(p.point_id) and resolved.figure(p.point_id)["mean"] > 0]
    cell = resolved.cell() + (f" ({resolved.note})" if resolved.note else "")
    series = _series(present, resolved, settings.confidence, results.plan)
    pairs = _block_pairs(present, resolved, settings.trained_block_size, settings.confidence)
    verdict, text = _verdict(series["budget"], pairs, settings.trained_block_size, settings.diagnosis_gain,
                             resolved, settings.confidence)
    text += _block_note(present, pairs, settings.trained_block_size, resolved, settings.confidence)
    return Diagnosis(cell, verdict, text, settings.diagnosis_gain, series, pairs)


@dataclass
class Confound:
    """A knob comparison that has no one-knob-changed pair: the closest pair also differs in other knobs."""

    knob: str
    values: tuple[Any, Any]
    pair: tuple[str, str]
    also_differs: list[str]
    alternative: tuple[str, str] | None
    missing: str


def confounds(results: ResultSet) -> list[Confound]:
    """Adjacent knob values that no one-knob-changed pair connects; name the closest pair and what else differs."""
    found = []
    for kind in ("ddtree", "dflash"):
        points = [p for p in results.ok_points() if p.kind == kind]
        for knob in KNOBS:
            if knob != "window" and any(is_missing(getattr(p, knob)) for p in points):
                continue
            values = sorted({_value(p, knob) for p in points}, key=lambda v: -1.0 if v == "off" else float(v))
            matched_any = [(p, q) for p in points for q in points
                           if differing(p, q) == [knob] and p.point_id < q.point_id]
            for a, b in zip(values, values[1:], strict=False):
                pairs = [(p, q) for p in points if _value(p, knob) == a for q in points if _value(q, knob) == b]
                if any(differing(p, q) == [knob] for p, q in pairs):
                    continue
                p, q = min(pairs, key=lambda pq: (len(differing(*pq)), pq[0].point_id, pq[1].point_id))
                missing = {k: getattr(p, k) for k in KNOBS}
                missing[knob] = getattr(q, knob)
                alternative = next(((x.point_id, y.point_id) for x, y in matched_any), None)
                found.append(Confound(knob, (a, b), (p.point_id, q.point_id),
                                      [k for k in differing(p, q) if k != knob], alternative,
                                      f"{kind}: {knob_text(missing)}"))
    return found
