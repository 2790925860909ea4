"""Write the optimization summary Markdown from the decision object (reports/summary.json) alone.

Decision sections have their own renderers; caveats and extra sections are generic blocks
(``{"title", "text", "table", "items", "code", "text_after"}``), so new summary lines need no change here.
"""

from __future__ import annotations

from typing import Any

from ddsweep.analysis.outcome import Outcome, PriorityResult
from ddsweep.formatting import figure_text, fmt, ratio_dict_text
from ddsweep.report.first_screen import render_decision


def _table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def block(b: dict[str, Any], level: int = 3) -> list[str]:
    """A generic block, in this order: heading, text, table, items, code blocks, text_after."""
    out = [f"{'#' * level} {b['title']}", ""]
    if b.get("text"):
        out += [b["text"], ""]
    if b.get("table"):
        out += [*_table(b["table"]["columns"], b["table"]["rows"]), ""]
    if b.get("items"):
        out += [*(f"- {item}" for item in b["items"]), ""]
    for key in ("code", "code2"):
        code = b.get(key)
        if code:
            if code.get("caption"):
                out += [code["caption"], ""]
            out += [f"```{code.get('language') or ''}", code["text"], "```", ""]
    if b.get("text_after"):
        out += [b["text_after"], ""]
    return out


def _priorities(doc: Outcome) -> list[str]:
    """The recommended default per priority, ties, limits and trade-offs."""
    out = ["## Recommended default per priority", "",
           "Each priority scores every completed point by the weighted geometric mean of its regime figures, each "
           "relative to the best point of that regime (1.000 = best). A pick is *decided* only when it beats every "
           "other candidate beyond the equivalence margin with confidence; otherwise the tied points are listed.",
           "",
           "| priority | weights | leader | score | decided? | tied with | recommended | runner-up (leader vs it) |",
           "|---|---|---|---|---|---|---|---|"]
    for p in doc.priorities:
        weights = ", ".join(f"{k} {v:g}" for k, v in p.weights.items())
        if p.slo:
            weights += "; limits " + ", ".join(f"{k} ≤ {v:g}" for k, v in p.slo.limits.items())
        if p.pick is None:
            out.append(f"| {p.name} | {weights} | {p.no_decision} | — | — | — | — | — |")
            continue
        runner = (f"`{p.runner_up.point_id}` ({ratio_dict_text(p.runner_up.pick_ratio)})"
                  if p.runner_up else "—")
        tied = ", ".join(f"`{t}`" for t in p.tied) or "none"
        decided = "yes" if p.decided else "no"
        out.append(f"| {p.name} | {weights} | `{p.pick}` | {p.score:.3f} | {decided} | {tied} "
                   f"| **`{p.recommended}`** | {runner} |")
    out.append("")
    for p in doc.priorities:
        if p.unknown_regimes:
            out.append(f"- `{p.name}` names regimes that are not defined: {', '.join(p.unknown_regimes)} "
                       "(ignored).")
        if p.pick is not None and p.no_decision:
            out.append(f"- `{p.name}`: {p.no_decision}; `{p.pick}` only leads.")
        elif p.pick is not None and p.tied:
            out.append(f"- `{p.name}`: `{p.pick}` is statistically tied with "
                       + ", ".join(f"`{t}`" for t in p.tied) + f"; any of them is as good on this data, and "
                       f"`{p.recommended}` is recommended as the cheapest (smallest verify width, then block size).")
        for tradeoff in p.tradeoffs:
            out.append(f"- `{p.name}` → `{p.recommended}` {tradeoff}.")
    out.append("")
    for p in doc.priorities:
        if p.slo:
            out += _slo(p)
    return out


def _slo(p: PriorityResult) -> list[str]:
    """The service-level limits of one priority: every point's status and goodput beside throughput."""
    slo = p.slo
    cell = slo.cell
    where = f"context {cell['context']}, C={cell['concurrency']}" if cell else "no cell"
    out = [f"### Service-level limits of `{p.name}` at {where}", "",
           "A point meets a limit when the upper bound of its interval is within it, fails when the lower bound is "
           "above it, and is uncertain otherwise. Goodput counts the requests per second whose own latencies met "
           "every limit.", ""]
    limits = list(slo.limits)
    rows = []
    for pid, entry in slo.points.items():
        checks = {c.limit: c for c in entry.checks}
        cells = []
        for lim in limits:
            est = checks[lim].estimate
            cells.append(f"{checks[lim].status}: {figure_text(lim, est, est['level'])}"
                         if est["value"] is not None else "no data")
        rate, good = entry.requests_per_s, entry.goodput_requests_per_s
        rows.append([f"`{pid}`", *cells, figure_text("requests_per_s", rate, rate["level"]) if rate else "n/a",
                     figure_text("requests_per_s", good, good["level"]) if good else "n/a (no request records)"])
    out += [*_table(["point", *(f"{lim} ≤ {slo.limits[lim]:g}" for lim in limits), "throughput",
                     "goodput"], rows), ""]
    for limit, pids in slo.not_meeting.items():
        if pids:
            out.append(f"- Not meeting {limit} ≤ {slo.limits[limit]:g} with confidence: "
                       + ", ".join(f"`{x}`" for x in pids) + ".")
    return [*out, ""]


