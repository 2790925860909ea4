"""Decide from the data which configuration to run: regime winners and tied sets, priority picks (with
service-level limits), the Pareto set, the acceptance diagnosis and the data caveats.

:func:`analyse` turns a :class:`~ddsweep.analysis.results.ResultSet` and the study settings into
:class:`Decisions`. Every decision is a comparison on matched cells (``statistics``): a point wins only when
it beats every other beyond the equivalence margin with the family-wise error controlled (Holm); otherwise
the points it could not be separated from are named as tied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from ddsweep.analysis.coding_outcomes import LosslessResult, coding_stats, lossless_vs_ar
from ddsweep.analysis.diagnosis import Confound, Diagnosis, confounds, diagnose
from ddsweep.analysis.drift import ReferenceRuns
from ddsweep.analysis.launch_model import launch_difference, point_estimates, pooled_variances
from ddsweep.analysis.regimes import ResolvedRegime, resolve_regime
from ddsweep.analysis.results import ResultSet, ar_point_id
from ddsweep.analysis.settings import DEFAULT_REGIMES, Priority, Settings
from ddsweep.analysis.statistics import Estimate, combined_difference, holm, holm_levels, mean_interval
from ddsweep.analysis.ties import cheapest_unbeaten
from ddsweep.formatting import interval_meaningful, no_interval

# Limits a priority's `slo` may carry: the per-repeat cell column and the per-request field each bounds.
SLO_LIMITS: dict[str, str] = {
    "ttft_p50_s": "ttft_s", "ttft_p90_s": "ttft_s", "ttft_p99_s": "ttft_s",
    "tpot_p50_s": "tpot_s", "tpot_p90_s": "tpot_s", "tpot_p99_s": "tpot_s",
    "e2e_p50_s": "e2e_s", "e2e_p99_s": "e2e_s",
}


@dataclass
class Comparison:
    """The leader against one other point: ratio (> 1: leader better) and whether it is better beyond the
    margin with family-wise error control. The ratio's interval is two-sided at 1 - 2·(the Holm level of its
    one-sided test), so that its lower bound clears 1 + margin exactly when the test rejects."""

    point_id: str
    ratio: Estimate | None
    p_value: float
    beaten: bool


@dataclass
class RegimeOutcome:
    """The leading point of one regime, whether it is a decided winner, the tied set, and its speed-up."""

    resolved: ResolvedRegime
    leader: str | None
    winner: str | None
    tied: list[str]
    comparisons: list[Comparison]
    speedup_vs_ar: Estimate | None
    no_decision: str | None = None
    recommended: str | None = None  # the winner, else the cheapest of the tied set (ddsweep.analysis.ties)


@dataclass
class SloCheck:
    """One point against one limit: the per-repeat figure's mean and interval, and meets/fails/uncertain."""

    limit: str
    bound: float
    estimate: Estimate
    status: str


@dataclass
class PriorityPick:
    """The recommended point for one declared priority, the points tied with it, and its trade-offs."""

    priority: Priority
    point_id: str | None
    decided: bool
    score: float | None
    tied: list[str]
    runner_up: str | None
    runner_up_ratio: Estimate | None
    scores: dict[str, float]
    unknown_regimes: list[str]
    no_decision: str | None = None
    slo_cell: tuple[int, int] | None = None
    slo: dict[str, list[SloCheck]] = field(default_factory=dict)
    goodput: dict[str, dict[str, Estimate]] = field(default_factory=dict)
    tradeoffs: list[str] = field(default_factory=list)
    recommended: str | None = None  # the leader, or the cheapest of the tied set (ddsweep.analysis.ties)

    @property
    def name(self) -> str:
        """The priority's name."""
        return self.priority.name

    @property
    def weights(self) -> dict[str, float]:
        """The priority's regime weights."""
        return self.priority.weights


