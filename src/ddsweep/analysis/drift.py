"""Drift between replicates of one configuration: points with the same kind, preset and knobs are compared at
every regime cell; and the scheduled reference runs of a grid study (`sweep.reference`, docs/statistics.md):
the reference point's own job (the start of the study) against the same configuration run again after every
point on every host that ran points (`results/reference/end-<host>/`).

Their repeats ran in different server launches, so the difference between them is the launch-to-launch and
node-to-node variation the per-point intervals do not include. A ratio whose interval lies outside the
equivalence margin is drift with confidence and becomes a caveat with its numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddsweep.analysis.regimes import ResolvedRegime, resolve_regime
from ddsweep.analysis.results import KNOBS, PointRecord, ResultSet, load_directories, window_label
from ddsweep.analysis.settings import Regime
from ddsweep.analysis.statistics import Estimate


def replicate_groups(results: ResultSet) -> list[list[PointRecord]]:
    """Completed points that share kind, preset and every knob, in groups of two or more (sorted by id)."""
    groups: dict[tuple, list[PointRecord]] = {}
    for p in results.ok_points():
        key = (p.kind, p.preset, *(window_label(p.window) if k == "window" else getattr(p, k) for k in KNOBS))
        groups.setdefault(key, []).append(p)
    return [sorted(g, key=lambda p: p.point_id) for g in groups.values() if len(g) > 1]


def _verdict(est: Estimate, margin: float) -> str:
    """`drift` when the ratio's interval lies outside the margin, `within` when inside it, else `not settled`."""
    if est.has_interval and (est.low > 1 + margin or est.high < 1 / (1 + margin)):
        return "drift"
    if est.has_interval and est.low > 1 / (1 + margin) and est.high < 1 + margin:
        return "within"
    return "not settled"


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
                {"drift": drifted, "within": agreeing}.get(_verdict(est, margin), unclear).append(line)
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


@dataclass
class ReferenceRuns:
    """The scheduled reference runs of a grid study: the reference point's own result (the start) and the same
    configuration run again at the end on each host, loaded apart from the study's points so that they never
    enter rankings, the Pareto front, picks or the tables of points."""

    point_id: str
    runs: ResultSet  # the start under the point's id, each end run as `<id>@end-<host>`
    ends: dict[str, str]  # run id -> host

    @property
    def start(self) -> PointRecord | None:
        """The reference point's own record."""
        return self.runs.point(self.point_id)


def load_reference_runs(results_dir: str | Path, done_files: list[str | Path],
                        confidence: float = 0.95) -> ReferenceRuns | None:
    """The end-of-study runs whose done.json files are given (`results/reference/end-<host>/done.json`) with the
    start, `results/points/<id>/`, the point their point.json names; None without runs."""
    directories = sorted({Path(f).parent for f in done_files})
    point_id = None
    for directory in directories:
        try:
            point_id = json.loads((directory / "point.json").read_text(encoding="utf-8")).get("point_id")
        except (OSError, ValueError, AttributeError):
            continue
        if point_id:
            break
    if not directories or not point_id:
        return None
    hosts = {f"{point_id}@{d.name}": d.name.removeprefix("end-") for d in directories}
    runs = load_directories(results_dir, [Path(results_dir) / "points" / point_id, *directories], confidence,
                            names=[point_id, *hosts])
    return ReferenceRuns(point_id=str(point_id), runs=runs, ends=hosts)


def reference_caveat(reference: ReferenceRuns | None, regimes: list[Regime], margin: float,
                     level: float) -> dict[str, Any] | None:
    """A caveat comparing every end-of-study reference run with the start at each regime cell (paired log
    ratios on the repeat index), with its numbers and hosts; None when the study has no reference runs."""
    if reference is None:
        return None
    start = reference.start
    ok = [p.point_id for p in reference.runs.ok_points()]
    rows, drifted, comparisons = [], [], []
    failed = sorted(h for rid, h in reference.ends.items() if rid not in ok)
    for regime in regimes:
        resolved = resolve_regime(reference.runs, regime, ok)
        for run_id, host in reference.ends.items():
            est = resolved.speedup(run_id, reference.point_id, level) if start and run_id in ok else None
            if est is None:
                continue
            verdict = _verdict(est, margin)
            end = reference.runs.point(run_id)
            comparisons.append({"host": host, "regime": regime.name, "metric": regime.metric,
                                "cell": {"context": resolved.context, "concurrency": resolved.concurrency},
                                "ratio": est.as_dict(), "verdict": verdict})
            interval = f"{est.low:.3f}–{est.high:.3f}" if est.has_interval else "none"
            rows.append([f"`{host}`", regime.name, resolved.cell(), f"{est.value:.3f}×", interval, verdict])
            if verdict == "drift":
                drifted.append(f"**drift** on `{host}` ({_where(end)}), {regime.name} ({regime.metric} at "
                               f"{resolved.cell()}): end/start {est.value:.3f}× ({level:.0%} CI {interval}); "
                               f"start `{reference.point_id}` ran on {_where(start)}")
    where = _where(start) if start else "no completed start"
    hosts = ", ".join(f"`{h}`" for h in reference.ends.values())
    if start is None or start.status != "ok":
        text = (f"The reference point `{reference.point_id}` did not complete, so its end-of-study runs ({hosts}) "
                "have nothing to be compared with.")
    elif drifted:
        text = (f"The reference point `{reference.point_id}` (start: {where}) measured again after every point on "
                f"{hosts} differs from its start by more than the {margin:.0%} equivalence margin with confidence: "
                "the machines drifted during the study (or differ from each other), so differences of that size "
                "between points may be drift or node effects, not knob effects.")
    else:
        within = sum(1 for c in comparisons if c["verdict"] == "within")
        text = (f"The reference point `{reference.point_id}` (start: {where}) measured again after every point on "
                f"{hosts} shows no drift beyond the {margin:.0%} margin with confidence ({within} of "
                f"{len(comparisons)} comparison(s) within it, the rest not settled).")
    if failed:
        text += " No completed end-of-study run on " + ", ".join(f"`{h}`" for h in failed) + "."
    return {"kind": "reference_runs", "title": "Reference point at the start and the end of the study",
            "text": text, "drift": bool(drifted), "start": {"point_id": reference.point_id, "where": where},
            "comparisons": comparisons, "items": drifted,
            "table": {"columns": ["end run on", "regime", "cell", "end vs start (> 1: end better)",
                                  f"{level:.0%} CI", "verdict"], "rows": rows} if rows else None}
