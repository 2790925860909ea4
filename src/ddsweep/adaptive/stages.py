"""The adaptive study's stage plan: which points each stage runs, their job records and GPU-time plans.

`sweep.strategy: adaptive` replaces the full grid by these stages: the baselines measured once (one launch of
the full matrix with every repeat and the coding eval; they are references, not candidates, and are not screened),
a short screening run of every other point (the selected regimes' cells only, few requests, one launch, no coding
eval), a selection that keeps every point that could still be the best (adaptive/selection.py), an optional
refinement that screens knob values between the grid's (`sweep.refine`, adaptive/refinement.py), and a confirmation
race of the survivors in the grid's launches (`sweep.launches`), the screening standing for the first: the launches
before the last measure the regime cells the race compares with the grid's share of the repeats, the last the whole
matrix with every repeat.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ddsweep.adaptive.refinement import refine_candidates
from ddsweep.analysis.settings import regime_weights
from ddsweep.config.launches import launch_count, split_repeats
from ddsweep.config.plan import (
    benchmark_cells,
    cell_share,
    estimate_minutes,
    expected_cell_minutes,
    running_points,
    warmup_minutes,
)
from ddsweep.config.points import Point, expand_points
from ddsweep.config.records import point_record
from ddsweep.figures import METRICS
from ddsweep.storage import write_json_atomic

STAGES = ("baselines", "screen", "refine", "confirm", "settle")  # the adaptive stages, in order
BASELINE_KINDS = ("ar", "dflash")  # measured once, always kept: the references of the summary's ratios
# The share of windowed cells expected not to settle when neither sweep.screen.unsettled_share nor earlier records
# say: the GPU records' (benchmarks/records/, H200, windows of 8-30 s): 17 of 40 cells did not settle.
DEFAULT_UNSETTLED_SHARE = 17 / 40
STRATEGY_RECORD = "strategy.json"  # under the results directory: the choice of `sweep.strategy: auto`


def is_adaptive(config: dict, results_dir: Path | None = None, write: bool = False) -> bool:
    """Whether the study uses the adaptive strategy (screen, select, refine, confirm): `adaptive`, or `auto`
    when the adaptive study's expected job time is below the grid's (`chosen_strategy`)."""
    strategy = config.get("sweep", {}).get("strategy", "grid")
    return strategy == "adaptive" or (strategy == "auto"
                                      and chosen_strategy(config, results_dir, write)["chosen"] == "adaptive")


def strategy_choice(config: dict, results_dir: Path | None = None) -> dict:
    """The configured strategy, the one that runs and both expected job times (minutes of point jobs, start-ups
    included; the grid's reference runs are not counted), given the share of cells expected not to settle
    (`unsettled_share`: configured, from the records under RESULTS_DIR, or the default): `auto` takes adaptive
    only when it is cheaper."""
    configured = config["sweep"]["strategy"]
    unsettled = unsettled_share(config, results_dir)
    stages = stage_estimates(config, unsettled["share"])
    adaptive = sum(stages[s]["expected_min"] for s in STAGES)
    grid = stages["grid"]["expected_min"]
    chosen = configured if configured != "auto" else ("adaptive" if adaptive < grid else "grid")
    return {"configured": configured, "chosen": chosen, "adaptive_expected_min": adaptive,
            "grid_expected_min": grid, "adaptive_cheaper": adaptive < grid, "unsettled_share": unsettled["share"],
            "unsettled_source": unsettled["source"]}


def chosen_strategy(config: dict, results_dir: Path | None, write: bool = False) -> dict:
    """`strategy_choice`, except that for `auto` the choice recorded in RESULTS_DIR/strategy.json by an earlier
    invocation of the study stands (`recorded`: its path), so that the strategy does not change as the study's own
    records grow; with `write`, a new choice is recorded there."""
    path = Path(results_dir) / STRATEGY_RECORD if results_dir is not None else None
    if config["sweep"]["strategy"] == "auto" and path is not None and path.exists():
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the recorded choice of sweep.strategy auto, {path}: {exc} (delete it to "
                             "choose again)") from exc
        return {**recorded, "recorded": str(path)}
    choice = strategy_choice(config, results_dir)
    if write and path is not None and choice["configured"] == "auto":
        write_json_atomic(path, choice)
    return choice


def recorded_cells(results_dir: Path) -> list[bool]:
    """Whether each windowed cell recorded under RESULTS_DIR settled: the screening jobs', the confirmation and
    grid launches', and the points' not merged from those launches (bench/cells.json `window.stable`)."""
    results = Path(results_dir)
    merged = {p.name for stage in ("confirm", "launches") for p in (results / stage).glob("*") if p.is_dir()}
    paths = [*results.glob("screen/*/bench/cells.json"), *results.glob("confirm/*/launch-*/bench/cells.json"),
             *results.glob("launches/*/launch-*/bench/cells.json"),
             *(p for p in results.glob("points/*/bench/cells.json") if p.parent.parent.name not in merged)]
    flags = []
    for path in paths:
        try:
            cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        except (OSError, ValueError):
            continue
        flags += [bool(c["window"]["stable"]) for c in cells if (c.get("window") or {}).get("stable") is not None]
    return flags


def unsettled_share(config: dict, results_dir: Path | None = None) -> dict:
    """The share of windowed cells expected not to settle, and where it comes from: `sweep.screen.unsettled_share`
    when set, else the share among the cells recorded under RESULTS_DIR (`recorded_cells`), else
    DEFAULT_UNSETTLED_SHARE; 0 for counted cells (`benchmark.min_window_s` 0), which have no window."""
    configured = screen_settings(config).get("unsettled_share")
    if configured is not None:
        return {"share": float(configured), "source": "sweep.screen.unsettled_share"}
    if not config["benchmark"].get("min_window_s"):
        return {"share": 0.0, "source": "counted cells (benchmark.min_window_s 0)"}
    flags = recorded_cells(results_dir) if results_dir is not None else []
    if flags:
        return {"share": flags.count(False) / len(flags),
                "source": f"{flags.count(False)} of {len(flags)} cells recorded under {results_dir}"}
    return {"share": DEFAULT_UNSETTLED_SHARE, "source": "default: 17 of 40 cells of the GPU records "
                                                        "(benchmarks/records/) did not settle"}


def screen_settings(config: dict) -> dict:
    """`sweep.screen` of a validated configuration (the schema fills its defaults)."""
    return config["sweep"]["screen"]


def baseline_ids(config: dict) -> list[str]:
    """Points the selection always keeps: the autoregressive and DFlash baselines."""
    return [p.point_id for p in expand_points(config) if p.kind in BASELINE_KINDS]


def selected_regimes(config: dict) -> list[dict]:
    """The regimes the selection compares and the screening measures: with `sweep.screen.select_on: priorities`
    (the default) and priorities declared, those some priority weighs (a regime no priority weighs decides no
    pick: its leader is reported among the confirmed points); else every regime."""
    analysis = config.get("analysis", {})
    regimes = analysis.get("regimes", [])
    if screen_settings(config).get("select_on", "priorities") != "priorities" or not analysis.get("priorities"):
        return regimes
    weighted = {r for spec in analysis["priorities"].values() for r, w in regime_weights(spec).items() if w > 0}
    return [r for r in regimes if r["name"] in weighted] or regimes


def regime_benchmark(config: dict) -> dict:
    """The benchmark of the selected regimes' cells only (`selected_regimes`), on the primary workload (the one
    the regimes are measured on),
    with the configured requests per cell and one repeat. A workload entry per regime context holds that
    context's regime concurrencies, so no cell outside the regimes runs (a long context at a high concurrency,
    say). The settling launches run it as it is; the screening with fewer requests."""
    bench = copy.deepcopy(config["benchmark"])
    cells: dict[int, set[int]] = {}
    for regime in selected_regimes(config):
        cells.setdefault(regime["context"], set()).add(regime["concurrency"])
    primary = bench["workloads"][0]
    if cells:
        bench["contexts"] = sorted(cells)
        bench["concurrency"] = sorted(set().union(*cells.values()))
        bench["workloads"] = [{**primary, "contexts": [context], "concurrency": sorted(concurrency)}
                              for context, concurrency in sorted(cells.items())]
    else:
        bench["workloads"] = [{**primary, "contexts": None, "concurrency": None}]
    bench["repeats"] = 1
    return bench


def screen_benchmark(config: dict) -> dict:
    """The screening benchmark: the regimes' cells (`regime_benchmark`) with `sweep.screen.requests_per_cell`."""
    return {**regime_benchmark(config), "requests_per_cell": screen_settings(config)["requests_per_cell"]}


