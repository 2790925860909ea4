"""Drift between replicates of one configuration (for example `ar` measured at the start and the end of a
study, or on every node): points with the same kind, preset and knobs are compared at every regime cell.

Their repeats ran in different server launches, so the difference between them is the launch-to-launch and
node-to-node variation the per-point intervals do not include. A ratio whose interval lies outside the
equivalence margin is drift with confidence and becomes a caveat with its numbers.
"""

from __future__ import annotations

from typing import Any

from ddsweep.analysis.results import KNOBS, PointRecord, ResolvedRegime, ResultSet, window_label
from ddsweep.analysis.statistics import Estimate


def replicate_groups(results: ResultSet) -> list[list[PointRecord]]:
    """Completed points that share kind, preset and every knob, in groups of two or more (sorted by id)."""
    groups: dict[tuple, list[PointRecord]] = {}
    for p in results.ok_points():
        key = (p.kind, p.preset, *(window_label(p.window) if k == "window" else getattr(p, k) for k in KNOBS))
        groups.setdefault(key, []).append(p)
    return [sorted(g, key=lambda p: p.point_id) for g in groups.values() if len(g) > 1]


def _where(p: PointRecord) -> str:
    """The host (and Slurm node) a point ran on, from its environment.json."""
    slurm = p.environment.get("slurm") if isinstance(p.environment.get("slurm"), dict) else {}
    host = p.environment.get("hostname") or "unknown host"
    return f"{host}" + (f", Slurm job {slurm.get('job_id')}" if slurm.get("job_id") else "")


def drift_caveat(results: ResultSet, regimes: list[ResolvedRegime], margin: float,
                 level: float) -> dict[str, Any] | None:
    """A caveat block comparing each replicate with the first of its group at every regime cell, or None
    when the study has no replicated configuration."""
    groups = replicate_groups(results)
    if not groups:
        return None
    drifted, agreeing, unclear = [], [], []
    for group in groups:
        reference = group[0]
        for other in group[1:]:
            for r in regimes:
                est: Estimate | None = r.speedup(other.point_id, reference.point_id, level)
                if est is None:
                    continue
                line = (f"`{other.point_id}` ({_where(other)}) vs `{reference.point_id}` ({_where(reference)}), "
                        f"{r.regime.name} ({r.regime.metric} at {r.cell()}): {est.value:.3f}×"
                        + (f" ({level:.0%} CI {est.low:.3f}–{est.high:.3f})" if est.has_interval else ""))
                if est.has_interval and (est.low > 1 + margin or est.high < 1 / (1 + margin)):
                    drifted.append(line)
                elif est.has_interval and est.low > 1 / (1 + margin) and est.high < 1 + margin:
                    agreeing.append(line)
                else:
                    unclear.append(line)
    names = ", ".join("/".join(f"`{p.point_id}`" for p in g) for g in groups)
    if drifted:
        text = (f"Replicated configurations ({names}) differ by more than the {margin:.0%} equivalence margin "
                "with confidence: the variation between server launches or nodes is larger than the margin, so "
                "differences of that size between other points may be launch or node effects, not knob effects.")
    else:
        text = (f"Replicated configurations ({names}) show no drift beyond the {margin:.0%} margin with "
                f"confidence ({len(agreeing)} comparison(s) within it, {len(unclear)} not settled).")
    return {"kind": "reference_drift", "title": "Drift between replicates of one configuration", "text": text,
            "items": [f"**drift**: {line}" for line in drifted] + [f"within margin: {line}" for line in agreeing]
            + [f"not settled: {line}" for line in unclear]}
