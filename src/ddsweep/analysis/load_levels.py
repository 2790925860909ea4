"""The best configuration per load level: at each measured concurrency of the primary context, the point with
the highest aggregate output throughput (the winner, or the tied set and its cheapest member), and the
concurrency schedule `[from, to, point]` when the best point changes with load (the form of engines with
per-batch-size speculative settings, such as vLLM's `num_speculative_tokens_per_batch_size`)."""

from __future__ import annotations

from typing import Any

from ddsweep.analysis.decisions import Decisions, ratio_text, regime_outcome
from ddsweep.analysis.regimes import resolve_regime
from ddsweep.analysis.results import ResultSet, ar_point_id
from ddsweep.analysis.settings import Regime
from ddsweep.analysis.ties import RULE, cheapest
from ddsweep.formatting import interval_meaningful, no_interval

METRIC = "output_throughput_tok_s"


def primary_context(d: Decisions) -> int | None:
    """The context of the first regime that measures aggregate throughput, else the smallest measured one."""
    for outcome in d.regimes:
        if outcome.resolved.regime.metric == METRIC and outcome.resolved.context is not None:
            return outcome.resolved.context
    contexts = sorted({int(c) for c in d.results.groups["context"].dropna()}) if not d.results.groups.empty else []
    return contexts[0] if contexts else None


def load_levels(d: Decisions) -> dict[str, Any]:
    """The per-concurrency decisions and the schedule, as a summary block (`kind: load_levels`)."""
    block: dict[str, Any] = {"kind": "load_levels", "title": "Best configuration per load level",
                             "context": None, "metric": METRIC, "levels": [], "schedule": [], "changes": False}
    context = primary_context(d)
    groups = d.results.groups
    at = groups[(groups["metric"] == METRIC) & (groups["context"] == context)] if context is not None else groups[:0]
    if at.empty:
        block["text"] = "No aggregate throughput figures: no load levels to compare."
        return block
    ok_ids = [p.point_id for p in d.results.ok_points()]
    ar_id = ar_point_id(d.results)
    level = d.settings.confidence
    block["context"] = context
    rows = []
    for concurrency in sorted({int(c) for c in at["concurrency"]}):
        resolved = resolve_regime(d.results, Regime(f"C={concurrency}", METRIC, context, concurrency), ok_ids)
        outcome = regime_outcome(resolved, ar_id, d.settings, d.results)
        members = [outcome.leader, *outcome.tied] if outcome.leader else []
        recommended = outcome.recommended
        fig = resolved.figure(recommended) if recommended else None
        vs_ar = resolved.speedup(recommended, ar_id, level) if recommended and ar_id != recommended else None
        status = "firm" if outcome.winner else ("tied" if outcome.tied else "undecided")
        block["levels"].append({
            "concurrency": concurrency, "status": status, "leader": outcome.leader, "winner": outcome.winner,
            "tied_set": members, "recommended": recommended, "no_decision": outcome.no_decision,
            "figure": ({"value": fig["mean"], "ci_low": fig["ci_low"], "ci_high": fig["ci_high"],
                        "n": fig["repeats"], "level": level} if fig else None),
            "vs_ar": vs_ar.as_dict() if vs_ar else None})
        if not fig:
            figure = "n/a"
        elif interval_meaningful(fig["mean"], fig["ci_low"], fig["ci_high"], fig["repeats"]):
            figure = f"{fig['mean']:.1f} tok/s ({level:.0%} CI {fig['ci_low']:.1f}–{fig['ci_high']:.1f})"
        else:
            figure = f"{fig['mean']:.1f} tok/s ({no_interval(fig['repeats'])})"
        others = ", ".join(f"`{m}`" for m in members if m != recommended) or "—"
        rows.append([concurrency, f"`{recommended}`" if recommended else "no data", status, figure,
                     ratio_text(vs_ar) if vs_ar else "—", others])
    block["schedule"] = schedule([(lv["concurrency"], lv["tied_set"] or [lv["leader"]], lv["recommended"])
                                  for lv in block["levels"] if lv["recommended"]], d.results)
    block["changes"] = len(block["schedule"]) > 1
    block["table"] = {"columns": ["concurrency C", "best point", "decision", "aggregate throughput",
                                  "vs `ar`", "equivalent (tied)"], "rows": rows}
    block["text"] = (f"At each measured concurrency of context {context}, the point with the highest aggregate "
                     f"output throughput ({level:.0%} intervals); where points tie, {RULE}, and the others are listed "
                     "as equivalent.")
    ranges = "; ".join(f"C {a}–{b}: `{pid}`" if a != b else f"C {a}: `{pid}`" for a, b, pid in block["schedule"])
    if block["changes"]:
        block["text_after"] = (
            f"**The best point changes with load**: {ranges}. The schedule (`load_levels.schedule` in summary.json) "
            "switches as rarely as the data allow: each range's point is the winner or tied for best at every "
            "measured concurrency in it; a range starts at a measured concurrency and holds until the next range.")
    else:
        block["text_after"] = (f"The best point does not change with load: `{block['schedule'][0][2]}` is the winner "
                               "or tied for best at every measured concurrency." if block["schedule"] else None)
    return block


def schedule(levels: list[tuple[int, list[str], str]], results: ResultSet) -> list[list[Any]]:
    """`[from, to, point]` ranges over the measured concurrencies from (concurrency, equivalent best points,
    recommended point) per level: the fewest ranges such that each range's point is among the best at every
    level in it (greedy: from each level, the point that stays among the best the longest; the level's
    recommended point, else the cheapest, among equals). A range ends just below the next one; the last ends at
    the highest measured concurrency."""
    levels = sorted(levels, key=lambda lv: lv[0])
    out: list[list[Any]] = []
    i = 0
    while i < len(levels):
        def run(point_id: str, start: int = i) -> int:
            end = start
            while end < len(levels) and point_id in levels[end][1]:
                end += 1
            return end
        longest = max(run(pid) for pid in levels[i][1])
        candidates = [pid for pid in levels[i][1] if run(pid) == longest]
        chosen = levels[i][2] if levels[i][2] in candidates else cheapest(results, candidates)
        if out:
            out[-1][1] = levels[i][0] - 1
        out.append([levels[i][0], levels[longest - 1][0], chosen])
        i = longest
    return out
