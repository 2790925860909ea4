"""The first screen of the summary: the decision. Per declared priority the point to deploy (the winner, or the
cheapest member of the tied set), its gain over `ar` and over the best DFlash chain with intervals, what it
gives up in the other regimes, whether the decision is firm or tied, its exact launch command; then the one or
two caveats that would change the decision. Built as a summary-document block (`decision` in summary.json)
and rendered from it."""

from __future__ import annotations

from typing import Any

from ddsweep.analysis.causes import failure_of, overview
from ddsweep.analysis.decisions import Decisions, PriorityPick
from ddsweep.analysis.regimes import ResolvedRegime
from ddsweep.analysis.results import ar_point_id
from ddsweep.analysis.statistics import Estimate
from ddsweep.analysis.text import interval_meaningful, no_interval
from ddsweep.analysis.ties import RULE, point_cost
from ddsweep.report.launch import launch_of
from ddsweep.report.quality import quality_caveats

CHAIN_KIND = "dflash"
MAX_CAVEATS = 2


def _ratio(est: Estimate | None) -> dict[str, Any] | None:
    return est.as_dict() if est is not None else None


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
            "vs_ar": _ratio(r.speedup(point_id, ar_id, level)) if ar_id and ar_id != point_id else None,
            "chain": chain,
            "vs_chain": _ratio(r.speedup(point_id, chain, level)) if chain and chain != point_id else None})
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
        out.append({"regime": name, "best": outcome.leader, "is_best": best, "ratio": _ratio(ratio)})
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
        names = ", ".join(f"`{p.point_id}` ({p.shown_status})" for p in bad[:4]) + (" …" if len(bad) > 4 else "")
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


def render_failures(failures: dict[str, Any]) -> list[str]:
    """What went wrong, before the decision, when the study measured nothing or lost more than half its points."""
    title = "Nothing was measured" if failures["measured"] == 0 else "More than half of the points were lost"
    return [f"## {title}", "", failures["headline"], "", *(f"- {g['text']}" for g in failures["groups"]), "",
            *(f"Next: {advice}" for advice in failures["next"]), ""]


def ratio_dict_text(est: dict[str, Any] | None) -> str:
    """'2.41× (95% CI 2.30–2.52)'; without an interval that means something (analysis/text.py), 'n = 2; more
    repeats or launches are needed for an interval'."""
    if not est or est.get("value") is None:
        return "n/a"
    if not interval_meaningful(est["value"], est.get("ci_low"), est.get("ci_high"), est.get("n")):
        return f"{est['value']:.2f}× ({no_interval(est.get('n'))})"
    return f"{est['value']:.2f}× ({est['level'] * 100:.3g}% CI {est['ci_low']:.2f}–{est['ci_high']:.2f})"


def render_decision(block: dict[str, Any]) -> list[str]:
    """The first section of the Markdown summary, from the `decision` object; what went wrong before it when the
    study measured nothing or lost more than half its points."""
    failures = block.get("failures") or {}
    out = render_failures(failures) if failures.get("alarm") else []
    out += ["## Decision", "",
           "What to deploy per declared priority; ratios are the recommended point's figure over the other's at each "
           "regime's cell (> 1: better), with intervals. Reference sections follow.", "",
           "| priority | deploy | decision | over `ar` | over the best DFlash chain | gives up |",
           "|---|---|---|---|---|---|"]
    notes: list[str] = []
    for p in block["priorities"]:
        if p["recommended"] is None:
            out.append(f"| {p['priority']} | none: {p['no_decision']} | — | — | — | — |")
            continue
        over_ar = "; ".join(f"{g['regime']} {ratio_dict_text(g['vs_ar'])}" for g in p["gains"]
                            if g["vs_ar"]) or ("— (is `ar`)" if p["kind"] == "ar" else "no `ar` measured")
        over_chain = "; ".join(f"{g['regime']} {ratio_dict_text(g['vs_chain'])} vs `{g['chain']}`" for g in p["gains"]
                               if g["vs_chain"]) or ("— (is the chain)" if any(g["chain"] for g in p["gains"])
                                                     else "no DFlash chain measured")
        gives = "; ".join(f"{g['regime']} {ratio_dict_text(g['ratio'])} of `{g['best']}`" for g in p["gives_up"]
                          if not g["is_best"]) or "nothing: best or tied for best in every other regime"
        status = {"firm": "firm", "tied": f"tie of {len(p['tied_set'])}", "undecided": "leads only"}[p["status"]]
        out.append(f"| {p['priority']} | **`{p['recommended']}`** | {status} | {over_ar} | {over_chain} | {gives} |")
        if p["status"] == "tied":
            others = ", ".join(f"`{t}`" for t in p["tied_set"] if t != p["recommended"])
            notes.append(f"- `{p['priority']}`: a tie; recommended `{p['recommended']}`, {p['rule']} "
                         f"({p['cost']['verify_width']} verify slots, block size {p['cost']['block_size']}); "
                         f"equivalent on this data: {others}.")
    out += ["", *notes]
    if block.get("schedule"):
        out.append("- Under load the best point changes (context " + str(block["schedule_context"]) + "): " + "; ".join(
            f"C {a}–{b} `{pid}`" if a != b else f"C {a} `{pid}`" for a, b, pid in block["schedule"])
            + " (*Best configuration per load level*).")
    if block["caveats"]:
        out += ["", "Would change this decision:", ""]
        out += [f"- {c['text']}" for c in block["caveats"]]
        if block["more_caveats"]:
            out.append(f"- … and {block['more_caveats']} more: *Caveats found in the data*.")
    launches: dict[str, list[str]] = {}
    for p in block["priorities"]:
        if p["recommended"] and p.get("launch"):
            launches.setdefault(p["recommended"], []).append(p["priority"])
    if launches:
        out += ["", "Launch commands (the server's default port; `launch` in summary.json):", "", "```sh"]
        for pid, names in launches.items():
            launch = next(p["launch"] for p in block["priorities"] if p["recommended"] == pid)
            out += [f"# {pid}: {', '.join(names)}", launch["shell"]]
        out.append("```")
    return [*out, ""]