def primary_workload(config: dict) -> str:
    """The name of the workload the regimes are measured on: the first of `benchmark.workloads`."""
    return config["benchmark"]["workloads"][0]["name"]


def screen_record(config: dict, point: Point) -> dict:
    """The run-point record of a screening job: the screening benchmark and no coding eval."""
    record = point_record(config, point)
    record["benchmark"] = screen_benchmark(config)
    record["coding_eval"] = {**record["coding_eval"], "enabled": False}
    record["stage"] = "screen"
    return record


def confirm_record(config: dict, point: Point, launch: int) -> dict:
    """The run-point record of confirmation launch `launch` (its repeats: `confirm_shares`). The race's launches
    before the last run the regime cells only (`regime_benchmark`: all the race compares); the last configured
    launch, which only the points still in the race reach, runs the whole matrix with every repeat and the coding
    eval. A baseline's launch 0 is its one measurement: every repeat and the coding eval. A settling launch (after
    the configured ones) runs the regime cells only, one repeat, with no coding eval."""
    record = point_record(config, point)
    configured = confirm_launches(config)
    baseline = point.kind in BASELINE_KINDS and launch == 0
    if launch >= configured:
        record["benchmark"] = regime_benchmark(config)
    elif not baseline:
        record["benchmark"] = confirm_benchmark(config, launch)
    if launch != configured - 1 and not baseline:
        record["coding_eval"] = {**record["coding_eval"], "enabled": False}
    record["stage"] = "baseline" if baseline else "confirm" if launch < configured else "settle"
    record["launch"] = launch
    return record


