"""The summary's section on an adaptive study's funnel, read from results/screen/funnel.json (written by
`ddsweep funnel`, adaptive/funnel.py; docs/results-schema.md).
"""

from __future__ import annotations

import json
from pathlib import Path


def _failure_text(pid: str, doc: dict) -> str:
    """'`pid` failed in screening (server_crash: the server exited …)', or without the reason in older records."""
    failure = doc.get("failures", {}).get(pid)
    return f"`{pid}` failed in screening" + (f" ({failure['error_kind']}: {failure['reason']})" if failure else "")


def render_funnel(doc: dict, simulated: bool) -> str:
    """The Markdown section of the summary that shows the adaptive study's funnel."""
    label = " (SIMULATED)" if simulated else ""
    out = [f"## Adaptive study: screening funnel{label}", "",
           "| stage | points | job time (min) | GPU-hours |", "|---|---|---|---|"]
    for name, stage in doc["stages"].items():
        out.append(f"| {name} | {stage['points']} | {stage['job_min']:.1f} | {doc['gpu_hours'][name]:.2f} |")
    if doc.get("rounds"):
        out += ["", "| selection | points in | points kept |", "|---|---|---|"]
        out += [f"| {r['stage']} | {r['entered']} | {r['kept']} |" for r in doc["rounds"]]
    out += ["", f"{len(doc['survivors'])} point(s) confirmed: " + ", ".join(f"`{p}`" for p in doc["survivors"]), ""]
    out += [line + "\n" for line in (_rules_text(doc), _cost_text(doc)) if line]
    if doc["dropped"]:
        out += ["Dropped (each with its closest comparison to the best at that stage):", ""]
        out += [f"- `{pid}`: {reason}" for pid, reason in sorted(doc["dropped"].items())]
    if doc.get("unstable"):
        out += ["", "Figures from cells that did not settle (widened, never the best compared with):", ""]
        out += [f"- {_unstable_text(pid, where)}" for pid, where in sorted(doc["unstable"].items())]
    if doc["failed"]:
        out += ["", "Failed in screening (not confirmed; each point's results/screen/<point>/failure.json):", ""]
        out += [f"- {_failure_text(pid, doc)}" for pid in doc["failed"]]
    return "\n".join(out) + "\n"


def _unstable_text(pid: str, where: list[str]) -> str:
    """One line for a point whose screened or raced figure came from a cell that did not settle."""
    return (f"`{pid}`: its cell did not settle ({'; '.join(where)}): compared there with its band widened by half "
            "the cell's sub-window spread, and never the best at its own figure")


def _rules_text(doc: dict) -> str:
    """'Dropped by rule: 3 by the band, 2 by the widened band (...), 4 by the race's cap.', or "" in older records."""
    counts = doc.get("dropped_by_rule")
    if counts is None:
        return ""
    return ("Dropped by rule: " + f"{counts.get('band', 0)} by the band (clearly worse, figures that settled), "
            f"{counts.get('widened band', 0)} by the widened band (clearly worse although a cell did not settle), "
            f"{counts.get('race cap', 0)} by the race's cap (sweep.screen.race_keep).")


def _cost_text(doc: dict) -> str:
    """The jobs' cost in the plan's cost model against the grid's estimate, or "" in older records."""
    cost = doc.get("cost")
    if not cost or not cost.get("grid_estimate_min"):
        return ""
    return (f"Cost against the grid: the jobs that ran come to {cost['jobs_estimate_min']:.1f} min in the plan's cost "
            f"model (resources.estimate), {cost['ratio_to_grid']:.0%} of the full grid's "
            f"{cost['grid_estimate_min']:.1f} min (the plan expected {cost['adaptive_expected_min']:.1f} min), with "
            f"{cost['unsettled_share']:.0%} of the cells not settling as in this study's {cost['cells']} cells; "
            f"measured job time {cost['measured_job_min']:.1f} min.")


def funnel_block(results_dir: Path) -> dict | None:
    """The funnel as a summary block (docs/results-schema.md, summary.json `sections`), or None without one."""
    path = Path(results_dir) / "screen" / "funnel.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    rows = [[name, stage["points"], round(stage["job_min"], 1), round(doc["gpu_hours"][name], 2)]
            for name, stage in doc["stages"].items()]
    items = [line for line in (_rules_text(doc), _cost_text(doc)) if line]
    items += [f"`{pid}` dropped: {reason}" for pid, reason in sorted(doc["dropped"].items())]
    items += [_unstable_text(pid, where) for pid, where in sorted(doc.get("unstable", {}).items())]
    items += [_failure_text(pid, doc) for pid in doc.get("failed", [])]
    return {"kind": "adaptive_funnel", "title": "Adaptive study: screening funnel",
            "text": (f"{len(doc['survivors'])} point(s) were confirmed ("
                     + ", ".join(f"`{p}`" for p in doc["survivors"]) + "); only they enter the decisions above."
                     + (" SIMULATED." if doc.get("simulated") else "")),
            "table": {"columns": ["stage", "points", "job time (min)", "GPU-hours"], "rows": rows},
            "items": items}


def funnel_markdown(results_dir: Path) -> str:
    """The funnel section for the optimization summary, or "" when RESULTS_DIR holds no adaptive study."""
    path = Path(results_dir) / "screen" / "funnel.json"
    if not path.exists():
        return ""
    doc = json.loads(path.read_text(encoding="utf-8"))
    return render_funnel(doc, bool(doc.get("simulated")))
