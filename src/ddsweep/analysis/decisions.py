"""Decide from the data which configuration to run, and write it up as the Markdown optimization summary.

:func:`analyse` turns a :class:`~ddsweep.analysis.results.ResultSet` and the study settings into :class:`Decisions`
(regime winners with ties, priority picks with trade-offs, the Pareto set, the acceptance diagnosis and the
caveats); :func:`render_markdown` writes them for the person who must pick a configuration.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ddsweep.analysis.results import (
    KNOBS,
    METRIC_LABELS,
    LosslessResult,
    PointRecord,
    Regime,
    ResolvedRegime,
    ResultSet,
    ar_point_id,
    coding_stats,
    is_missing,
    lossless_vs_ar,
    ratio_vs,
    resolve_regime,
    same_knob,
    window_label,
)

DEFAULT_REGIMES: tuple[Regime, ...] = (
    Regime("latency", "decode_tok_s", 128, 1),
    Regime("long_context", "decode_tok_s", 4096, 1),
    Regime("throughput", "output_throughput_tok_s", 128, 32),
    Regime("max_acceptance", "acceptance_length", 128, 1),
)
DEFAULT_PRIORITIES: dict[str, dict[str, float]] = {
    "latency_first": {"latency": 1.0},
    "throughput_first": {"throughput": 1.0},
    "balanced": {"latency": 0.5, "throughput": 0.5},
}
DRAFTER_BOUND_GAIN = 0.10
CLOSE_SCORE = 0.01
MAX_LIST = 12


@dataclass
class Settings:
    """The parts of the study config the analysis uses, with defaults filled in."""

    study: str
    regimes: list[Regime]
    priorities: dict[str, dict[str, float]]
    spread_warning: float
    trained_block_size: int | None
    trained_block_size_source: str
    reproduce_command: str
    config: dict[str, Any] | None = None
    config_path: Path | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any] | None, config_path: Path | None = None) -> Settings:
        """Read study name, regimes, priorities, spread threshold, drafter block size and reproduce command."""
        config = config or {}
        analysis = config.get("analysis") or {}
        regimes = [Regime(str(r["name"]), str(r["metric"]), int(r["context"]), int(r["concurrency"]))
                   for r in analysis.get("regimes") or []] or list(DEFAULT_REGIMES)
        priorities = {str(k): {str(r): float(w) for r, w in (v or {}).items()}
                      for k, v in (analysis.get("priorities") or {}).items()} or dict(DEFAULT_PRIORITIES)
        trained, source = _trained_block_size(config.get("drafter") or {})
        shown_path = str(config_path) if config_path else "<path to the study config>"
        command = config.get("reproduce_command") or f"snakemake --cores all --configfile {shown_path}"
        return cls(
            study=str(config.get("study") or "study"), regimes=regimes, priorities=priorities,
            spread_warning=float(analysis.get("spread_warning", 0.10)), trained_block_size=trained,
            trained_block_size_source=source, reproduce_command=command, config=config or None,
            config_path=config_path,
        )


def _trained_block_size(drafter: dict[str, Any]) -> tuple[int | None, str]:
    """The drafter's trained block size from the config, else from its model's config.json, else unknown."""
    if drafter.get("trained_block_size"):
        return int(drafter["trained_block_size"]), "drafter.trained_block_size in the study config"
    model_path = drafter.get("model_path")
    if model_path:
        path = Path(model_path) / "config.json"
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get("block_size")
        except (OSError, ValueError, AttributeError):
            value = None
        if isinstance(value, int) and value > 0:
            return value, f"block_size in {path}"
    return None, "unknown (set drafter.trained_block_size in the config)"


@dataclass
class RegimeOutcome:
    """The best point of one regime, the points statistically tied with it, and its speed-up over ar."""

    resolved: ResolvedRegime
    winner: str | None
    ties: list[str]
    speedup_vs_ar: float | None


@dataclass
class PriorityPick:
    """The recommended point for one declared priority and how it trades off against the other picks."""

    name: str
    weights: dict[str, float]
    point_id: str | None
    score: float | None
    runner_up: tuple[str, float] | None
    unknown_regimes: list[str]
    tradeoffs: list[str] = field(default_factory=list)


@dataclass
class AcceptanceSeries:
    """Acceptance along one knob with every other knob held equal."""

    knob: str
    fixed: str
    values: list[int | None]
    acceptance: list[float]
    point_ids: list[str]

    @property
    def gain(self) -> float:
        """Relative acceptance change from the lowest to the highest knob value."""
        return self.acceptance[-1] / self.acceptance[0] - 1


@dataclass
class Diagnosis:
    """How acceptance responds to each knob, and whether acceptance is bound by the drafter."""

    cell: str
    series: dict[str, list[AcceptanceSeries]]
    drafter_bound: bool | None
    drafter_text: str


@dataclass
class Confound:
    """A knob comparison that has no one-knob-changed pair: the closest pair also differs in other knobs."""

    knob: str
    values: tuple[Any, Any]
    pair: tuple[str, str]
    also_differs: list[str]
    alternative: tuple[str, str] | None
    missing: str


@dataclass
class Decisions:
    """Everything the summary reports, computed from the data."""

    settings: Settings
    results: ResultSet
    regimes: list[RegimeOutcome]
    priorities: list[PriorityPick]
    pareto: list[str]
    pareto_axes: tuple[str, str] | None
    diagnosis: Diagnosis
    confounds: list[Confound]
    spread: pd.DataFrame
    coding: pd.DataFrame
    lossless: LosslessResult

    def regime(self, name: str) -> RegimeOutcome | None:
        """Return the outcome of the regime called `name`."""
        return next((r for r in self.regimes if r.resolved.regime.name == name), None)

    def priority(self, name: str) -> PriorityPick | None:
        """Return the pick of the priority called `name`."""
        return next((p for p in self.priorities if p.name == name), None)


def fmt(metric: str, value: float | None) -> str:
    """Format a figure with precision suited to its metric."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if metric == "acceptance_length":
        return f"{value:.2f}"
    if "tok_s" in metric:
        return f"{value:.1f} tok/s"
    return f"{value:.3f} s"