def confirm_benchmark(config: dict, launch: int) -> dict:
    """The benchmark of a candidate's configured confirmation launch `launch`: the regime cells before the last
    launch, the whole matrix in it, with the launch's repeats (`confirm_shares`)."""
    last = launch == confirm_launches(config) - 1
    matrix = config["benchmark"] if last else regime_benchmark(config)
    return {**copy.deepcopy(matrix), "repeats": confirm_shares(config)[launch]}


def confirm_launches(config: dict) -> int:
    """Fresh server launches per confirmed point: the grid's (`sweep.launches`, at most one per repeat)."""
    return launch_count(config)


def first_confirm_launch(config: dict) -> int:
    """The first confirmation launch a candidate runs: 1 where the study has several launches (its screening job,
    a launch of the regime cells, stands for launch 0, so a confirmed candidate starts as many servers as a grid
    point does), else 0 (the one launch must run the whole matrix). The baselines run launch 0 only."""
    return 1 if confirm_launches(config) > 1 else 0


def confirm_shares(config: dict) -> list[int]:
    """Repeats of each confirmation launch. The race's launches before the last (the regime cells only) take the
    configured repeats split as in the grid, the smaller share first, so that a point the race drops after its
    first launch has spent the least; the last launch, the only one of the whole matrix, runs every repeat, so
    that each cell of a confirmed point has the configured repeats, as a baseline's one launch has."""
    repeats = int(config["benchmark"].get("repeats", 3))
    return [*split_repeats(repeats, confirm_launches(config))[::-1][:-1], repeats]