def _regimes(doc: Outcome) -> list[str]:
    """The leader of each regime, its interval, its speed-up over ar and the tied set."""
    level = doc.statistics.confidence
    out = ["## Best point per regime", "",
           f"Figures are means of the per-repeat figures with {level:.0%} confidence intervals; speed-ups over "
           f"`ar` are ratios with their own {level:.0%} intervals. A winner is named only when it beats every other "
           f"point by more than {doc.statistics.equivalence_margin:.0%} with confidence (one-sided tests, "
           "Holm-corrected); otherwise the points it could not be separated from are tied with it, not losers. A "
           "ratio between a leader and another point is printed at the two-sided level matching its one-sided "
           "test (e.g. 90% for a test at 5%), so the other point counts as beaten exactly when that interval's lower "
           "bound is above 1 + the margin.", "",
           "| regime | metric at cell | winner (or leader) | figure | vs `ar` (same cell) | tied with |",
           "|---|---|---|---|---|---|"]
    notes = []
    for r in doc.regimes:
        metric = r.metric
        tied = ", ".join(f"`{t.point_id}` {fmt(metric, t.figure['value'])}" for t in r.tied) or "none"
        if r.leader is None:
            who = "no data"
        elif r.winner:
            who = f"**`{r.winner}`**"
        else:
            who = f"no single winner; leader `{r.leader}`, recommended **`{r.recommended}`** (cheapest)"
        out.append(f"| {r.name} | {metric} at {r.cell_text} | {who} | "
                   f"{figure_text(metric, r.figure, level)} | {ratio_dict_text(r.speedup_vs_ar)} | {tied} |")
        if r.cell_note:
            notes.append(f"- {r.name}: {r.cell_note}.")
        if r.no_decision and r.leader is not None:
            notes.append(f"- {r.name}: {r.no_decision}.")
    out.append("")
    if notes:
        out += ["Notes:", "", *notes, ""]
    if any(r.lower_is_better for r in doc.regimes):
        out += ["Speed-up over `ar` is `ar`'s figure divided by the point's for lower-is-better metrics.", ""]
    return out


def _pareto(doc: Outcome) -> list[str]:
    """The latency–throughput Pareto set, with uncertainty."""
    out = ["## Latency–throughput Pareto set", ""]
    pareto = doc.pareto
    if pareto.axes is None:
        return [*out, "Not computed: the regimes `latency` and `throughput` are needed and one has no data.", ""]
    lat, thr = pareto.axes.latency, pareto.axes.throughput
    level = doc.statistics.confidence
    out += [f"Points that no other point dominates with confidence on {lat.metric} at {lat.cell_text} and "
            f"{thr.metric} at {thr.cell_text}: a point is dominated only when another is, with {level:.0%} "
            f"confidence, no worse than the equivalence margin on both and better on one.", "",
            "| point | latency figure | throughput figure |", "|---|---|---|"]
    for row in pareto.set:
        out.append(f"| `{row.point_id}` | {figure_text(lat.metric, row.latency, level)} "
                   f"| {figure_text(thr.metric, row.throughput, level)} |")
    out.append("")
    if pareto.dominated:
        out.append("Dominated with confidence: " + ", ".join(
            f"`{j}` (by `{i}`)" for j, i in sorted(pareto.dominated.items())) + ".")
    else:
        out.append("No point is dominated with confidence.")
    return [*out, ""]


def _diagnosis(doc: Outcome) -> list[str]:
    """The acceptance verdict with its evidence and the matched series."""
    diag = doc.diagnosis
    out = ["## Bottleneck diagnosis", "",
           f"Mean acceptance length (tokens accepted per verify step) at {diag.cell_text}, compared only between "
           f"points that differ in one knob; a gain is material above {diag.threshold:.0%} "
           "(analysis.diagnosis_gain).", "", diag.text, ""]
    for knob, series in diag.series.items():
        if not series:
            out.append(f"- **{knob}**: no matched comparison in this sweep.")
            continue
        out.append(f"- **{knob}** ({len(series)} matched series), gain from the lowest to the highest {knob}:")
        for s in series[:12]:
            values = " → ".join(str(v) for v in s.values)
            accs = " → ".join(f"{a:.2f}" for a in s.acceptance)
            flat = (f"; left out, drafting the same tree as an earlier member: "
                    f"{', '.join(f'`{i}`' for i in s.flat)}" if s.flat else "")
            out.append(f"  - {knob} {values}: {accs}: {s.gain_text}; top step {s.top_step_text} "
                       f"(with {s.fixed}){flat}")
        if len(series) > 12:
            out.append(f"  - … and {len(series) - 12} more series (see results/tables/bench_groups.csv)")
    trained = diag.trained_block_size
    out += ["", f"Drafter trained block size: {trained if trained else 'unknown'} "
            f"(source: {diag.trained_block_size_source}).", ""]
    return out


def render_markdown(doc: Outcome) -> str:
    """Render the optimization summary as Markdown from the decision object."""
    out = [f"# Optimization summary: {doc.study}", ""]
    if doc.note:
        out += [f"> **Note.** {doc.note}", ""]
    if doc.simulated:
        out += ["> **SIMULATED RESULTS.** Some or all figures below come from the simulated server, not from "
                "real hardware. Do not use them to choose a production configuration.", ""]
    out += render_decision(doc.decision)
    counts = doc.points.by_status
    stats = doc.statistics
    out += [f"{doc.points.total} sweep points in `{doc.results_dir}`: "
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ". Metrics: "
            + "; ".join(f"`{m}` = {label}" for m, label in doc.metrics.items()) + ".", "",
            f"Statistics: {stats.method}. Confidence level {stats.confidence:.0%}; equivalence margin "
            f"{stats.equivalence_margin:.0%}; at least {stats.min_repeats_for_decision} repeats for a decision.",
            ""]
    out += _priorities(doc) + _regimes(doc) + block(doc.load_levels, 2) + _pareto(doc) + _diagnosis(doc)
    out += ["## Caveats found in the data", ""]
    for caveat in doc.caveats:
        out += block(caveat, 3)
    for section in doc.sections:
        out += block(section, 2)
    return "\n".join(out).rstrip() + "\n"
