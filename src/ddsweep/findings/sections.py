"""The summary's reference sections (platform, how to reproduce, every point at the regime cells) and the JSON
form of figures and estimates they share with the decisions."""

from __future__ import annotations

import math
from typing import Any

import yaml

from ddsweep.analysis.decisions import Decisions
from ddsweep.analysis.regimes import ResolvedRegime
from ddsweep.analysis.results import ar_point_id
from ddsweep.analysis.statistics import Estimate
from ddsweep.formatting import figure_text


def estimate_json(est: Estimate | None) -> dict[str, Any] | None:
    """An estimate as JSON, or None."""
    return est.as_dict() if est is not None else None


def figure_json(resolved: ResolvedRegime, point_id: str | None) -> dict[str, Any] | None:
    """A point's regime figure as {value, ci_low, ci_high, n, level}."""
    fig = resolved.figure(point_id) if point_id else None
    if not fig:
        return None
    def clean(x: float) -> float | None:
        return None if math.isnan(x) else x
    return {"value": fig["mean"], "ci_low": clean(fig["ci_low"]), "ci_high": clean(fig["ci_high"]),
            "n": fig["repeats"], "level": None}


def platform_section(d: Decisions) -> dict[str, Any]:
    """GPU model and count, interconnect, engine and commit, and whether points agree, as a generic block."""
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
    block: dict[str, Any] = {"kind": "platform", "title": "Platform"}
    if not combos:
        block["text"] = "No environment.json was readable: the platform is unknown."
        return block
    block["table"] = {"columns": ["GPU", "count", "interconnect", "engine", "ddsweep commit", "points"], "rows": [
        [gpu or "unknown", count if count is not None else "unknown", link or "unknown", engine,
         f"{commit}{' (dirty)' if dirty else ''}", len(pids)]
        for (gpu, count, link, engine, commit, dirty), pids in combos.items()]}
    items = []
    if len(combos) > 1:
        items = [f"{k[0]} ×{k[1]}, {k[2] or 'unknown interconnect'}, {k[3]}, commit {k[4]}: "
                 + ", ".join(f"`{p}`" for p in pids) for k, pids in combos.items()]
        block["text"] = ("**The points do not share one platform**; comparisons across these groups mix hardware "
                         "or software differences with the knobs:")
    block["items"] = items
    topology = next((p.environment.get("topology") for p in d.results.points
                     if isinstance(p.environment.get("topology"), str) and p.environment.get("topology")), None)
    if topology:
        block["code"] = {"caption": "Interconnect topology (`nvidia-smi topo -m`, first point that recorded it):",
                         "language": "", "text": topology.rstrip()}
    block["text_after"] = ("These results transfer only to the same platform: another GPU model, GPU count or "
                           "interconnect (for example NVLink instead of PCIe) can rank the configurations differently.")
    return block


def reproduce_section(d: Decisions) -> dict[str, Any]:
    """The exact command and config, as a generic block."""
    s = d.settings
    block: dict[str, Any] = {"kind": "reproduce", "title": "How to reproduce",
                             "code": {"caption": None, "language": "sh", "text": s.reproduce_command}}
    if s.config:
        where = f" (`{s.config_path}`)" if s.config_path else ""
        block["code2"] = {"caption": f"Study config used{where}:", "language": "yaml",
                          "text": yaml.safe_dump(s.config, sort_keys=False).rstrip()}
    else:
        block["text"] = "No study config was given to `ddsweep summarize`; defaults were used for the analysis."
    return block


def all_points_section(d: Decisions) -> dict[str, Any]:
    """Every completed point at every regime cell, with its speed-up over `ar`, as a generic table block."""
    ar_id = ar_point_id(d.results)
    level = d.settings.confidence
    coding = d.coding.set_index("point_id") if not d.coding.empty else None
    rows = []
    for p in d.results.ok_points():
        cells = []
        for o in d.regimes:
            r = o.resolved
            fig = figure_json(r, p.point_id)
            text = figure_text(r.regime.metric, fig, level)
            speed = r.speedup(p.point_id, ar_id, level) if fig and ar_id and ar_id != p.point_id else None
            cells.append(text + (f" ({speed.value:.2f}×)" if speed else ""))
        rate = (f"{coding.at[p.point_id, 'pass_rate']:.0%}" if coding is not None and p.point_id in coding.index
                else "n/a")
        rows.append([f"`{p.point_id}`", p.label(), *cells, rate])
    return {"kind": "all_points", "title": "All completed points at the regime cells", "table": {
        "columns": ["point", "knobs", *(f"{o.resolved.regime.name} (vs ar)" for o in d.regimes), "coding pass rate"],
        "rows": rows}}