def pct(value: float) -> str:
    """Format a relative change as a signed percentage with a true minus sign."""
    return f"{value * 100:+.1f}%".replace("-", "−")


def knob_text(knobs: dict[str, Any]) -> str:
    """Describe knob values, e.g. 'budget 8, topk 4, block_size 16, window 2048'."""
    parts = [f"{k} {window_label(v) if k == 'window' else v}" for k, v in knobs.items()
             if k == "window" or not is_missing(v)]
    return ", ".join(parts)


def _overlaps(a: dict[str, float], b: dict[str, float]) -> bool:
    """True when two confidence intervals overlap."""
    return a["ci_low"] <= b["ci_high"] and b["ci_low"] <= a["ci_high"]


def _regime_outcome(resolved: ResolvedRegime, ar_id: str | None) -> RegimeOutcome:
    """Pick the best point of a resolved regime and the points whose CIs overlap the winner's."""
    table = resolved.table
    if table.empty:
        return RegimeOutcome(resolved, None, [], None)
    winner = str(table.iloc[0]["point_id"])
    best = resolved.figure(winner)
    ties = [str(pid) for pid in table["point_id"].iloc[1:] if _overlaps(resolved.figure(str(pid)), best)]
    ar = resolved.figure(ar_id) if ar_id else None
    speedup = ratio_vs(best["median"], ar["median"], resolved.regime.lower_is_better) if ar else None
    return RegimeOutcome(resolved, winner, ties, speedup)


def _normalised(resolved: ResolvedRegime) -> dict[str, float]:
    """Each point's regime figure as a fraction of the best (1.0 = best), respecting the metric direction."""
    table = resolved.table
    if table.empty:
        return {}
    medians = dict(zip(table["point_id"], table["median"], strict=True))
    positive = {k: v for k, v in medians.items() if v > 0}
    if not positive:
        return {}
    if resolved.regime.lower_is_better:
        best = min(positive.values())
        return {k: best / v for k, v in positive.items()}
    best = max(positive.values())
    return {k: v / best for k, v in positive.items()}


def _priority_picks(settings: Settings, outcomes: list[RegimeOutcome]) -> list[PriorityPick]:
    """Score every point per priority (weighted normalised regime figures) and describe the trade-offs."""
    by_name = {o.resolved.regime.name: o for o in outcomes}
    picks = []
    for name, weights in settings.priorities.items():
        unknown = [r for r in weights if r not in by_name]
        used = {r: w for r, w in weights.items() if r in by_name and w > 0}
        norms = {r: _normalised(by_name[r].resolved) for r in used}
        candidates = set.intersection(*(set(n) for n in norms.values())) if norms else set()
        total = sum(used.values())
        scores = {pid: sum(w * norms[r][pid] for r, w in used.items()) / total for pid in candidates}
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        picks.append(PriorityPick(
            name, weights, ranked[0][0] if ranked else None, ranked[0][1] if ranked else None,
            ranked[1] if len(ranked) > 1 else None, unknown))
    for pick in picks:
        others: dict[str, list[PriorityPick]] = {}
        for other in picks:
            if other is not pick and pick.point_id is not None and other.point_id is not None:
                others.setdefault(other.point_id, []).append(other)
        for other_id, group in others.items():
            names = " and ".join(f"`{o.name}`" for o in group)
            if other_id == pick.point_id:
                pick.tradeoffs.append(f"is also the {names} pick")
                continue
            weights = [r for o in group for r in o.weights]
            regime_names = [r for r in dict.fromkeys([*pick.weights, *weights]) if r in by_name]
            changes = []
            for regime_name in regime_names:
                resolved = by_name[regime_name].resolved
                mine, theirs = resolved.figure(pick.point_id), resolved.figure(other_id)
                if mine and theirs and theirs["median"]:
                    metric = resolved.regime.metric
                    changes.append(
                        f"{pct(mine['median'] / theirs['median'] - 1)} {regime_name} "
                        f"({fmt(metric, mine['median'])} vs {fmt(metric, theirs['median'])}, "
                        f"{metric} at {resolved.cell()}"
                        f"{', lower is better' if resolved.regime.lower_is_better else ''})")
            if changes:
                pick.tradeoffs.append(f"vs `{other_id}` (the {names} pick): " + "; ".join(changes))
    return picks


