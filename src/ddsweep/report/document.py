"""Turn :class:`~ddsweep.analysis.decisions.Decisions` into the summary document (reports/summary.json).

The document holds every figure, interval and sentence the Markdown shows; ``render`` writes the Markdown
from it alone, so the two cannot disagree. Its layout is in docs/results-schema.md. To add to the summary,
append a caveat (``{"kind", "title", "text", "table", "items", "code", "text_after"}``) to ``caveats``
or a block of the same shape to ``sections``: both are rendered generically.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import yaml

from ddsweep.analysis.decisions import Decisions, RegimeOutcome, ratio_text
from ddsweep.analysis.diagnosis import MAX_LIST, gain_text
from ddsweep.analysis.drift import drift_caveat, reference_caveat
from ddsweep.analysis.load_levels import load_levels
from ddsweep.analysis.regimes import ResolvedRegime
from ddsweep.analysis.results import KNOBS, METRIC_LABELS, ar_point_id, window_label
from ddsweep.analysis.statistics import Estimate
from ddsweep.analysis.text import interval_meaningful, no_interval
from ddsweep.report.first_screen import decision_block
from ddsweep.report.measurement import verification_caveats, workload_caveats
from ddsweep.report.operations import failed_points_caveat, mixed_hosts_caveat
from ddsweep.report.quality import measurement_caveat

SCHEMA_VERSION = 2
METHOD = ("mean of per-repeat figures with a Student-t interval (repeats are the independent units, or the server "
          "launches where a point ran in several, their variance pooled over the study's points); ratios "
          "from per-repeat log ratios paired on the repeat index (same prompts), else Welch's t on the logs; a "
          "winner must beat every other point by more than the equivalence margin in one-sided tests with "
          "Holm's correction, and each comparison's printed interval is two-sided at 1 - 2·(the level its one-sided "
          "test faced), so it clears 1 + margin exactly when the test does (docs/statistics.md)")


def _est(est: Estimate | None) -> dict[str, Any] | None:
    """An estimate as JSON, or None."""
    return est.as_dict() if est is not None else None


def _fig(resolved: ResolvedRegime, point_id: str | None) -> dict[str, Any] | None:
    """A point's regime figure as {value, ci_low, ci_high, n, level}."""
    fig = resolved.figure(point_id) if point_id else None
    if not fig:
        return None
    def clean(x: float) -> float | None:
        return None if math.isnan(x) else x
    return {"value": fig["mean"], "ci_low": clean(fig["ci_low"]), "ci_high": clean(fig["ci_high"]),
            "n": fig["repeats"], "level": None}


def _regime(o: RegimeOutcome, level: float) -> dict[str, Any]:
    """One regime's decision as JSON."""
    r = o.resolved
    def fig(pid: str | None) -> dict[str, Any] | None:
        f = _fig(r, pid)
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
        "tied": [{"point_id": pid, "figure": fig(pid), "leader_ratio": _est(by_id[pid].ratio)} for pid in o.tied],
        "speedup_vs_ar": _est(o.speedup_vs_ar),
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
            "runner_up": ({"point_id": p.runner_up, "pick_ratio": _est(p.runner_up_ratio),
                           "score": p.scores.get(p.runner_up)} if p.runner_up else None),
            "tradeoffs": p.tradeoffs, "slo": None,
        }
        if p.priority.slo:
            points = {}
            for pid, checks in p.slo.items():
                good = p.goodput.get(pid, {})
                points[pid] = {
                    "meets_all": all(c.status == "meets" for c in checks),
                    "checks": [{"limit": c.limit, "bound": c.bound, "status": c.status, "estimate": _est(c.estimate)}
                               for c in checks],
                    "requests_per_s": _est(good.get("requests_per_s")),
                    "goodput_requests_per_s": _est(good.get("goodput_requests_per_s")),
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
        a, b = _fig(lat, pid), _fig(thr, pid)
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
            "acceptance": s.acceptance, "point_ids": s.point_ids, "gain": _est(s.gain), "gain_text": gain_text(s.gain),
            "top_step": _est(s.top_step), "top_step_text": gain_text(s.top_step), "flat": s.flat}
            for s in diag.series[knob]]
    return {"cell_text": diag.cell, "verdict": diag.verdict, "text": diag.text, "threshold": diag.threshold,
            "series": series,
            "block_pairs": [{"low": b.low, "high": b.high, "low_block_size": b.low_block,
                             "high_block_size": b.high_block, "fixed": b.fixed, "straddles_trained": b.straddles,
                             "gain": _est(b.gain), "gain_text": gain_text(b.gain)} for b in diag.block_pairs],
            "trained_block_size": d.settings.trained_block_size,
            "trained_block_size_source": d.settings.trained_block_size_source}


