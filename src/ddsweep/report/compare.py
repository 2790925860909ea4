"""The comparison of two studies (`ddsweep compare`) as Markdown, from the comparison document (compare.json,
ddsweep.findings.comparison) alone."""

from __future__ import annotations

from typing import Any


def render_compare(doc: dict[str, Any]) -> str:
    """The comparison as Markdown, from the comparison document alone."""
    a, b, m = doc["a"], doc["b"], doc["matched"]
    out = [f"# Study comparison: B `{b['study']}` against A `{a['study']}`", ""]
    if doc["simulated"]:
        out += ["> **SIMULATED RESULTS.** At least one study ran against the stand-in server, not real hardware.", ""]
    out += [f"A: `{a['source']}` ({a['points']} points). B: `{b['source']}` ({b['points']} points).", "",
            "## What changed in the environment", ""]
    env = doc["environment"]
    out += ["| item | A | B | changed |", "|---|---|---|---|"]
    out += [f"| {i['item']} | {', '.join(i['a'])} | {', '.join(i['b'])} | {'**yes**' if i['changed'] else 'no'} |"
            for i in env["items"]]
    out.append("")
    if env["commands"]:
        out += ["Server command differences of matched points (the job's port left out):", ""]
        out += [f"- {c['change']}: {len(c['points'])} point(s)" for c in env["commands"]]
    else:
        out.append("The matched points' server commands are identical (the job's port left out).")
    out += ["", "## Picks", "", "| priority | A | B |", "|---|---|---|"]
    for p in doc["picks"]:
        cells = [f"`{s['recommended']}` ({s['status']})" if s and s["recommended"] else "—" for s in (p["a"], p["b"])]
        out.append(f"| {p['priority']} | {cells[0]} | {cells[1]} |")
    out += ["", "## Matched points: B over A", "",
            f"Points with the same kind and knobs in both studies. Each cell is B's figure over A's in the better "
            f"direction (> 1: B better), with a {m['level'] * 100:.3g}% interval from Welch's t on the logs of the "
            "two studies' independent figures: one per server launch where both points ran in two or more launches "
            "(units `launch`), else one per repeat (units `repeat`: the interval then covers the variation between "
            "repeats within a launch only, not between launches; docs/statistics.md).", ""]
    columns = [f"{r['name']} ({r['metric']} at context {r['context']}, C={r['concurrency']})" for r in m["regimes"]]
    out += ["| point | units | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for row in m["points"]:
        out.append(f"| `{row['point_id']}` | {row['unit']} | "
                   + " | ".join(row["regimes"][r["name"]]["text"] for r in m["regimes"]) + " |")
    if not m["points"]:
        out.append("| (no point was measured in both studies) | |" + " |" * len(columns))
    out.append("")
    for label, ids in (("A", m["only_in_a"]), ("B", m["only_in_b"])):
        if ids:
            out.append(f"- Only in {label}: " + ", ".join(f"`{i}`" for i in ids) + ".")
    return "\n".join(out).rstrip() + "\n"
