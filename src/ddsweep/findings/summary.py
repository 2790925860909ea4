"""Compute the decision object (:class:`~ddsweep.analysis.outcome.Outcome`) from the decisions, once.

The object holds every figure, interval and sentence the reports show; they render it alone, so they cannot
disagree. Its JSON form is reports/summary.json (docs/results-schema.md). To add to the summary, append a caveat
(``{"kind", "title", "text", "table", "items", "code", "text_after"}``) to ``caveats`` or a block of the same
shape to ``sections``: both are rendered generically.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from ddsweep.analysis.chain import chain_section
from ddsweep.analysis.decisions import Decisions, RegimeOutcome, Settings, analyse, ratio_text
from ddsweep.analysis.diagnosis import gain_text
from ddsweep.analysis.load_levels import load_levels
from ddsweep.analysis.outcome import Outcome
from ddsweep.analysis.results import KNOBS, METRIC_LABELS, ar_point_id, load_results, window_label
from ddsweep.analysis.scope import ignored_caveat, study_point_ids
from ddsweep.findings.caveats import caveats
from ddsweep.findings.first_screen import decision_block
from ddsweep.findings.full_coding import answered_all, full_coding_block, recommended_points
from ddsweep.findings.funnel_section import funnel_block
from ddsweep.findings.launch_spread import spread_block
from ddsweep.findings.sections import (
    all_points_section,
    estimate_json,
    figure_json,
    platform_section,
    reproduce_section,
)

METHOD = ("mean of per-repeat figures with a Student-t interval (repeats are the independent units, or the server "
          "launches where a point ran in several, their variance pooled over the study's points); ratios "
          "from per-repeat log ratios paired on the repeat index (same prompts), else Welch's t on the logs; a "
          "winner must beat every other point by more than the equivalence margin in one-sided tests with "
          "Holm's correction, and each comparison's printed interval is two-sided at 1 - 2·(the level its one-sided "
          "test faced), so it clears 1 + margin exactly when the test does (docs/statistics.md)")


def _regime(o: RegimeOutcome, level: float) -> dict[str, Any]:
    """One regime's decision as JSON."""
    r = o.resolved
    def fig(pid: str | None) -> dict[str, Any] | None:
        f = figure_json(r, pid)
        if f:
            f["level"] = level
        return f
    by_id = {c.point_id: c for c in o.comparisons}
    return {
        "name": r.regime.name, "metric": r.regime.metric, "lower_is_better": r.regime.lower_is_better,
        "cell": {"context": r.context, "concurrency": r.concurrency} if r.context is not None else None,
        "cell_text": r.cell(), "cell_note": r.note, "leader": o.leader, "winner": o.winner,
        "decided": o.winner is not None, "no_decision": o.no_decision, "figure": fig(o.leader),
        "recommended": o.recommended,
        "tied": [{"point_id": pid, "figure": fig(pid), "leader_ratio": estimate_json(by_id[pid].ratio)}
                 for pid in o.tied],
        "speedup_vs_ar": estimate_json(o.speedup_vs_ar),
        "speedup_vs_ar_text": ratio_text(o.speedup_vs_ar) if o.speedup_vs_ar else None,
    }


def _priorities(d: Decisions) -> list[dict[str, Any]]:
    """Every priority's pick, tied set, runner-up, limits and trade-offs as JSON."""
    out = []
    for p in d.priorities:
        entry: dict[str, Any] = {
            "name": p.name, "weights": p.weights, "pick": p.point_id, "decided": p.decided, "score": p.score,
            "recommended": p.recommended,
            "tied": p.tied, "no_decision": p.no_decision, "unknown_regimes": p.unknown_regimes,
            "runner_up": ({"point_id": p.runner_up, "pick_ratio": estimate_json(p.runner_up_ratio),
                           "score": p.scores.get(p.runner_up)} if p.runner_up else None),
            "tradeoffs": p.tradeoffs, "slo": None,
        }
        if p.priority.slo:
            points = {}
            for pid, checks in p.slo.items():
                good = p.goodput.get(pid, {})
                points[pid] = {
                    "meets_all": all(c.status == "meets" for c in checks),
                    "checks": [{"limit": c.limit, "bound": c.bound, "status": c.status,
                                "estimate": estimate_json(c.estimate)} for c in checks],
                    "requests_per_s": estimate_json(good.get("requests_per_s")),
                    "goodput_requests_per_s": estimate_json(good.get("goodput_requests_per_s")),
                }
            failing = {limit: sorted(pid for pid, checks in p.slo.items()
                                     for c in checks if c.limit == limit and c.status != "meets")
                       for limit in p.priority.slo}
            entry["slo"] = {"limits": p.priority.slo, "cell": (
                {"context": p.slo_cell[0], "concurrency": p.slo_cell[1]} if p.slo_cell else None),
                "points": points, "not_meeting": failing}
        out.append(entry)
    return out