def _pareto(outcomes: list[RegimeOutcome]) -> tuple[list[str], tuple[str, str] | None]:
    """Non-dominated points on (latency regime, throughput regime), using the regimes so named."""
    by_name = {o.resolved.regime.name: o.resolved for o in outcomes}
    lat, thr = by_name.get("latency"), by_name.get("throughput")
    if lat is None or thr is None or lat.table.empty or thr.table.empty:
        return [], None
    sign_lat = -1.0 if lat.regime.lower_is_better else 1.0
    sign_thr = -1.0 if thr.regime.lower_is_better else 1.0
    both = {}
    for pid in lat.table["point_id"]:
        a, b = lat.figure(pid), thr.figure(pid)
        if a and b:
            both[str(pid)] = (sign_lat * a["median"], sign_thr * b["median"])
    front = [pid for pid, (x, y) in both.items()
             if not any(ox >= x and oy >= y and (ox > x or oy > y) for ox, oy in both.values())]
    front.sort(key=lambda pid: -both[pid][0])
    return front, ("latency", "throughput")


def _acceptance_regime(settings: Settings) -> Regime:
    """The regime whose cell is used to study acceptance: max_acceptance, any acceptance regime, or default."""
    for regime in settings.regimes:
        if regime.name == "max_acceptance":
            return regime
    for regime in settings.regimes:
        if regime.metric == "acceptance_length":
            return regime
    return DEFAULT_REGIMES[3]


def _differing(p: PointRecord, q: PointRecord) -> list[str]:
    """The knobs whose values differ between two points."""
    return [k for k in KNOBS if not same_knob(getattr(p, k), getattr(q, k))]


def _sort_key(value: Any) -> float:
    """Order knob values with 'off' (missing) first."""
    return -1.0 if is_missing(value) else float(value)


def _acceptance_series(points: list[PointRecord], acceptance: dict[str, float]) -> dict[str, list]:
    """For each knob, the series of points that vary only that knob, with their acceptance."""
    series: dict[str, list[AcceptanceSeries]] = {k: [] for k in KNOBS}
    for knob in KNOBS:
        groups: dict[tuple, list[PointRecord]] = {}
        for p in points:
            if p.point_id not in acceptance or (knob != "window" and is_missing(getattr(p, knob))):
                continue
            key = (p.kind, *(window_label(getattr(p, k)) if k == "window" else getattr(p, k)
                             for k in KNOBS if k != knob))
            groups.setdefault(key, []).append(p)
        for _key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
            if len({window_label(getattr(m, knob)) for m in members}) < 2:
                continue
            members.sort(key=lambda m: _sort_key(getattr(m, knob)))
            fixed = {k: getattr(members[0], k) for k in KNOBS if k != knob}
            series[knob].append(AcceptanceSeries(
                knob, f"{members[0].kind}, {knob_text(fixed)}", [getattr(m, knob) for m in members],
                [acceptance[m.point_id] for m in members], [m.point_id for m in members]))
    return series