@dataclass
class Decisions:
    """Everything the summary reports, computed from the data."""

    settings: Settings
    results: ResultSet
    regimes: list[RegimeOutcome]
    priorities: list[PriorityPick]
    pareto: list[str]
    pareto_axes: tuple[str, str] | None
    dominated: dict[str, str]
    diagnosis: Diagnosis
    confounds: list[Confound]
    spread: pd.DataFrame
    coding: pd.DataFrame
    lossless: LosslessResult
    # the scheduled reference runs (sweep.reference): reported as a caveat only, never part of a decision
    reference: ReferenceRuns | None = None

    def regime(self, name: str) -> RegimeOutcome | None:
        """Return the outcome of the regime called `name`."""
        return next((r for r in self.regimes if r.resolved.regime.name == name), None)

    def priority(self, name: str) -> PriorityPick | None:
        """Return the pick of the priority called `name`."""
        return next((p for p in self.priorities if p.name == name), None)


def _too_few(resolved: ResolvedRegime, ids: list[str], minimum: int) -> str | None:
    """The no-decision reason when any of `ids` has fewer repeats than `minimum` at the regime's cell."""
    few = {pid: len(resolved.repeats.get(pid, {})) for pid in ids if len(resolved.repeats.get(pid, {})) < minimum}
    if not few:
        return None
    listed = ", ".join(f"`{pid}` {n}" for pid, n in sorted(few.items()))
    return (f"no decision possible: fewer than {minimum} repeats (analysis.min_repeats_for_decision) for "
            f"{listed}")


def regime_outcome(resolved: ResolvedRegime, ar_id: str | None, s: Settings, results: ResultSet) -> RegimeOutcome:
    """Lead by the best mean; win only if Holm-corrected one-sided tests show the leader better than every
    other point by more than the margin; the points not shown worse are the tied set, of which the cheapest
    is recommended."""
    ids = [str(pid) for pid in resolved.table["point_id"]]
    if not ids:
        return RegimeOutcome(resolved, None, None, [], [], None, "no data at this cell")
    leader = ids[0]
    comparisons, p_values, diffs = [], {}, {}
    for pid in ids[1:]:
        diffs[pid] = resolved.difference(leader, pid)
        p_values[pid] = diffs[pid].p_greater(1 + s.equivalence_margin) if diffs[pid] else 1.0
    beaten = holm(p_values, 1 - s.confidence)
    levels = holm_levels(p_values, 1 - s.confidence)
    for pid in ids[1:]:
        diff = diffs[pid]
        comparisons.append(Comparison(pid, diff.ratio(1 - 2 * levels[pid]) if diff else None, p_values[pid],
                                      beaten[pid]))
    tied = [c.point_id for c in comparisons if not c.beaten]
    reason = _too_few(resolved, ids, s.min_repeats)
    winner = leader if not tied and reason is None else None
    speedup = resolved.speedup(leader, ar_id, s.confidence) if ar_id and ar_id != leader else None
    alpha = 1 - s.confidence

    def beats(a: str, b: str) -> bool:
        diff = resolved.difference(a, b)
        return bool(diff) and diff.p_greater(1 + s.equivalence_margin) < alpha

    recommended = cheapest_unbeaten(results, [leader, *tied], beats) if tied else leader
    return RegimeOutcome(resolved, leader, winner, tied, comparisons, speedup, reason, recommended)


def _parts(by_name: dict[str, ResolvedRegime], weights: dict[str, float], a: str, b: str) -> list[tuple]:
    """(weight, better-direction repeats of a, of b) per weighted regime, for a combined comparison."""
    parts = []
    for regime_name, w in weights.items():
        r = by_name[regime_name]
        ra, rb = r.units(a), r.units(b)
        parts.append((w, rb, ra) if r.regime.lower_is_better else (w, ra, rb))
    return parts