def settle_launches(config: dict) -> int:
    """Most settling launches after the configured ones (`sweep.screen.settle_launches`)."""
    return int(screen_settings(config).get("settle_launches") or 0)


def screen_ids(config: dict) -> list[str]:
    """The points the screening runs: every configured point that runs (one per alias group, docs/adaptive.md)
    but the baselines, whose one full launch (`confirm_record`) stands for their screening."""
    return [p.point_id for p in running_points(config) if p.kind not in BASELINE_KINDS]


def _max_refinements(config: dict, points: list[Point]) -> int:
    """Upper bound on refinement points: every refinement candidate of every grid point."""
    return len(refine_candidates(config, [p.point_id for p in points]))


def windowed_regime_cells(config: dict) -> int:
    """The distinct selected regime cells whose figure depends on the window settling (not acceptance)."""
    return len({(r["context"], r["concurrency"]) for r in selected_regimes(config)
                if METRICS.get(r["metric"]) is None or METRICS[r["metric"]].windowed})


def running_baselines(config: dict) -> list[str]:
    """The baselines that run (`BASELINE_KINDS`), each measured once in its confirmation launch 0."""
    return [p.point_id for p in running_points(config) if p.kind in BASELINE_KINDS]


def job_minutes(config: dict, unsettled: float = 0.0) -> dict:
    """Minutes of each kind of adaptive job in the plan's cost model (`resources.estimate`), where a share
    `unsettled` of the cells runs to its cap: a screening job, each confirmation launch (`launches`, its share of
    the repeats: the regime cells before the last, the whole matrix in the last), the coding eval (in the last
    configured launch), a baseline's one launch (every repeat and the coding eval) and a settling launch."""
    est = config["resources"]["estimate"]
    sbench = screen_benchmark(config)
    bench = config["benchmark"]

    def regime_job(requests: int | None, repeats: int = 1) -> float:
        """Minutes of one job of the regime cells at `requests` per cell, `repeats` times; a cell never shorter
        than its minimum window (`benchmark.min_window_s`), which every measured cell runs, and a share `unsettled`
        at its cap."""
        return est["startup_min"] + warmup_minutes(sbench) + repeats * sum(
            expected_cell_minutes(max(cell_share(c, requests, bench["requests_per_cell"]) * est["cell_min"],
                                      sbench.get("min_window_s", 0) / 60), sbench, unsettled)
            for _, c in benchmark_cells(sbench))

    def one_launch(repeats: int, coding: bool) -> float:
        """Minutes of one launch of the full matrix with `repeats` repeats (one start-up), with or without the
        coding eval."""
        single = copy.deepcopy(config)
        single["benchmark"]["repeats"] = repeats
        single["sweep"]["launches"] = 1
        single["sweep"]["strategy"] = "grid"
        single["coding_eval"] = {**config["coding_eval"], "enabled": coding and config["coding_eval"]["enabled"]}
        return estimate_minutes(single, 1, unsettled)["per_point_min"]

    *racing, last = confirm_shares(config)
    return {"screen": regime_job(sbench["requests_per_cell"]),
            "launches": [*(regime_job(bench["requests_per_cell"], share) for share in racing),
                         one_launch(last, False)],
            "coding": est["coding_min"] if config["coding_eval"]["enabled"] else 0.0,
            "baseline": one_launch(int(bench.get("repeats", 3)), True),
            "settle": regime_job(bench["requests_per_cell"])}


