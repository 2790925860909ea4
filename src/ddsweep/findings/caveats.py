"""The summary's caveats: every limit on the conclusions found in the data, as generic blocks
(``{"kind", "title", "text", "table", "items", "code", "text_after"}``) of the decision object."""

from __future__ import annotations

from typing import Any

from ddsweep.analysis.decisions import Decisions
from ddsweep.analysis.diagnosis import MAX_LIST
from ddsweep.analysis.drift import drift_caveat, reference_caveat
from ddsweep.findings.measurement import verification_caveats, workload_caveats
from ddsweep.findings.operations import failed_points_caveat, mixed_hosts_caveat
from ddsweep.findings.quality import measurement_caveat
from ddsweep.formatting import interval_meaningful, no_interval


def caveats(d: Decisions) -> list[dict[str, Any]]:
    """Every limit on the conclusions found in the data, as generic caveat blocks."""
    results, s = d.results, d.settings
    out: list[dict[str, Any]] = []
    if results.simulated:
        sim = [p.point_id for p in results.points if p.simulated]
        out.append({"kind": "simulated", "title": "Simulated results", "text": (
            f"{len(sim)} of {len(results.points)} points were produced by the simulated server "
            "(`ddsweep sim-server`), not by real hardware: " + ", ".join(f"`{x}`" for x in sim) + ".")})
    one_launch = sorted({pid for o in d.regimes for pid in o.resolved.repeats
                         if len(o.resolved.launches.get(pid, {})) < 2})
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
            "between them (its variance pooled over the study's points, docs/statistics.md)."
            + (f" {', '.join(f'`{p}`' for p in one_launch)} ran in one launch: a comparison with "
               f"{'it' if len(one_launch) == 1 else 'them'} pairs the repeats, and its interval holds the variation "
               "within that launch only." if one_launch else "") + _race_cells_text(s.config)
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


def _race_cells_text(config: dict[str, Any] | None) -> str:
    """In an adaptive study of several confirmation launches: which cells ran in one launch per point."""
    sweep = (config or {}).get("sweep") or {}
    if sweep.get("strategy") != "adaptive" or int(sweep.get("launches") or 1) < 2:
        return ""
    return (" In this adaptive study only the cells the selection compares ran in every launch: a candidate's "
            "screening, which stands for its first launch, and the confirmation's launches before the last measure "
            "those alone, so every other cell of a point ran in one launch (the confirmation's last, or a "
            "baseline's one), with every repeat, and its interval holds the variation within that launch only.")


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
                      "flagged only when a one-sided Fisher exact test puts its rate below the floor's, with a "
                      f"{1 - d.settings.confidence:.0%} chance over all points together that any is flagged wrongly "
                      "(Bonferroni). The floor comes from two runs of one server: a correct speculative build can "
                      "still fall below it where verifying several tokens in one forward pass changes the numerics "
                      "of near-ties, so a flag asks for a look at the differing answers before it is read as a bug."
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
                line += f", {d.settings.confidence:.0%} CI {match['ci_low']:.0%}–{match['ci_high']:.0%}"
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