def combined_launches(by_name: dict[str, ResolvedRegime], weights: dict[str, float], candidates: list[str]):
    """When every candidate ran in two or more launches at every weighted regime: a function comparing two of
    them on the weighted log figures per launch, with the launch variance pooled over the candidates
    (launch_model); else None (the comparison is then paired per repeat)."""
    total = sum(weights.values())
    figures: dict[str, dict[int, float]] = {}
    for pid in candidates:
        per_regime = []
        for name, w in weights.items():
            launches = by_name[name].launches.get(pid) or {}
            if len(launches) < 2:
                return None
            sign = -1.0 if by_name[name].regime.lower_is_better else 1.0
            per_regime.append({k: w / total * sign * v for k, v in launches.items()})
        shared = set.intersection(*(set(f) for f in per_regime))
        figures[pid] = {k: sum(f[k] for f in per_regime) for k in shared}
    _, _, v2, df2 = pooled_variances(figures)
    return lambda a, b: launch_difference(figures[a], figures[b], v2, df2)


def _scores(by_name: dict[str, ResolvedRegime], used: dict[str, float], candidates: list[str]) -> dict[str, float]:
    """Weighted geometric mean of each candidate's regime means relative to the best (1.0 = best everywhere)."""
    total = sum(used.values())
    logs: dict[str, float] = dict.fromkeys(candidates, 0.0)
    for regime_name, w in used.items():
        r = by_name[regime_name]
        means = {pid: r.figure(pid)["mean"] for pid in candidates}
        sign = -1.0 if r.regime.lower_is_better else 1.0
        best = max(sign * math.log(v) for v in means.values())
        for pid, v in means.items():
            logs[pid] += w / total * (sign * math.log(v) - best)
    return {pid: math.exp(v) for pid, v in logs.items()}


def _slo_checks(results: ResultSet, priority: Priority, cell: tuple[int, int], ids: list[str],
                level: float) -> dict[str, list[SloCheck]]:
    """Each point against each limit at `cell`: meets (upper bound within), fails (lower bound above) or
    uncertain; the interval from the point's launches where it ran in two or more."""
    cells = results.cells
    at = cells[(cells["context"] == cell[0]) & (cells["concurrency"] == cell[1])]
    estimates = {limit: point_estimates(at, limit, level) for limit in priority.slo}
    out: dict[str, list[SloCheck]] = {}
    for pid in ids:
        checks = []
        for limit, bound in priority.slo.items():
            est = estimates[limit].get(pid) or mean_interval([], level)
            if est.has_interval and est.high <= bound:
                status = "meets"
            elif est.has_interval and est.low > bound:
                status = "fails"
            else:
                status = "uncertain"
            checks.append(SloCheck(limit, bound, est, status))
        out[pid] = checks
    return out


def _goodput(results: ResultSet, priority: Priority, cell: tuple[int, int], ids: list[str],
             level: float) -> dict[str, dict[str, Estimate]]:
    """Per point: completed requests/s and goodput (requests/s whose own latencies meet every limit), with
    intervals from the point's launches where it ran in two or more."""
    cells, requests = results.cells, results.requests
    at = cells[(cells["context"] == cell[0]) & (cells["concurrency"] == cell[1])]
    req = requests[(requests["context"] == cell[0]) & (requests["concurrency"] == cell[1])]
    rates = point_estimates(at, "requests_per_s", level)
    goodput_rows, with_requests = [], set()
    for pid in ids:
        rows, mine = at[at["point_id"] == pid], req[req["point_id"] == pid]
        if mine.empty:
            continue
        with_requests.add(pid)
        good = mine["ok"].astype(bool)
        for limit, bound in priority.slo.items():
            column = mine[SLO_LIMITS[limit]]
            good &= column.notna() & (column.astype(float) <= bound)
        launches = rows["launch"] if "launch" in rows.columns else [None] * len(rows)
        for rep, launch, wall in zip(rows["repeat"], launches, rows["wall_s"], strict=True):
            if pd.notna(wall) and wall > 0:
                goodput_rows.append({"point_id": pid, "context": cell[0], "concurrency": cell[1], "launch": launch,
                                     "goodput": float(good[mine["repeat"] == rep].sum()) / float(wall)})
    goodputs = point_estimates(pd.DataFrame(goodput_rows, columns=["point_id", "context", "concurrency", "launch",
                                                                   "goodput"]), "goodput", level)
    out = {}
    for pid in ids:
        entry = {"requests_per_s": rates.get(pid) or mean_interval([], level)}
        if pid in with_requests:
            entry["goodput_requests_per_s"] = goodputs.get(pid) or mean_interval([], level)
        out[pid] = entry
    return out