def _drafter_verdict(points: list[PointRecord], acceptance: dict[str, float],
                     trained: int | None) -> tuple[bool | None, str]:
    """Decide whether a block size above the trained one buys acceptance, from matched pairs only."""
    pairs = []
    for p in points:
        for q in points:
            if (p.kind == q.kind and p.point_id in acceptance and q.point_id in acceptance
                    and _differing(p, q) == ["block_size"] and not is_missing(p.block_size)
                    and not is_missing(q.block_size) and p.block_size < q.block_size):
                pairs.append((p, q))
    if trained is None:
        if not pairs:
            return None, ("The drafter's trained block size is unknown and no matched block-size pair exists, "
                          "so whether acceptance is drafter-bound cannot be judged.")
        lines = "; ".join(f"`{p.point_id}` → `{q.point_id}`: {acceptance[p.point_id]:.2f} → "
                          f"{acceptance[q.point_id]:.2f} ({pct(acceptance[q.point_id] / acceptance[p.point_id] - 1)})"
                          for p, q in pairs[:MAX_LIST])
        return None, ("The drafter's trained block size is unknown (set `drafter.trained_block_size`), so it "
                      f"cannot be said whether larger block sizes exceed its training. Matched block-size pairs: "
                      f"{lines}.")
    straddling = [(p, q) for p, q in pairs if p.block_size <= trained < q.block_size]
    if not straddling:
        loose = sorted(((len(_differing(p, q)), p, q) for p in points for q in points
                        if p.kind == q.kind and p.point_id in acceptance and q.point_id in acceptance
                        and not is_missing(p.block_size) and not is_missing(q.block_size)
                        and p.block_size <= trained < q.block_size), key=lambda t: (t[0], t[1].point_id))
        hint = ""
        if loose:
            _, p, q = loose[0]
            others = ", ".join(k for k in _differing(p, q) if k != "block_size")
            hint = (f" The closest available comparison, `{p.point_id}` → `{q.point_id}`, "
                    f"{acceptance[p.point_id]:.2f} → {acceptance[q.point_id]:.2f} "
                    f"({pct(acceptance[q.point_id] / acceptance[p.point_id] - 1)}), also changes {others}, so "
                    "the change cannot be attributed to the block size.")
        return None, (f"No matched pair (one knob changed, others equal) compares a block size at or below the "
                      f"drafter's trained block size ({trained}) with one above it, so whether acceptance is "
                      f"drafter-bound cannot be judged from this sweep.{hint}")
    gains = [(acceptance[q.point_id] / acceptance[p.point_id] - 1, p, q) for p, q in straddling]
    best_gain, p, q = max(gains, key=lambda g: g[0])
    detail = "; ".join(
        f"`{lo.point_id}` → `{hi.point_id}` ({knob_text({k: getattr(lo, k) for k in KNOBS if k != 'block_size'})}):"
        f" {acceptance[lo.point_id]:.2f} → {acceptance[hi.point_id]:.2f} ({pct(g)})"
        for g, lo, hi in sorted(gains, key=lambda g: -g[0])[:MAX_LIST])
    if best_gain < DRAFTER_BOUND_GAIN:
        return True, (
            f"**Acceptance is drafter-bound.** Raising the block size above the drafter's trained "
            f"{trained} buys at most {pct(best_gain)} mean acceptance (below the {DRAFTER_BOUND_GAIN:.0%} "
            f"threshold): {detail}. The drafter, not the tree, limits the tokens accepted per step; block sizes "
            f"above {trained} cost draft compute for little gain, and a drafter trained at a larger block size "
            f"would be needed for more.")
    return False, (
        f"**Acceptance is not drafter-bound.** A block size above the drafter's trained {trained} raises mean "
        f"acceptance by up to {pct(best_gain)} (at or above the {DRAFTER_BOUND_GAIN:.0%} threshold): {detail}.")


def _diagnosis(results: ResultSet, settings: Settings) -> Diagnosis:
    """Study acceptance along each knob with matched comparisons and judge whether the drafter bounds it."""
    ok = [p for p in results.ok_points() if p.kind in ("ddtree", "dflash")]
    resolved = resolve_regime(results.groups, _acceptance_regime(settings), [p.point_id for p in ok])
    acceptance = {str(pid): float(m) for pid, m in zip(resolved.table["point_id"], resolved.table["median"],
                                                        strict=True) if m > 0}
    cell = resolved.cell() + (f" ({resolved.note})" if resolved.note else "")
    bound, text = _drafter_verdict(ok, acceptance, settings.trained_block_size)
    return Diagnosis(cell, _acceptance_series(ok, acceptance), bound, text)


def _confounds(results: ResultSet) -> list[Confound]:
    """Adjacent knob values that no one-knob-changed pair connects; name the closest pair and what else differs."""
    found = []
    for kind in ("ddtree", "dflash"):
        points = [p for p in results.ok_points() if p.kind == kind]
        for knob in KNOBS:
            if knob != "window" and any(is_missing(getattr(p, knob)) for p in points):
                continue
            values = sorted({window_label(getattr(p, knob)) if knob == "window" else getattr(p, knob)
                             for p in points}, key=lambda v: -1.0 if v == "off" else float(v))
            matched_any = [(p, q) for p in points for q in points
                           if _differing(p, q) == [knob] and p.point_id < q.point_id]
            for a, b in zip(values, values[1:], strict=False):
                side_a = [p for p in points if _value(p, knob) == a]
                side_b = [p for p in points if _value(p, knob) == b]
                pairs = [(p, q) for p in side_a for q in side_b]
                if any(_differing(p, q) == [knob] for p, q in pairs):
                    continue
                p, q = min(pairs, key=lambda pq: (len(_differing(*pq)), pq[0].point_id, pq[1].point_id))
                missing = {k: getattr(p, k) for k in KNOBS}
                missing[knob] = getattr(q, knob)
                alternative = next(((x.point_id, y.point_id) for x, y in matched_any), None)
                found.append(Confound(knob, (a, b), (p.point_id, q.point_id),
                                      [k for k in _differing(p, q) if k != knob], alternative,
                                      f"{kind}: {knob_text(missing)}"))
    return found