def _pareto(d: Decisions, level: float) -> dict[str, Any]:
    """The Pareto set with both figures, and who dominates each dominated point."""
    if d.pareto_axes is None:
        return {"axes": None, "set": [], "dominated": {}}
    lat, thr = d.regime("latency").resolved, d.regime("throughput").resolved
    rows = []
    for pid in d.pareto:
        a, b = figure_json(lat, pid), figure_json(thr, pid)
        for f in (a, b):
            f["level"] = level
        rows.append({"point_id": pid, "latency": a, "throughput": b})
    return {"axes": {"latency": {"metric": lat.regime.metric, "cell_text": lat.cell()},
                     "throughput": {"metric": thr.regime.metric, "cell_text": thr.cell()}},
            "set": rows, "dominated": d.dominated}


def _diagnosis(d: Decisions) -> dict[str, Any]:
    """The acceptance diagnosis with its series and block-size pairs."""
    diag = d.diagnosis
    series = {}
    for knob in KNOBS:
        series[knob] = [{
            "fixed": s.fixed, "values": [window_label(v) if knob == "window" else v for v in s.values],
            "acceptance": s.acceptance, "point_ids": s.point_ids, "gain": estimate_json(s.gain),
            "gain_text": gain_text(s.gain),
            "top_step": estimate_json(s.top_step), "top_step_text": gain_text(s.top_step), "flat": s.flat}
            for s in diag.series[knob]]
    return {"cell_text": diag.cell, "verdict": diag.verdict, "text": diag.text, "threshold": diag.threshold,
            "series": series,
            "block_pairs": [{"low": b.low, "high": b.high, "low_block_size": b.low_block,
                             "high_block_size": b.high_block, "fixed": b.fixed, "straddles_trained": b.straddles,
                             "gain": estimate_json(b.gain), "gain_text": gain_text(b.gain)} for b in diag.block_pairs],
            "trained_block_size": d.settings.trained_block_size,
            "trained_block_size_source": d.settings.trained_block_size_source}


def build_outcome(d: Decisions, coding_full: Path | None = None) -> Outcome:
    """The decision object of a study: its decisions, and what else its results directory holds (an adaptive
    study's funnel, the recommended points' full HumanEval in `coding_full`'s picks.json, the launch spread)."""
    results, s = d.results, d.settings
    load = load_levels(d)
    counts: dict[str, int] = {}
    for p in results.points:
        counts[p.status] = counts.get(p.status, 0) + 1
    chain = chain_section(d)
    sections = [*([chain] if chain is not None else []), platform_section(d), reproduce_section(d),
                all_points_section(d)]
    found = caveats(d)
    funnel = funnel_block(results.results_dir)  # an adaptive study's stages (docs/adaptive.md)
    if funnel is not None:
        sections.append(funnel)
    full = full_coding_block(results.results_dir, coding_full, ar_point_id(results), s.confidence)
    if full is not None:
        sections.append(full[0])
        found.extend(full[1])
    found.append(spread_block(d, results.results_dir))
    ignored = ignored_caveat(results.ignored)
    if ignored is not None:
        found.append(ignored)
    return Outcome.from_json(jsonable({
        "schema_version": Outcome.VERSION, "study": s.study, "note": (s.config or {}).get("note"),
        "simulated": results.simulated, "results_dir": str(results.results_dir),
        "decision": decision_block(d, load), "points": {"total": len(results.points), "by_status": counts},
        "statistics": {"method": METHOD, "confidence": s.confidence, "equivalence_margin": s.equivalence_margin,
                       "min_repeats_for_decision": s.min_repeats, "diagnosis_gain": s.diagnosis_gain,
                       "data_source": sorted(set(results.cells["source"].dropna())) if not results.cells.empty
                       else []},
        "metrics": {m: label for m, label in METRIC_LABELS.items()
                    if any(o.resolved.regime.metric == m for o in d.regimes)},
        "regimes": [_regime(o, s.confidence) for o in d.regimes], "load_levels": load,
        "priorities": _priorities(d), "pareto": _pareto(d, s.confidence), "diagnosis": _diagnosis(d),
        "caveats": found, "sections": sections,
    }))


def picks_document(results_dir: Path, config: dict[str, Any] | None, config_path: Path | None,
                   points: list[Path] | None) -> dict[str, Any]:
    """The recommended points, as the summary decides them, and which of them need a full HumanEval run."""
    settings = Settings.from_config(config, config_path)
    results = load_results(results_dir, study_point_ids(config, points), settings.confidence)
    picks = recommended_points(build_outcome(analyse(results, settings)).to_json())
    run = sorted(p for p in picks if not answered_all(results_dir, p))
    return {"picks": picks, "run": run, "already_full": sorted(set(picks) - set(run)),
            "simulated": results.simulated}


def jsonable(value: Any) -> Any:
    """Replace NaN and numpy scalars so json.dumps writes standard JSON."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA:
        return None
    return value