def _priority_pick(priority: Priority, by_name: dict[str, ResolvedRegime], results: ResultSet,
                   s: Settings) -> PriorityPick:
    """The best-scoring point among those meeting every limit with confidence; tied set by Holm."""
    unknown = [r for r in priority.weights if r not in by_name]
    used = {r: w for r, w in priority.weights.items() if r in by_name and w > 0}
    ids = [p.point_id for p in results.ok_points()]
    candidates = [pid for pid in ids if used and all(by_name[r].figure(pid) and by_name[r].figure(pid)["mean"] > 0
                                                     for r in used)]
    pick = PriorityPick(priority, None, False, None, [], None, None, {}, unknown)
    if priority.slo:
        first = by_name[next(iter(used))] if used else None
        pick.slo_cell = priority.slo_cell or ((first.context, first.concurrency) if first and first.context else None)
        if pick.slo_cell:
            pick.slo = _slo_checks(results, priority, pick.slo_cell, ids, s.confidence)
            pick.goodput = _goodput(results, priority, pick.slo_cell, ids, s.confidence)
            candidates = [pid for pid in candidates if all(c.status == "meets" for c in pick.slo[pid])]
    if not candidates:
        pick.no_decision = ("no point meets every limit with confidence" if priority.slo
                            else "no point has figures for every weighted regime")
        return pick
    pick.scores = _scores(by_name, used, candidates)
    ranked = sorted(candidates, key=lambda pid: (-pick.scores[pid], pid))
    leader = ranked[0]
    p_values, diffs = {}, {}
    combined = combined_launches(by_name, used, candidates)
    for pid in ranked[1:]:
        diffs[pid] = (combined(leader, pid) if combined else None) or combined_difference(
            _parts(by_name, used, leader, pid))
        p_values[pid] = diffs[pid].p_greater(1 + s.equivalence_margin) if diffs[pid] else 1.0
    beaten = holm(p_values, 1 - s.confidence)
    pick.point_id, pick.score = leader, pick.scores[leader]
    pick.tied = [pid for pid in ranked[1:] if not beaten[pid]]
    reasons = [r for r in (_too_few(by_name[name], candidates, s.min_repeats) for name in used) if r]
    pick.no_decision = reasons[0] if reasons else None
    pick.decided = not pick.tied and pick.no_decision is None
    def beats(a: str, b: str) -> bool:
        diff = (combined(a, b) if combined else None) or combined_difference(_parts(by_name, used, a, b))
        return bool(diff) and diff.p_greater(1 + s.equivalence_margin) < 1 - s.confidence

    pick.recommended = cheapest_unbeaten(results, [leader, *pick.tied], beats) if pick.tied else leader
    if len(ranked) > 1:
        pick.runner_up = ranked[1]
        diff = diffs[ranked[1]]
        # at the two-sided level matching the one-sided Holm test the runner-up faced
        level = 1 - 2 * holm_levels(p_values, 1 - s.confidence)[ranked[1]]
        pick.runner_up_ratio = diff.ratio(level) if diff else None
    return pick


def _tradeoffs(picks: list[PriorityPick], by_name: dict[str, ResolvedRegime], s: Settings) -> None:
    """Describe, for each recommended point, how it compares in numbers with the other priorities' ones."""
    for pick in picks:
        if pick.recommended is None:
            continue
        others: dict[str, list[PriorityPick]] = {}
        for other in picks:
            if other is not pick and other.recommended is not None:
                others.setdefault(other.recommended, []).append(other)
        for other_id, group in others.items():
            names = " and ".join(f"`{o.name}`" for o in group)
            if other_id == pick.recommended:
                pick.tradeoffs.append(f"is also the {names} pick")
                continue
            regime_names = [r for r in dict.fromkeys([*pick.weights, *(r for o in group for r in o.weights)])
                            if r in by_name]
            changes = []
            for regime_name in regime_names:
                r = by_name[regime_name]
                ratio = r.speedup(pick.recommended, other_id, s.confidence)
                if ratio is not None:
                    changes.append(f"{ratio_text(ratio)} on {regime_name} ({r.regime.metric} at {r.cell()})")
            if changes:
                pick.tradeoffs.append(f"vs `{other_id}` (the {names} pick): " + "; ".join(changes))