def _caveats(d: Decisions) -> list[dict[str, Any]]:
    """Every limit on the conclusions found in the data, as generic caveat blocks."""
    results, s = d.results, d.settings
    out: list[dict[str, Any]] = []
    if results.simulated:
        sim = [p.point_id for p in results.points if p.simulated]
        out.append({"kind": "simulated", "title": "Simulated results", "text": (
            f"{len(sim)} of {len(results.points)} points were produced by the simulated server "
            "(`ddsweep sim-server`), not by real hardware: " + ", ".join(f"`{x}`" for x in sim) + ".")})
    undecided = [f"{o.resolved.regime.name}: {o.no_decision}" for o in d.regimes if o.no_decision]
    undecided += [f"priority `{p.name}`: {p.no_decision}" for p in d.priorities if p.no_decision]
    if undecided:
        out.append({"kind": "no_decision", "title": "Decisions not possible", "items": undecided})
    out.append({"kind": "selection", "title": "Selection and multiplicity", "text": (
        f"A winner is named only when it beats every other point by more than {s.equivalence_margin:.0%} "
        f"(analysis.equivalence_margin) in one-sided tests whose family-wise error is held at "
        f"{1 - s.confidence:.0%} (Holm); otherwise the tied set is named. The leader's own figure is "
        "the best of several noisy estimates and so tends to be optimistic (winner's curse); the intervals "
        f"are {s.confidence:.0%} intervals for each figure on its own. " + (
            "Points ran in two or more server launches, and the launch is the unit of every interval and test "
            "(its variance pooled over the study's points, docs/statistics.md)."
            if any(len(f) >= 2 for o in d.regimes for f in o.resolved.launches.values()) else
            "The repeats of one point ran in one server launch, so the intervals do not include variation between "
            "launches or nodes."))})
    drift = drift_caveat(results, [o.resolved for o in d.regimes], s.equivalence_margin, s.confidence)
    if drift:
        out.append(drift)
    measured = measurement_caveat(results.cells)
    if measured:
        out.append(measured)
    reference = reference_caveat(d.reference, s.regimes, s.equivalence_margin, s.confidence)
    if reference:
        out.append(reference)
    items = []
    for c in d.confounds:
        a, b = c.values
        alt = (f"A matched {c.knob} pair to look at instead: `{c.alternative[0]}` vs `{c.alternative[1]}`."
               if c.alternative else f"No matched {c.knob} pair exists in this sweep.")
        items.append(f"**{c.knob} {a} vs {b} is confounded**: no two points differ in {c.knob} alone; the closest "
                     f"pair `{c.pair[0]}` vs `{c.pair[1]}` also differs in {', '.join(c.also_differs)}, so its "
                     f"difference cannot be attributed to {c.knob}. {alt} Adding the point ({c.missing}) would give "
                     "a matched comparison.")
    out.append({"kind": "confounds", "title": "Confounded comparisons", "items": items, "text": None if items else (
        "None: every pair of adjacent knob values is connected by a pair of points that differ in that knob only.")})
    out.append(spread_caveat(d))
    out += workload_caveats(d)
    out += verification_caveats(d)
    out += _coding_caveats(d)
    out += _point_caveats(d)
    aliases = _alias_caveat(d)
    if aliases:
        out.append(aliases)
    return out