def _value(p: PointRecord, knob: str) -> Any:
    """A knob value as used to group points ('off' for a disabled window)."""
    return window_label(p.window) if knob == "window" else getattr(p, knob)


def _spread(results: ResultSet, settings: Settings) -> pd.DataFrame:
    """Groups of completed points whose CI half-width exceeds the spread warning, widest first."""
    metrics = {r.metric for r in settings.regimes}
    ok_ids = {p.point_id for p in results.ok_points()}
    g = results.groups
    g = g[g["point_id"].isin(ok_ids) & g["metric"].isin(metrics) & (g["median"] > 0)].copy()
    g["relative_half_width"] = (g["ci_high"] - g["ci_low"]) / 2 / g["median"]
    wide = g[g["relative_half_width"] > settings.spread_warning]
    return wide.sort_values("relative_half_width", ascending=False).reset_index(drop=True)


def analyse(results: ResultSet, settings: Settings) -> Decisions:
    """Compute every decision and caveat the summary reports."""
    ok_ids = [p.point_id for p in results.ok_points()]
    ar_id = ar_point_id(results)
    outcomes = [_regime_outcome(resolve_regime(results.groups, r, ok_ids), ar_id) for r in settings.regimes]
    pareto, axes = _pareto(outcomes)
    return Decisions(
        settings=settings, results=results, regimes=outcomes, priorities=_priority_picks(settings, outcomes),
        pareto=pareto, pareto_axes=axes, diagnosis=_diagnosis(results, settings), confounds=_confounds(results),
        spread=_spread(results, settings), coding=coding_stats(results), lossless=lossless_vs_ar(results),
    )


def _ci(metric: str, fig: dict[str, float] | None) -> str:
    """'160.0 tok/s (95% CI 156.8–163.2)'."""
    if not fig:
        return "n/a"
    low, high = fmt(metric, fig["ci_low"]).split(" ")[0], fmt(metric, fig["ci_high"]).split(" ")[0]
    return f"{fmt(metric, fig['median'])} (95% CI {low}–{high})"


def _x(value: float | None) -> str:
    """Format a speed-up factor."""
    return "n/a" if value is None else f"{value:.2f}×"


def _point_knobs(results: ResultSet, point_id: str) -> str:
    """The knob description of a point."""
    p = results.point(point_id)
    return p.label() if p else point_id


def _section_decision(d: Decisions) -> list[str]:
    """The recommended default per priority, with the trade-offs between the picks."""
    out = ["## Recommended default per priority", "",
           "Each priority scores every completed point as the weighted mean of its regime figures, each "
           "normalised to the best point of that regime (1.00 = best).", "",
           "| priority | weights | recommended point | knobs | score | runner-up |", "|---|---|---|---|---|---|"]
    for pick in d.priorities:
        weights = ", ".join(f"{k} {v:g}" for k, v in pick.weights.items())
        runner = f"`{pick.runner_up[0]}` ({pick.runner_up[1]:.3f})" if pick.runner_up else "—"
        if pick.point_id is None:
            out.append(f"| {pick.name} | {weights} | no point has figures for every regime | — | — | — |")
            continue
        out.append(f"| {pick.name} | {weights} | **`{pick.point_id}`** | {_point_knobs(d.results, pick.point_id)} "
                   f"| {pick.score:.3f} | {runner} |")
    out.append("")
    for pick in d.priorities:
        if pick.unknown_regimes:
            out.append(f"- `{pick.name}` names regimes that are not defined: {', '.join(pick.unknown_regimes)} "
                       "(ignored).")
        if pick.point_id is None:
            continue
        if len([w for w in pick.weights.values() if w > 0]) == 1:
            outcome = d.regime(next(r for r, w in pick.weights.items() if w > 0))
            if outcome and outcome.ties and outcome.winner == pick.point_id:
                out.append(f"- `{pick.name}`: `{pick.point_id}` is statistically tied (overlapping 95% CIs) with "
                           + ", ".join(f"`{t}`" for t in outcome.ties) + "; any of them is as good on this data.")
        if pick.runner_up and pick.score and (pick.score - pick.runner_up[1]) / pick.score < CLOSE_SCORE:
            out.append(f"- `{pick.name}`: the runner-up `{pick.runner_up[0]}` scores within "
                       f"{CLOSE_SCORE:.0%} of `{pick.point_id}`; the two are practically equivalent for this "
                       "priority, so choose between them on the trade-offs below.")
        for tradeoff in pick.tradeoffs:
            out.append(f"- `{pick.name}` → `{pick.point_id}` {tradeoff}.")
    return [*out, ""]


