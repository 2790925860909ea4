"""The first screen of the summary, decided: per declared priority the point to deploy (the winner, or the
cheapest member of the tied set), its gain over `ar` and over the best DFlash chain with intervals, what it
gives up in the other regimes, whether the decision is firm or tied, its exact launch command; then the caveats
that would change the decision and the failures grouped by cause (`decision` in the decision object)."""

from __future__ import annotations

from typing import Any

from ddsweep.analysis.causes import TIME_BUDGET, failure_of, overview
from ddsweep.analysis.decisions import Decisions, PriorityPick
from ddsweep.analysis.regimes import ResolvedRegime
from ddsweep.analysis.results import ar_point_id
from ddsweep.analysis.ties import RULE, point_cost
from ddsweep.findings.launch import launch_of
from ddsweep.findings.quality import quality_caveats
from ddsweep.findings.sections import estimate_json

CHAIN_KIND = "dflash"
MAX_CAVEATS = 2


def best_chain(resolved: ResolvedRegime, d: Decisions) -> str | None:
    """The DFlash chain point with the best figure in a regime (its table is sorted best first)."""
    for pid in resolved.table["point_id"]:
        record = d.results.point(str(pid))
        if record is not None and record.kind == CHAIN_KIND:
            return str(pid)
    return None


def _status(pick: PriorityPick) -> str:
    """firm (a decided winner), tied (others cannot be separated from it), undecided (too few repeats), none."""
    if pick.point_id is None:
        return "none"
    if pick.decided:
        return "firm"
    return "tied" if pick.tied else "undecided"


def _gains(d: Decisions, pick: PriorityPick, point_id: str) -> list[dict[str, Any]]:
    """The recommended point in each regime its priority weighs: figure, ratio over `ar` and over the best
    DFlash chain (> 1: the recommended point is better)."""
    ar_id = ar_point_id(d.results)
    level = d.settings.confidence
    out = []
    for name, weight in pick.weights.items():
        outcome = d.regime(name)
        if outcome is None or weight <= 0:
            continue
        r = outcome.resolved
        chain = best_chain(r, d)
        fig = r.figure(point_id)
        out.append({
            "regime": name, "weight": weight, "metric": r.regime.metric, "cell_text": r.cell(),
            "figure": ({"value": fig["mean"], "ci_low": fig["ci_low"], "ci_high": fig["ci_high"],
                        "n": fig["repeats"], "level": level} if fig else None),
            "vs_ar": estimate_json(r.speedup(point_id, ar_id, level)) if ar_id and ar_id != point_id else None,
            "chain": chain,
            "vs_chain": estimate_json(r.speedup(point_id, chain, level)) if chain and chain != point_id else None})
    return out


def _gives_up(d: Decisions, pick: PriorityPick, point_id: str) -> list[dict[str, Any]]:
    """In each regime the priority does not weigh: the recommended point against that regime's leader, unless
    it is the leader or tied with it (then it gives up nothing there)."""
    out = []
    for outcome in d.regimes:
        name = outcome.resolved.regime.name
        if pick.weights.get(name, 0) > 0 or outcome.leader is None:
            continue
        best = point_id == outcome.leader or point_id in outcome.tied
        ratio = None if best else outcome.resolved.speedup(point_id, outcome.leader, d.settings.confidence)
        out.append({"regime": name, "best": outcome.leader, "is_best": best, "ratio": estimate_json(ratio)})
    return out


def recommend(d: Decisions, pick: PriorityPick) -> dict[str, Any]:
    """One priority's decision as JSON: status, tied set, the recommended member and why, gains, losses and
    the launch command."""
    status = _status(pick)
    members = [pick.point_id, *pick.tied] if pick.point_id else []
    recommended = pick.recommended
    entry: dict[str, Any] = {"priority": pick.name, "weights": pick.weights, "status": status,
                             "leader": pick.point_id, "tied_set": members if status == "tied" else [],
                             "recommended": recommended, "no_decision": pick.no_decision,
                             "rule": RULE if status == "tied" else None}
    if recommended is None:
        return entry
    cost = point_cost(d.results, recommended)
    record = d.results.point(recommended)
    entry.update({
        "label": record.label() if record else recommended, "kind": record.kind if record else None,
        "preset": record.preset if record else None, "knobs": record.knobs() if record else {},
        "cost": {"verify_width": cost.verify_width, "block_size": cost.block_size, "source": cost.source},
        "gains": _gains(d, pick, recommended), "gives_up": _gives_up(d, pick, recommended),
        "launch": launch_of(d.results.results_dir, recommended)})
    return entry


def _caveats(d: Decisions, picks: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The caveats that would change the decision, most decisive first; the first MAX_CAVEATS are shown."""
    results = d.results
    chosen = {p["recommended"] for p in picks if p["recommended"]}
    out: list[dict[str, str]] = []
    if results.simulated:
        out.append({"kind": "simulated", "text": "**SIMULATED data** (stand-in server): these picks say nothing "
                    "about real hardware; run the study on the target machine before deploying."})
    bad = [p for p in results.points if p.shown_status != "ok"]
    if bad:
        names = ", ".join(f"`{p.point_id}` ({'not started' if p.error_kind == TIME_BUDGET else p.shown_status})"
                          for p in bad[:4]) + (" …" if len(bad) > 4 else "")
        out.append({"kind": "failed_points", "text": (
            f"{len(bad)} of {len(results.points)} points did not complete or lost cells ({names}): a point "
            "missing from a regime could have been the best there; see *Failed, malformed and incomplete points*.")})
    out += quality_caveats(d, picks)
    unverified = sorted({(str(e.get("knob")), p.point_id) for p in results.points if p.point_id in chosen
                         for e in p.unverified})
    if unverified:
        knobs = sorted({k for k, _ in unverified})
        out.append({"kind": "unverified_knobs", "text": (
            f"{', '.join(knobs)} of the recommended point(s) "
            + ", ".join(sorted({f'`{pid}`' for _, pid in unverified}))
            + " reached the server but no check confirmed it was applied: if the engine ignored it, points that "
            "differ only there are one configuration.")})
    undecided = [p["priority"] for p in picks if p["status"] == "undecided"]
    if undecided:
        out.append({"kind": "no_decision", "text": (
            ", ".join(f"`{n}`" for n in undecided) + ": " + (next(p["no_decision"] for p in picks
                                                                   if p["status"] == "undecided") or "")
            + "; the pick only leads.")})
    return out


def failures_block(d: Decisions) -> dict[str, Any]:
    """The points that did not complete, grouped by cause (ddsweep.analysis.causes.overview)."""
    points = d.results.points
    return overview(len(points), sum(p.status == "ok" for p in points),
                    [failure_of(p) for p in points if p.status != "ok"])


def decision_block(d: Decisions, load: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `decision` object of summary.json: one entry per priority, the caveats that would change it, the
    load schedule when the best point changes with concurrency, and the failures grouped by cause."""
    picks = [recommend(d, p) for p in d.priorities]
    caveats = _caveats(d, picks)
    return {"priorities": picks, "caveats": caveats[:MAX_CAVEATS], "more_caveats": max(0, len(caveats) - MAX_CAVEATS),
            "schedule": load.get("schedule") if load and load.get("changes") else None,
            "schedule_context": load.get("context") if load else None, "failures": failures_block(d)}