def _alias_caveat(d: Decisions) -> dict[str, Any] | None:
    """Points that are one server configuration under different knob names (results/plan.json's groups)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in d.results.plan.values():
        if entry.get("alias_group"):
            groups.setdefault(str(entry["alias_group"]), []).append(entry)
    # groups of this summary's points only (an adaptive study's summary covers the confirmed points)
    measured = {p.point_id for p in d.results.points}
    groups = {rep: members for rep, members in groups.items() if len(members) > 1 and rep in measured}
    if not groups:
        return None
    items = []
    for rep, members in sorted(groups.items()):
        tree = members[0].get("tree") or {}
        shape = (f"{tree.get('shape')}, width {tree.get('width')}, depth limit {tree.get('depth_limit')}"
                 if tree.get("shape") in ("tree", "chain") else str(tree.get("shape") or "unknown tree"))
        measured = [m["point_id"] for m in members if m.get("runs")]
        names = ", ".join(f"`{m['point_id']}`" for m in sorted(members, key=lambda m: m["point_id"]))
        items.append(f"{names}: one server configuration ({shape}); "
                     + (f"measured as `{rep}` only, the others are its aliases" if len(measured) <= 1 else
                        f"{len(measured)} measured separately (sweep.run_aliases): their differences are "
                        "run-to-run noise, not an effect of topk"))
    return {"kind": "alias_groups", "title": "Knob values the engine treats as one configuration", "text": (
        f"{len(groups)} group(s) of points build the same draft tree under the preset's tree rule (for DDTree, "
        "topk caps the tree width, so different topk values often give the same tree). No difference between "
        "members of one group is reported as an effect of a knob."), "items": items}


def spread_caveat(d: Decisions) -> dict[str, Any]:
    """Figures whose interval is wide relative to the figure."""
    threshold = d.settings.spread_warning
    level = d.settings.confidence
    if d.spread.empty:
        return {"kind": "spread", "title": "Run-to-run spread",
                "text": f"No regime figure has a {level:.0%} CI half-width above {threshold:.0%} of its mean."}
    items = []
    for point_id, rows in d.spread.groupby("point_id", sort=False):
        row = rows.iloc[0]
        n = int(row["repeats"])
        figure = (f"± {row['relative_half_width']:.0%} ({level:.0%} CI {row['ci_low']:.4g}–{row['ci_high']:.4g}, "
                  f"{n} repeats)" if interval_meaningful(row["mean"], row["ci_low"], row["ci_high"], n)
                  else f"({no_interval(n)})")
        items.append(f"`{point_id}`: {len(rows)} wide figure(s); widest {row['metric']} at context "
                     f"{row['context']}, C={row['concurrency']}: mean {row['mean']:.4g} {figure}")
    return {"kind": "spread", "title": "Run-to-run spread", "items": items, "text": (
        f"{len(d.spread)} figure(s) of {d.spread['point_id'].nunique()} point(s) have a {level:.0%} CI half-width "
        f"above {threshold:.0%} of the mean; rankings involving them are uncertain (more repeats would narrow "
        "them). Widest figure per point:")}


def _coding_caveats(d: Decisions) -> list[dict[str, Any]]:
    """Coding truncations vs real failures, and output mismatches against `ar`."""
    coding: dict[str, Any] = {"kind": "coding", "title": "Coding check: truncation vs real failures"}
    if d.coding.empty:
        coding["text"] = "No coding results."
    else:
        coding["text"] = ("Answers cut off at the token limit are counted apart from real failures (wrong or "
                          "broken code).")
        coding["table"] = {"columns": ["point", "problems", "passed", "pass rate", "truncated (hit token limit)",
                                       "passed on retry", "real failures", "real failure kinds"],
                           "rows": [[f"`{r.point_id}`", r.problems, r.passed, f"{r.pass_rate:.0%}",
                                     r.truncated_failures, r.passed_after_retry, r.real_failures,
                                     r.real_failure_kinds or "—"] for r in d.coding.itertuples()]}
    lossless: dict[str, Any] = {"kind": "lossless", "title": "Output mismatches vs `ar`"}
    floor = d.lossless.floor
    if not d.lossless.available:
        lossless["text"] = f"Not compared: {d.lossless.reason}."
    elif not d.lossless.by_point:
        lossless["text"] = "Not compared: no point other than `ar` has coding outputs."
    else:
        floor_text = (f"`ar` agreed with itself on {floor['exact_match']}/{floor['compared']} answers "
                      f"({floor['exact_match_rate']:.0%}), the floor every point is compared with; a point is "
                      "flagged only when the upper end of its 95% Wilson interval is below that floor."
                      if floor else "`ar` answered only once, so there is no ar-vs-ar floor and nothing is flagged "
                      "(greedy outputs need not be reproducible at high concurrency or with tensor/expert "
                      "parallelism; coding_eval.ar_repeat measures the floor).")
        lossless["text"] = ("Greedy speculative decoding should reproduce the `ar` outputs. " + floor_text)
        items = []
        for pid, match in sorted(d.lossless.by_point.items()):
            mismatches = match.get("mismatches") or []
            line = (f"`{pid}`: {match.get('exact_match')}/{match.get('compared')} identical "
                    f"({(match.get('exact_match_rate') or 0):.0%}")
            if match.get("ci_low") is not None and match.get("compared"):
                line += f", 95% CI {match['ci_low']:.0%}–{match['ci_high']:.0%}"
            line += ")"
            if match.get("below_floor"):
                line = "**below the ar-vs-ar floor** " + line
            if mismatches:
                line += "; differs in " + ", ".join(
                    f"{m.get('task_id')} (first difference at char {m.get('first_diff_char')}, "
                    f"token {m.get('first_diff_token')})" for m in mismatches[:MAX_LIST])
            items.append(line)
        lossless["items"] = items
    out = [coding, lossless]
    isolation = _isolation_caveat(d)
    if isolation:
        out.append(isolation)
    return out


def _isolation_caveat(d: Decisions) -> dict[str, Any] | None:
    """The sandbox isolation of each point's coding eval, when the study mixes modes or ran without namespaces."""
    modes: dict[str, list[str]] = {}
    for point_id, summary in sorted(d.results.coding_summaries.items()):
        sandbox = summary.get("sandbox") if isinstance(summary, dict) else None
        mode = sandbox.get("isolation") if isinstance(sandbox, dict) else None
        modes.setdefault(str(mode or "unknown"), []).append(point_id)
    if len(modes) <= 1 and "rlimits-only" not in modes:
        return None
    counts = ", ".join(f"{mode} ({len(ids)} point{'s' if len(ids) != 1 else ''})"
                       for mode, ids in sorted(modes.items()))
    text = (f"The study mixes sandbox isolation modes: {counts}." if len(modes) > 1
            else f"Every coding eval ran in {counts}.")
    if "rlimits-only" in modes:
        text += (" Pass rates of rlimits-only points were measured with weaker isolation (no namespaces: candidates "
                 "could reach the network and world-readable files; docs/sandbox.md).")
    return {"kind": "isolation", "title": "Coding sandbox isolation", "text": text,
            "items": [f"{mode}: " + ", ".join(f"`{p}`" for p in ids) for mode, ids in sorted(modes.items())]}