def _section_regimes(d: Decisions) -> list[str]:
    """The best point in each regime with its CI, speed-up over ar and ties."""
    out = ["## Best point per regime", "",
           "Figures are medians across repeats with 95% confidence intervals. Points whose interval overlaps the "
           "winner's are statistical ties, not losers.", "",
           "| regime | metric at cell | best point | figure | vs `ar` (same cell) | tied with (CI overlap) |",
           "|---|---|---|---|---|---|"]
    notes = []
    for o in d.regimes:
        r = o.resolved
        metric = r.regime.metric
        ties = ", ".join(f"`{t}` {fmt(metric, r.figure(t)['median'])}" for t in o.ties) or "none"
        winner = f"**`{o.winner}`**" if o.winner else "no data"
        figure = _ci(metric, r.figure(o.winner)) if o.winner else "n/a"
        out.append(f"| {r.regime.name} | {metric} at {r.cell()} | {winner} | {figure} | {_x(o.speedup_vs_ar)} "
                   f"| {ties} |")
        if r.note:
            notes.append(f"- {r.regime.name}: {r.note}.")
    out.append("")
    if notes:
        out += ["Cells used instead of the configured ones:", "", *notes, ""]
    if any(o.resolved.regime.lower_is_better for o in d.regimes):
        out += ["Speed-up over `ar` is `ar`'s figure divided by the point's for lower-is-better metrics.", ""]
    return out


def _section_pareto(d: Decisions) -> list[str]:
    """The latency–throughput Pareto set."""
    out = ["## Latency–throughput Pareto set", ""]
    if d.pareto_axes is None:
        return [*out, "Not computed: the regimes `latency` and `throughput` are needed and one has no data.", ""]
    lat, thr = d.regime("latency").resolved, d.regime("throughput").resolved
    out += [f"Points that no other point beats on both {lat.regime.metric} at {lat.cell()} and "
            f"{thr.regime.metric} at {thr.cell()} (medians):", "",
            "| point | knobs | latency figure | throughput figure |", "|---|---|---|---|"]
    for pid in d.pareto:
        out.append(f"| `{pid}` | {_point_knobs(d.results, pid)} | {fmt(lat.regime.metric, lat.figure(pid)['median'])} "
                   f"| {fmt(thr.regime.metric, thr.figure(pid)['median'])} |")
    return [*out, "", "Every other point is dominated: some Pareto point is at least as good on both axes.", ""]


def _section_diagnosis(d: Decisions) -> list[str]:
    """How acceptance grows with each knob (matched comparisons) and the drafter-bound verdict."""
    diag = d.diagnosis
    out = ["## Bottleneck diagnosis", "",
           f"Mean acceptance length (tokens accepted per verify step) at {diag.cell}, compared only between points "
           "that differ in one knob.", "", diag.drafter_text, ""]
    for knob in KNOBS:
        series = diag.series[knob]
        if not series:
            out.append(f"- **{knob}**: no matched comparison in this sweep.")
            continue
        gains = [s.gain for s in series]
        out.append(f"- **{knob}** ({len(series)} matched series): acceptance changes {pct(min(gains))} to "
                   f"{pct(max(gains))} from the lowest to the highest {knob}.")
        for s in series[:MAX_LIST]:
            values = " → ".join(window_label(v) if knob == "window" else str(v) for v in s.values)
            accs = " → ".join(f"{a:.2f}" for a in s.acceptance)
            steps = [s.acceptance[i + 1] / s.acceptance[i] - 1 for i in range(len(s.acceptance) - 1)]
            out.append(f"  - {knob} {values}: {accs} ({pct(s.gain)}; steps "
                       f"{', '.join(pct(x) for x in steps)}) with {s.fixed}")
        if len(series) > MAX_LIST:
            out.append(f"  - … and {len(series) - MAX_LIST} more series (see results/tables/bench_groups.csv)")
    trained = d.settings.trained_block_size
    out += ["", f"Drafter trained block size: {trained if trained else 'unknown'} "
            f"(source: {d.settings.trained_block_size_source}).", ""]
    return out


