"""The first screen of the summary: the decision, rendered from the decision object's `decision`
(ddsweep.findings.first_screen decides it): per priority the point to deploy, its gains and losses with
intervals, the caveats that would change it and the launch commands; what went wrong before it when the study
measured nothing or lost more than half its points."""

from __future__ import annotations

from ddsweep.analysis.outcome import Decision, Failures
from ddsweep.formatting import ratio_dict_text


def render_failures(failures: Failures) -> list[str]:
    """What went wrong, before the decision, when the study measured nothing or lost more than half its points."""
    title = "Nothing was measured" if failures.measured == 0 else "More than half of the points were lost"
    return [f"## {title}", "", failures.headline, "", *(f"- {g.text}" for g in failures.groups), "",
            *(f"Next: {advice}" for advice in failures.next), ""]


def render_decision(block: Decision) -> list[str]:
    """The first section of the Markdown summary, from the decision; what went wrong before it when the study
    measured nothing or lost more than half its points."""
    out = render_failures(block.failures) if block.failures.alarm else []
    out += ["## Decision", "",
            "What to deploy per declared priority; ratios are the recommended point's figure over the other's at "
            "each regime's cell (> 1: better), with intervals. Reference sections follow.", "",
            "| priority | deploy | decision | over `ar` | over the best DFlash chain | gives up |",
            "|---|---|---|---|---|---|"]
    notes: list[str] = []
    for p in block.priorities:
        if p.recommended is None:
            out.append(f"| {p.priority} | none: {p.no_decision} | — | — | — | — |")
            continue
        over_ar = "; ".join(f"{g.regime} {ratio_dict_text(g.vs_ar)}" for g in p.gains
                            if g.vs_ar) or ("— (is `ar`)" if p.kind == "ar" else "no `ar` measured")
        over_chain = "; ".join(f"{g.regime} {ratio_dict_text(g.vs_chain)} vs `{g.chain}`" for g in p.gains
                               if g.vs_chain) or ("— (is the chain)" if any(g.chain for g in p.gains)
                                                  else "no DFlash chain measured")
        gives = "; ".join(f"{g.regime} {ratio_dict_text(g.ratio)} of `{g.best}`" for g in p.gives_up
                          if not g.is_best) or "nothing: best or tied for best in every other regime"
        status = {"firm": "firm", "tied": f"tie of {len(p.tied_set)}", "undecided": "leads only"}[p.status]
        out.append(f"| {p.priority} | **`{p.recommended}`** | {status} | {over_ar} | {over_chain} | {gives} |")
        if p.status == "tied":
            others = ", ".join(f"`{t}`" for t in p.tied_set if t != p.recommended)
            notes.append(f"- `{p.priority}`: a tie; recommended `{p.recommended}`, {p.rule} "
                         f"({p.cost.verify_width} verify slots, block size {p.cost.block_size}); "
                         f"equivalent on this data: {others}.")
    out += ["", *notes]
    if block.schedule:
        out.append("- Under load the best point changes (context " + str(block.schedule_context) + "): " + "; ".join(
            f"C {a}–{b} `{pid}`" if a != b else f"C {a} `{pid}`" for a, b, pid in block.schedule)
            + " (*Best configuration per load level*).")
    if block.caveats:
        out += ["", "Would change this decision:", ""]
        out += [f"- {c.text}" for c in block.caveats]
        if block.more_caveats:
            out.append(f"- … and {block.more_caveats} more: *Caveats found in the data*.")
    launches: dict[str, list[str]] = {}
    for p in block.priorities:
        if p.recommended and p.launch:
            launches.setdefault(p.recommended, []).append(p.priority)
    if launches:
        out += ["", "Launch commands (the server's default port; `launch` in summary.json):", "", "```sh"]
        for pid, names in launches.items():
            launch = next(p.launch for p in block.priorities if p.recommended == pid)
            out += [f"# {pid}: {', '.join(names)}", launch.shell]
        out.append("```")
    return [*out, ""]