def _point_caveats(d: Decisions) -> list[dict[str, Any]]:
    """Failed, malformed and incomplete points, problems in completed points' files, and mixed machines."""
    results = d.results
    out = [failed_points_caveat(d)]
    hosts = mixed_hosts_caveat(d)
    if hosts:
        out.append(hosts)
    problems = [f"`{p.point_id}`: {'; '.join(p.issues)}" for p in results.points if p.status == "ok" and p.issues]
    problems += [f"`{p.point_id}`: verification.json reports a knob the server did not apply"
                 for p in results.points if p.status == "ok" and p.verification_ok is False]
    if problems:
        out.append({"kind": "data_problems", "title": "Data problems in completed points", "items": problems})
    return out


def _platform(d: Decisions) -> dict[str, Any]:
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


def _reproduce(d: Decisions) -> dict[str, Any]:
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


def _all_points(d: Decisions) -> dict[str, Any]:
    """Every completed point at every regime cell, with its speed-up over `ar`, as a generic table block."""
    ar_id = ar_point_id(d.results)
    level = d.settings.confidence
    coding = d.coding.set_index("point_id") if not d.coding.empty else None
    rows = []
    for p in d.results.ok_points():
        cells = []
        for o in d.regimes:
            r = o.resolved
            fig = _fig(r, p.point_id)
            text = figure_text(r.regime.metric, fig, level)
            speed = r.speedup(p.point_id, ar_id, level) if fig and ar_id and ar_id != p.point_id else None
            cells.append(text + (f" ({speed.value:.2f}×)" if speed else ""))
        rate = (f"{coding.at[p.point_id, 'pass_rate']:.0%}" if coding is not None and p.point_id in coding.index
                else "n/a")
        rows.append([f"`{p.point_id}`", p.label(), *cells, rate])
    return {"kind": "all_points", "title": "All completed points at the regime cells", "table": {
        "columns": ["point", "knobs", *(f"{o.resolved.regime.name} (vs ar)" for o in d.regimes), "coding pass rate"],
        "rows": rows}}