def _caveats(d: Decisions) -> list[str]:
    """Everything in the data that limits the conclusions."""
    results = d.results
    out = ["## Caveats found in the data", ""]
    if results.simulated:
        sim = [p.point_id for p in results.points if p.simulated]
        out += ["### Simulated results", "",
                f"{len(sim)} of {len(results.points)} points were produced by the simulated server "
                f"(`ddsweep sim-server`), not by real hardware: " + ", ".join(f"`{s}`" for s in sim) + ".", ""]
    out += ["### Confounded comparisons", ""]
    if not d.confounds:
        out.append("None: every pair of adjacent knob values is connected by a pair of points that differ in that "
                   "knob only.")
    for c in d.confounds:
        a, b = c.values
        alt = (f"A matched {c.knob} pair to look at instead: `{c.alternative[0]}` vs `{c.alternative[1]}`."
               if c.alternative else f"No matched {c.knob} pair exists in this sweep.")
        out.append(f"- **{c.knob} {a} vs {b} is confounded**: no two points differ in {c.knob} alone; the closest "
                   f"pair `{c.pair[0]}` vs `{c.pair[1]}` also differs in {', '.join(c.also_differs)}, so its "
                   f"difference cannot be attributed to {c.knob}. {alt} Adding the point ({c.missing}) would give "
                   "a matched comparison.")
    out += ["", "### Run-to-run spread", ""]
    threshold = d.settings.spread_warning
    if d.spread.empty:
        out.append(f"No regime figure has a 95% CI half-width above {threshold:.0%} of its median.")
    else:
        out.append(f"{len(d.spread)} figure(s) of {d.spread['point_id'].nunique()} point(s) have a 95% CI "
                   f"half-width above {threshold:.0%} of the median; rankings involving them are uncertain "
                   "(more repeats would narrow them). Widest figure per point:")
        for point_id, rows in d.spread.groupby("point_id", sort=False):
            row = rows.iloc[0]
            out.append(f"- `{point_id}`: {len(rows)} wide figure(s); widest {row['metric']} at context "
                       f"{row['context']}, C={row['concurrency']}: {fmt(row['metric'], row['median'])} "
                       f"± {row['relative_half_width']:.0%} (CI {row['ci_low']:.3g}–{row['ci_high']:.3g}, "
                       f"{row['repeats']} repeats)")
    out += ["", "### Coding check: truncation vs real failures", ""]
    if d.coding.empty:
        out.append("No coding results.")
    else:
        out += ["Answers cut off at the token limit are counted apart from real failures (wrong or broken code).",
                "", "| point | problems | passed | pass rate | truncated (hit token limit) | passed on retry "
                "| real failures | real failure kinds |", "|---|---|---|---|---|---|---|---|"]
        for row in d.coding.itertuples():
            out.append(f"| `{row.point_id}` | {row.problems} | {row.passed} | {row.pass_rate:.0%} | "
                       f"{row.truncated_failures} | {row.passed_after_retry} | {row.real_failures} | "
                       f"{row.real_failure_kinds or '—'} |")
    out += ["", "### Output mismatches vs `ar`", ""]
    if not d.lossless.available:
        out.append(f"Not compared: {d.lossless.reason}.")
    elif not d.lossless.by_point:
        out.append("Not compared: no point other than `ar` has coding outputs.")
    else:
        out.append("Greedy speculative decoding should reproduce the `ar` outputs exactly; mismatches point at a "
                   "numerical or verification difference.")
        for pid, match in sorted(d.lossless.by_point.items()):
            mismatches = match.get("mismatches") or []
            line = (f"- `{pid}`: {match.get('exact_match')}/{match.get('compared')} identical "
                    f"({(match.get('exact_match_rate') or 0):.0%})")
            if mismatches:
                line += "; differs in " + ", ".join(
                    f"{m.get('task_id')} (first difference at char {m.get('first_diff_char')}, "
                    f"token {m.get('first_diff_token')})" for m in mismatches[:MAX_LIST])
            out.append(line)
    out += ["", "### Failed, malformed and incomplete points", ""]
    bad = [p for p in results.points if p.status != "ok"]
    if not bad:
        out.append("None: every point completed.")
    for p in bad:
        kind = f" ({p.error_kind})" if p.error_kind else ""
        out.append(f"- `{p.point_id}` **{p.status}**{kind}: {p.error}"
                   + (f" — file problems: {'; '.join(p.issues)}" if p.issues else ""))
    noted = [p for p in results.points if p.status == "ok" and p.issues]
    unverified = [p for p in results.points if p.status == "ok" and p.verification_ok is False]
    if noted or unverified:
        out += ["", "### Data problems in completed points", ""]
        out += [f"- `{p.point_id}`: {'; '.join(p.issues)}" for p in noted]
        out += [f"- `{p.point_id}`: verification.json reports a knob the server did not apply" for p in unverified]
    return [*out, ""]