def stage_estimates(config: dict, unsettled: float = 0.0) -> dict[str, dict[str, float]]:
    """Worst-case, expected and best-case job minutes of each adaptive stage, and of the full grid (the points that
    run), for `ddsweep plan`, where a share `unsettled` of the cells does not settle. Such a cell runs to its cap (in
    both strategies), and the expected case counts every screened point with an unsettled selected cell as a
    survivor: the selection drops it only when even its widened band lies below the best, which the plan does not
    count on. The best case is the least the study can cost: the screening drops every candidate but one, and no
    refinement point survives; the baselines and the screening are paid in every case."""
    points = running_points(config)
    n_base = len(running_baselines(config))
    n = len(points) - n_base  # the candidates: every running point but the baselines
    screen_cfg = screen_settings(config)
    jobs = job_minutes(config, unsettled)
    n_refine = _max_refinements(config, points)
    fraction = screen_cfg["expected_survivors"]
    # a screened point with an unsettled selected cell is counted as a survivor
    kept = 1 - (1 - unsettled) ** windowed_regime_cells(config) * (1 - fraction)
    in_race, expected_in_race = race_bound(config), race_expected(config)
    first, later = jobs["launches"][0], sum(jobs["launches"][1:])

    def confirm_min(entering: float, cap: float | None) -> float:
        """With one launch, every entering candidate runs it and the coding eval. With several, the screening
        stands for the first and at most `cap` (None: all) run the later ones, and the coding eval in the last."""
        if len(jobs["launches"]) <= 1:
            return entering * (first + jobs["coding"])
        going_on = entering if cap is None else min(entering, cap)
        return going_on * (later + jobs["coding"])

    keep = screen_cfg.get("race_keep")
    settling = min(n + n_base + n_refine, keep * len(config.get("analysis", {}).get("priorities", {})) if keep
                   else n + n_base + n_refine) if settle_launches(config) else 0
    settle_min = settle_launches(config) * settling * jobs["settle"]
    # the grid as it would run: its own launches per point (sweep.launches), whatever strategy is configured
    as_grid = {**config, "sweep": {**config["sweep"], "strategy": "grid"}}
    grid = estimate_minutes(as_grid, len(points), unsettled)["total_min"]
    return {
        "grid": {"points": len(points), "worst_min": grid, "expected_min": grid, "best_min": grid},
        "baselines": {"points": n_base, "worst_min": n_base * jobs["baseline"],
                      "expected_min": n_base * jobs["baseline"], "best_min": n_base * jobs["baseline"]},
        "screen": {"points": n, "worst_min": n * jobs["screen"], "expected_min": n * jobs["screen"],
                   "best_min": n * jobs["screen"]},
        "refine": {"points": n_refine, "worst_min": n_refine * jobs["screen"],
                   "expected_min": fraction * n_refine * jobs["screen"], "best_min": 0.0},
        "confirm": {"points": n + n_refine, "worst_min": confirm_min(n + n_refine, in_race),
                    "expected_min": confirm_min(kept * n + fraction * kept * n_refine, expected_in_race),
                    "best_min": confirm_min(min(1, n), in_race)},
        "settle": {"points": settling, "worst_min": settle_min, "expected_min": settle_min, "best_min": settle_min},
    }


def race_bound(config: dict) -> int | None:
    """Most candidates that can run the confirmation launches after the first: `sweep.screen.race_keep` per
    priority (per selected regime and priority with `select_on: regimes`; None: no cap)."""
    keep = screen_settings(config).get("race_keep")
    if not keep:
        return None
    return keep * len(selection_places(config))


def race_expected(config: dict) -> int | None:
    """Candidates expected to run the later confirmation launches: `sweep.screen.race_keep` per priority, the
    regimes' leaders mostly being among the priorities' (None: no cap)."""
    keep = screen_settings(config).get("race_keep")
    if not keep:
        return None
    return keep * max(1, len(config.get("analysis", {}).get("priorities", {})))