def ratio_text(est: Estimate) -> str:
    """'1.42× (95% CI 1.37–1.47)' for a ratio estimate (> 1: better)."""
    if not interval_meaningful(est.value, est.low if est.has_interval else None, est.high, est.n, est.df):
        return f"{est.value:.2f}× ({no_interval(est.n)})"
    return f"{est.value:.2f}× ({est.level:.0%} CI {est.low:.2f}–{est.high:.2f})"


def _pareto(by_name: dict[str, ResolvedRegime], ids: list[str], s: Settings
            ) -> tuple[list[str], tuple[str, str] | None, dict[str, str]]:
    """Points not dominated with confidence on (latency, throughput): a point is dominated when another is
    not worse beyond the margin on both axes and better on one, each with its interval excluding the
    alternative. Returns the set, the axes and, per dominated point, one point dominating it."""
    lat, thr = by_name.get("latency"), by_name.get("throughput")
    if lat is None or thr is None or lat.table.empty or thr.table.empty:
        return [], None, {}
    both = [pid for pid in ids if lat.figure(pid) and thr.figure(pid)]
    floor = 1 / (1 + s.equivalence_margin)
    dominated: dict[str, str] = {}
    for j in both:
        for i in both:
            if i == j:
                continue
            ratios = [r.speedup(i, j, s.confidence) for r in (lat, thr)]
            if any(x is None or not x.has_interval for x in ratios):
                continue
            if all(x.low > floor for x in ratios) and any(x.low > 1 for x in ratios):
                dominated[j] = i
                break
    front = [pid for pid in both if pid not in dominated]
    front.sort(key=lambda pid: -lat.figure(pid)["mean"] * (-1 if lat.regime.lower_is_better else 1))
    return front, ("latency", "throughput"), dominated


def _spread(results: ResultSet, settings: Settings) -> pd.DataFrame:
    """Groups of completed points whose CI half-width exceeds the spread warning, widest first."""
    metrics = {r.metric for r in settings.regimes}
    ok_ids = {p.point_id for p in results.ok_points()}
    g = results.groups
    g = g[g["point_id"].isin(ok_ids) & g["metric"].isin(metrics) & (g["mean"] > 0) & g["ci_low"].notna()].copy()
    g["relative_half_width"] = (g["ci_high"] - g["ci_low"]) / 2 / g["mean"]
    wide = g[g["relative_half_width"] > settings.spread_warning]
    return wide.sort_values("relative_half_width", ascending=False).reset_index(drop=True)


def analyse(results: ResultSet, settings: Settings) -> Decisions:
    """Compute every decision and caveat the summary reports."""
    ok_ids = [p.point_id for p in results.ok_points()]
    ar_id = ar_point_id(results)
    resolved = [resolve_regime(results, r, ok_ids) for r in settings.regimes]
    outcomes = [regime_outcome(r, ar_id, settings, results) for r in resolved]
    by_name = {r.regime.name: r for r in resolved}
    picks = [_priority_pick(p, by_name, results, settings) for p in settings.priorities]
    _tradeoffs(picks, by_name, settings)
    pareto, axes, dominated = _pareto(by_name, ok_ids, settings)
    return Decisions(
        settings=settings, results=results, regimes=outcomes, priorities=picks, pareto=pareto, pareto_axes=axes,
        dominated=dominated, diagnosis=diagnose(results, settings, DEFAULT_REGIMES[3]),
        confounds=confounds(results), spread=_spread(results, settings), coding=coding_stats(results),
        lossless=lossless_vs_ar(results),
    )