def _section_platform(d: Decisions) -> list[str]:
    """GPU model and count, interconnect, engine version and commit, and whether points agree."""
    out = ["## Platform", ""]
    combos: dict[tuple, list[str]] = {}
    for p in d.results.points:
        env = p.environment
        if not env:
            continue
        gpus = env.get("gpus") if isinstance(env.get("gpus"), list) else []
        engine = env.get("engine") if isinstance(env.get("engine"), dict) else {}
        key = (gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None, env.get("gpu_count"),
               env.get("interconnect"), f"{engine.get('name', '?')} {engine.get('version', '?')}",
               env.get("git_commit"), env.get("git_dirty"))
        combos.setdefault(key, []).append(p.point_id)
    if not combos:
        return [*out, "No environment.json was readable: the platform is unknown.", ""]
    out += ["| GPU | count | interconnect | engine | ddsweep commit | points |", "|---|---|---|---|---|---|"]
    for (gpu, count, link, engine, commit, dirty), pids in combos.items():
        commit_text = f"{commit}{' (dirty)' if dirty else ''}"
        out.append(f"| {gpu or 'unknown'} | {count if count is not None else 'unknown'} | {link or 'unknown'} "
                   f"| {engine} | {commit_text} | {len(pids)} |")
    out.append("")
    if len(combos) > 1:
        out.append("**The points do not share one platform**; comparisons across these groups mix hardware or "
                   "software differences with the knobs:")
        out += [f"- {key[0]} ×{key[1]}, {key[2] or 'unknown interconnect'}, {key[3]}, commit {key[4]}: "
                + ", ".join(f"`{p}`" for p in pids) for key, pids in combos.items()]
        out.append("")
    topology = next((p.environment.get("topology") for p in d.results.points
                     if isinstance(p.environment.get("topology"), str) and p.environment.get("topology")), None)
    if topology:
        out += ["Interconnect topology (`nvidia-smi topo -m`, first point that recorded it):", "", "```",
                topology.rstrip(), "```", ""]
    out.append("These results transfer only to the same platform: another GPU model, GPU count or interconnect "
               "(for example NVLink instead of PCIe) can rank the configurations differently.")
    return [*out, ""]


def _section_reproduce(d: Decisions) -> list[str]:
    """The exact command and config."""
    s = d.settings
    out = ["## How to reproduce", "", "```sh", s.reproduce_command, "```", ""]
    if s.config:
        where = f" (`{s.config_path}`)" if s.config_path else ""
        out += [f"Study config used{where}:", "", "```yaml",
                yaml.safe_dump(s.config, sort_keys=False).rstrip(), "```"]
    else:
        out.append("No study config was given to `ddsweep summarize`; defaults were used for the analysis.")
    return [*out, ""]


def _section_all_points(d: Decisions) -> list[str]:
    """Every completed point at every regime cell, so the summary alone supports the decision."""
    ar_id = ar_point_id(d.results)
    header = "| point | knobs | " + " | ".join(f"{o.resolved.regime.name} (vs ar)" for o in d.regimes)
    out = ["## All completed points at the regime cells", "", header + " | coding pass rate |",
           "|---|---|" + "---|" * (len(d.regimes) + 1)]
    coding = d.coding.set_index("point_id") if not d.coding.empty else None
    for p in d.results.ok_points():
        cells = []
        for o in d.regimes:
            r = o.resolved
            fig = r.figure(p.point_id)
            ref = r.figure(ar_id) if ar_id else None
            speed = ratio_vs(fig["median"], ref["median"], r.regime.lower_is_better) if fig and ref else None
            cells.append(_ci(r.regime.metric, fig) + (f" ({_x(speed)})" if speed else ""))
        rate = (f"{coding.at[p.point_id, 'pass_rate']:.0%}" if coding is not None and p.point_id in coding.index
                else "n/a")
        out.append(f"| `{p.point_id}` | {p.label()} | " + " | ".join(cells) + f" | {rate} |")
    return [*out, ""]


def render_markdown(d: Decisions) -> str:
    """Render the optimization summary as Markdown."""
    results = d.results
    out = [f"# Optimization summary: {d.settings.study}", ""]
    if results.simulated:
        out += ["> **SIMULATED RESULTS.** Some or all figures below come from the simulated server, not from "
                "real hardware. Do not use them to choose a production configuration.", ""]
    counts: dict[str, int] = {}
    for p in results.points:
        counts[p.status] = counts.get(p.status, 0) + 1
    out += [f"{len(results.points)} sweep points in `{results.results_dir}`: "
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ". Metrics: "
            + "; ".join(f"`{m}` = {label}" for m, label in METRIC_LABELS.items()
                        if any(o.resolved.regime.metric == m for o in d.regimes)) + ".", ""]
    for section in (_section_decision, _section_regimes, _section_pareto, _section_diagnosis, _caveats,
                    _section_platform, _section_reproduce, _section_all_points):
        out += section(d)
    return "\n".join(out).rstrip() + "\n"