def fmt(metric: str, value: float | None) -> str:
    """Format a figure with precision suited to its metric."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if metric == "acceptance_length":
        return f"{value:.2f}"
    if "tok_s" in metric:
        return f"{value:.1f} tok/s"
    if metric.endswith("per_s"):
        return f"{value:.2f} req/s"
    return f"{value:.3f} s"


def figure_text(metric: str, fig: dict[str, Any] | None, level: float) -> str:
    """'160.0 tok/s (95% CI 156.8–163.2, 3 repeats)'."""
    if not fig or fig.get("value") is None:
        return "n/a"
    if not interval_meaningful(fig["value"], fig.get("ci_low"), fig.get("ci_high"), fig.get("n")):
        return f"{fmt(metric, fig['value'])} ({no_interval(fig.get('n'))})"
    low, high = fmt(metric, fig["ci_low"]).split(" ")[0], fmt(metric, fig["ci_high"]).split(" ")[0]
    return f"{fmt(metric, fig['value'])} ({level:.0%} CI {low}–{high})"


def build_summary(d: Decisions) -> dict[str, Any]:
    """The whole summary document (reports/summary.json)."""
    results, s = d.results, d.settings
    load = load_levels(d)
    decision = decision_block(d, load)
    counts: dict[str, int] = {}
    for p in results.points:
        counts[p.status] = counts.get(p.status, 0) + 1
    return {
        "schema_version": SCHEMA_VERSION, "study": s.study, "note": (s.config or {}).get("note"),
        "simulated": results.simulated, "results_dir": str(results.results_dir), "decision": decision,
        "points": {"total": len(results.points), "by_status": counts},
        "statistics": {"method": METHOD, "confidence": s.confidence, "equivalence_margin": s.equivalence_margin,
                       "min_repeats_for_decision": s.min_repeats, "diagnosis_gain": s.diagnosis_gain,
                       "data_source": sorted(set(results.cells["source"].dropna())) if not results.cells.empty
                       else []},
        "metrics": {m: label for m, label in METRIC_LABELS.items()
                    if any(o.resolved.regime.metric == m for o in d.regimes)},
        "regimes": [_regime(o, s.confidence) for o in d.regimes], "load_levels": load,
        "priorities": _priorities(d), "pareto": _pareto(d, s.confidence), "diagnosis": _diagnosis(d),
        "caveats": _caveats(d), "sections": [_platform(d), _reproduce(d), _all_points(d)],
    }


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
