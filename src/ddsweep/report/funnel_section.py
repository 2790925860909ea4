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
    if doc["dropped"]:
        out += ["Dropped (each with its closest comparison to the best at that stage):", ""]
        out += [f"- `{pid}`: {reason}" for pid, reason in sorted(doc["dropped"].items())]
    if doc.get("unstable"):
        out += ["", "Kept without a comparison where their cell did not settle (measured again before it decides):",
                ""]
        out += [f"- {_unstable_text(pid, where)}" for pid, where in sorted(doc["unstable"].items())]
    if doc["failed"]:
        out += ["", "Failed in screening (not confirmed; each point's results/screen/<point>/failure.json):", ""]
        out += [f"- {_failure_text(pid, doc)}" for pid in doc["failed"]]
    return "\n".join(out) + "\n"


def _unstable_text(pid: str, where: list[str]) -> str:
    """One line for a point whose screened or raced figure came from a cell that did not settle."""
    return (f"`{pid}`: its cell did not settle ({'; '.join(where)}): neither dropped nor compared with there, "
            "and measured again")


def funnel_block(results_dir: Path) -> dict | None:
    """The funnel as a summary block (docs/results-schema.md, summary.json `sections`), or None without one."""
    path = Path(results_dir) / "screen" / "funnel.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    rows = [[name, stage["points"], round(stage["job_min"], 1), round(doc["gpu_hours"][name], 2)]
            for name, stage in doc["stages"].items()]
    items = [f"`{pid}` dropped: {reason}" for pid, reason in sorted(doc["dropped"].items())]
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