def selection_places(config: dict) -> list[str]:
    """Where the selection compares the points: `priority NAME` for each priority with `select_on: priorities`
    (the default) where priorities are declared, else `regime NAME` for each selected regime and each priority."""
    analysis = config.get("analysis", {})
    priorities = [f"priority {name}" for name in analysis.get("priorities", {})]
    if priorities and screen_settings(config).get("select_on", "priorities") == "priorities":
        return priorities
    return [*(f"regime {r['name']}" for r in selected_regimes(config)), *priorities]


def format_stage_plan(config: dict, results_dir: Path | None = None) -> list[str]:
    """Plan lines for an adaptive study: each stage's worst-case and expected GPU time next to the grid's, given
    the share of cells expected not to settle (from the records under RESULTS_DIR, when any)."""
    if config["sweep"]["strategy"] == "grid":
        return []
    gpus = config.get("resources", {}).get("gpus", 8)
    unsettled = unsettled_share(config, results_dir)
    stages = stage_estimates(config, unsettled["share"])
    fraction = screen_settings(config)["expected_survivors"]

    def hours(minutes: float) -> str:
        wall = f"{minutes / 60:6.1f} h" if minutes >= 120 else f"{minutes:4.1f} min"
        return f"{wall} = {minutes * gpus / 60:6.0f} GPU-h"

    bound = race_bound(config)
    race = (f"of the points entering the confirmation, at most {bound} run the later confirmation launches "
            "(sweep.screen.race_keep per place the selection compares), expected "
            f"{race_expected(config)} (race_keep per priority); the baselines run one launch of every repeat"
            if bound is not None else "every point entering the confirmation may run every confirmation launch")
    if first_confirm_launch(config):
        race = f"the screening stands for each candidate's first launch; {race}"
    settle = (f"settling: at most {settle_launches(config)} launch(es) of the regime cells for at most "
              f"{stages['settle']['points']} points, counted at that bound in both columns"
              if settle_launches(config) else "settling: none (sweep.screen.settle_launches: 0)")
    lines = ["", f"adaptive strategy (expected: {fraction:.0%} of the non-baseline points survive the screening)",
             f"cells not settling: {unsettled['share']:.0%} expected ({unsettled['source']}); each runs to "
             "benchmark.max_window_s in both strategies, and a screened point with one is counted as a survivor",
             race, settle,
             f"{'stage':<10} {'points':>7}  {'worst case':>25}  {'expected':>25}  {'best case':>25}"]
    cases = ("worst_min", "expected_min", "best_min")
    for name in STAGES:
        s = stages[name]
        lines.append(f"{name:<10} {s['points']:>7}  " + "  ".join(f"{hours(s[c]):>25}" for c in cases))
    worst, expected, best = (sum(stages[s][c] for s in STAGES) for c in cases)
    grid = stages["grid"]["expected_min"]
    lines.append(f"{'adaptive':<10} {'':>7}  " + "  ".join(f"{hours(m):>25}" for m in (worst, expected, best)))
    lines.append(f"{'full grid':<10} {stages['grid']['points']:>7}  " + "  ".join(f"{hours(grid):>25}" for _ in cases))
    lines.append(f"best case: the screening drops every candidate but one; even then the adaptive study costs "
                 f"{best / grid:.0%} of the grid, the baselines (one launch of every repeat each) and the screening "
                 f"{(stages['baselines']['best_min'] + stages['screen']['best_min']) / grid:.0%}")
    choice = chosen_strategy(config, results_dir)
    if expected >= stages["grid"]["expected_min"]:
        lines.append(f"WARNING: the adaptive study is not expected to be cheaper than the grid here "
                     f"({hours(expected).strip()} expected against {hours(stages['grid']['expected_min']).strip()}, "
                     f"with {unsettled['share']:.0%} of the cells not settling)")
    if choice["configured"] == "auto":
        lines.append(f"sweep.strategy auto: runs {choice['chosen']} (adaptive only when its expected job time is "
                     "below the grid's" + (f"; as chosen before, {choice['recorded']}: delete it to choose again)"
                                           if choice.get("recorded") else ")"))
    return lines
