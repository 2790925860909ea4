"""Grid versus adaptive strategy over the stand-in's known performance surface (SIMULATED).

Both strategies run on the default study (config/config.yaml: 62 points, its regimes and priorities), with
`sweep.refine` stepping the budget by 2 for the adaptive one. Measurements are emulated from the stand-in's
own model (`ddsweep.sim.model`: acceptance per verify step from `depth_probabilities` for the primary workload's
prompt kind, step times from `step_time_s` at the batch still running, prefill from `prefill_time_s`, requests
that stop at their natural end of sequence) instead of starting a server per job, so a whole study takes
seconds: every request's acceptance is the mean of its verify steps' draws (normal approximation of that mean),
and every server launch scales all step times by exp(N(0, launch_cv)), as `ddsweep sim-server
--sim-launch-noise` does. `bench_emulation.py` compares the emulation with the stand-in itself. The selection is
the package's own (`ddsweep.adaptive.selection.select_round`, on request records in the requests.jsonl schema);
job records and refinement come from `ddsweep.adaptive.stages` and `ddsweep.adaptive.refinement`.

- grid: every point once, `benchmark.repeats` repeats within one launch; figure = mean of the repeats.
- reference: the same grid run again with fresh launch and request noise (seed `grid-rerun-<seed>`): how often a
  study that is as good as the grid repeats the grid's correct picks. Launch noise is independent between
  studies, as it is between two studies on a cluster, so "correct where the grid is" has this floor.
- adaptive: every point screened (one launch, `sweep.screen.requests_per_cell`, regime cells), selection,
  refinement points screened, final selection (with several launches, the race's first round: the screening
  stands for launch 0), then the confirmation race: launch k of every point still in it, and after each launch but
  the last the package's race selection (`ddsweep.adaptive.race.race_round`, with `sweep.screen.race_keep`); the
  launches before the last cost a launch of the regime cells, the last one of the whole matrix and the coding eval,
  as the workflow runs them (`ddsweep.adaptive.stages.confirm_record`); figure = mean of the confirmed point's
  launches, its screening among them where it stood for launch 0.

Both recommend per priority the point with the best priority score (the weighted geometric mean of regime
figures relative to the best, as the summary ranks them). A recommendation is correct when its true priority
score is within `--margin` of the best true score over the grid's points; true figures are the expectation of
the emulated cell without launch noise (400 cells per point and regime). Point-job time is
counted with the study's cost model (`resources.estimate`: startup, per-cell and coding minutes), over the jobs
each strategy actually ran, as `ddsweep plan` counts it: every workload's cells, and a cell with fewer requests
than a full one in waves of C requests (`ddsweep.config.plan.cell_share`).

Cells are counted (`benchmark.min_window_s: 0`): the emulated requests carry no timing a window could be cut from.
`--unsettled` keeps the default config's windows, and the stability check then finds every screened cell unsettled:
a study whose every cell drifts.

Usage: python benchmarks/bench_adaptive.py [--seeds 10] [--launch-cv 0.04] [--assumed-cv 0.04] [--margin 0.02]
       [--refine-step 2] [--confidence 0.9] [--race-keep 2] [--settle-launches 1] [--budgets 4,8,12,16]
       [--unsettled]
"""

from __future__ import annotations

import argparse
import copy
import functools
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ddsweep.adaptive.race import race_round
from ddsweep.adaptive.refinement import resolve_point
from ddsweep.adaptive.screening import estimate
from ddsweep.adaptive.selection import select_round
from ddsweep.adaptive.stages import (
    confirm_benchmark,
    confirm_launches,
    first_confirm_launch,
    regime_benchmark,
    running_baselines,
    screen_benchmark,
    settle_launches,
)
from ddsweep.config.plan import benchmark_cells, cell_requests, cell_share, running_points
from ddsweep.config.points import Point
from ddsweep.config.study import validate_config
from ddsweep.sim.model import Knobs, ModelParams, depth_probabilities, prefill_time_s, step_time_s

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ModelParams()


def study(assumed_cv: float, refine_step: int, confidence: float | None = None, race_keep: int | None = None,
          budgets: list[int] | None = None, settle: int | None = None, unsettled: bool = False,
          screen_requests: int = 8) -> dict:
    """The default study as an adaptive one, refining the budget in steps of `refine_step` (0: no refinement);
    `confidence`, `race_keep` (0: no cap), the grid's `budgets` and `settle` (the most settling launches)
    override the defaults when given. Its cells are counted (no window), unless `unsettled`: then they keep the
    default config's windows, and since the emulated requests carry no timing a window could be cut from, the
    stability check finds every screened cell unsettled (widened by the tolerance, never a settled leader)."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["benchmark"]["requests_per_cell"] = 32  # fixed, so the cost model's cell time has one meaning
    if not unsettled:
        config["benchmark"]["min_window_s"] = 0
    if budgets:
        config["sweep"]["grid"]["budget"] = budgets
    screen = {"requests_per_cell": screen_requests, "launch_cv": assumed_cv}
    if confidence:
        screen["confidence"] = confidence
    if race_keep is not None:
        screen["race_keep"] = race_keep or None
    if settle is not None:
        screen["settle_launches"] = settle
    config["sweep"].update({"strategy": "adaptive", "refine": {"budget": refine_step} if refine_step else {},
                            "screen": screen})
    return validate_config(config)


def knobs_of(point: Point) -> Knobs:
    """The stand-in's knobs for a point."""
    return Knobs(point.kind, point.budget, point.topk, point.block_size, point.window)


def prompt_kind(config: dict) -> str:
    """The stand-in's prompt kind of the primary workload, whose cells the regimes measure: code for the coding
    workload (HumanEval prompts hold Python), prose otherwise (`ddsweep.sim.model.prompt_kind`)."""
    return "code" if config["benchmark"]["workloads"][0]["kind"] == "coding" else "prose"


def stops_at_eos(config: dict) -> bool:
    """Whether the primary workload's requests stop at their natural end of sequence (`ignore_eos` off)."""
    return not config["benchmark"]["workloads"][0].get("ignore_eos", False)


def accept_moments(knobs: Knobs, kind: str) -> tuple[float, float]:
    """Mean and standard deviation of the tokens one verify step accepts (bonus token included), for the
    stand-in's prompt kind."""
    if knobs.kind == "ar":
        return 1.0, 0.0
    survive, pmf_tail = 1.0, [1.0]
    for p in depth_probabilities(PARAMS, knobs, kind):
        survive *= p
        pmf_tail.append(survive)  # P(accepted >= j + 1)
    mean = sum(pmf_tail)
    second = sum((2 * j + 1) * tail for j, tail in enumerate(pmf_tail))  # E[X^2] = sum (2j+1) P(X > j)
    return mean, math.sqrt(max(0.0, second - mean * mean))


def natural_length(prompts: str | None, context: int, concurrency: int, index: int, rng: random.Random) -> int:
    """Where request `index` of a cell stops at end of sequence: uniform over 16–2047 tokens, as the stand-in's
    `natural_length`. The benchmark sends every point the same prompts for a job of the same matrix, and decoding
    is lossless, so a prompt set (`prompts`) gives every point and launch the same lengths; None draws a fresh
    set (the truth's average over prompt sets)."""
    if prompts is None:
        return 16 + rng.randrange(2032)
    return 16 + random.Random(f"length-{prompts}-{context}-{concurrency}-{index}").randrange(2032)


def requests(knobs: Knobs, context: int, concurrency: int, n: int, tokens: int, factor: float,
             rng: random.Random, kind: str = "code", eos: bool = True, prompts: str | None = None) -> list[dict]:
    """One cell's measured requests (requests.jsonl schema), emulated from the stand-in's model. Requests run in
    waves of `concurrency`; a request stops at `tokens` or, with `eos`, at its natural end (`natural_length` of
    the prompt set `prompts`); the requests of a wave advance one verify step per server step, whose time follows
    the batch as the wave's requests finish (`step_time_s`), as in the stand-in's scheduler."""
    mean, sd = accept_moments(knobs, kind)
    out, clock = [], 0.0
    for wave in range(0, n, concurrency):
        size = min(n, wave + concurrency) - wave
        prefill = prefill_time_s(PARAMS, context) * size  # the wave's prompts are prefilled in its first step
        wave_requests = []
        for i in range(wave, wave + size):
            length = min(tokens, natural_length(prompts, context, concurrency, i, rng)) if eos else tokens
            acc = max(1.0, rng.gauss(mean, sd / math.sqrt(length / mean))) if sd else mean
            wave_requests.append((i, length, length / acc))  # index, tokens, verify steps
        decode, done, elapsed = {}, 0.0, 0.0
        for rank, (i, _, steps) in enumerate(sorted(wave_requests, key=lambda r: r[2])):
            elapsed += (steps - done) * step_time_s(PARAMS, knobs, size - rank) * factor
            done, decode[i] = steps, elapsed
        for i, length, steps in wave_requests:
            out.append({"context": context, "concurrency": concurrency, "repeat": 0, "index": i, "warmup": False,
                        "error": None, "completion_tokens": length,
                        "chunks": [[prefill, 1], [prefill + decode[i], length]],
                        "e2e_s": prefill + decode[i], "start_ts": clock, "end_ts": clock + prefill + decode[i],
                        "spec_verify_ct": round(steps) if knobs.kind != "ar" else None,
                        "acceptance_length": length / steps if knobs.kind != "ar" else None})
        clock += prefill + max(decode.values())
    return out


@functools.cache
def true_value(knobs: Knobs, metric: str, context: int, concurrency: int, tokens: int, n: int,
               kind: str = "code", eos: bool = True) -> float:
    """The regime figure's expectation without launch noise: the mean figure of 400 emulated cells of `n`
    requests (the measurement's own definition: a median over requests, tokens over the cell's wall time, or
    tokens over verify steps; `ar` accepts one token per step and reports no verify steps)."""
    if metric == "acceptance_length" and knobs.kind == "ar":
        return 1.0
    rng = random.Random(f"truth-{knobs}-{metric}-{context}-{concurrency}-{n}-{tokens}-{kind}-{eos}")
    cells = [requests(knobs, context, concurrency, cell_requests(concurrency, n), tokens, 1.0, rng, kind, eos)
             for _ in range(400)]
    return statistics.fmean(estimate(cell, metric, context, concurrency, 0.0).value for cell in cells)


def regime_cells(config: dict) -> list[tuple[int, int]]:
    """The distinct (context, concurrency) cells of the regimes."""
    return sorted({(r["context"], r["concurrency"]) for r in config["analysis"]["regimes"]})


def measure(config: dict, point: Point, n: int, factor: float, rng: random.Random, prompts: str) -> list[dict]:
    """One launch's (or repeat's) requests at every regime cell: `n` per cell, at least the cell's concurrency
    (the benchmark's rule), on the prompt set `prompts` (the same for every point)."""
    tokens = config["benchmark"]["max_new_tokens"]
    return [r for ctx, c in regime_cells(config)
            for r in requests(knobs_of(point), ctx, c, cell_requests(c, n), tokens, factor, rng,
                              prompt_kind(config), stops_at_eos(config), prompts)]


def figures(config: dict, runs: list[list[dict]]) -> dict[str, float]:
    """Per regime, the mean over runs (repeats or launches) of the run's figure, as the summary's t-interval."""
    out = {}
    for regime in config["analysis"]["regimes"]:
        values = [e.value for run in runs
                  if (e := estimate(run, regime["metric"], regime["context"], regime["concurrency"], 0.0))]
        if values:
            out[regime["name"]] = statistics.fmean(values)
    return out


def priority_score(weights: dict[str, float], figures: dict[str, float], best: dict[str, float]) -> float:
    """The summary's priority score: the weighted geometric mean of the regime figures relative to the best."""
    total = sum(weights.values())
    return math.exp(sum(w / total * math.log(figures[r] / best[r]) for r, w in weights.items()))


def recommend(config: dict, figs: dict[str, dict[str, float]]) -> dict[str, str]:
    """Per priority, the point with the best priority score, as the summary ranks them."""
    picks = {}
    for name, weights in config["analysis"]["priorities"].items():
        best = {r: max(f[r] for f in figs.values() if r in f) for r in weights}
        scores = {pid: priority_score(weights, f, best) for pid, f in figs.items() if all(r in f for r in weights)}
        picks[name] = max(scores, key=lambda p: (scores[p], p))
    return picks


def true_scores(config: dict, points: list[Point], reference: list[Point]) -> dict[str, dict[str, float]]:
    """Per priority, each point's true score, each regime normalised by the best true figure among `reference`."""
    tokens, n = config["benchmark"]["max_new_tokens"], config["benchmark"]["requests_per_cell"]

    def truth(p: Point) -> dict[str, float]:
        return {r["name"]: true_value(knobs_of(p), r["metric"], r["context"], r["concurrency"], tokens, n,
                                      prompt_kind(config), stops_at_eos(config))
                for r in config["analysis"]["regimes"]}

    values = {p.point_id: truth(p) for p in points}
    ref = [truth(p) for p in reference]
    out = {}
    for name, weights in config["analysis"]["priorities"].items():
        best = {r: max(t[r] for t in ref) for r in weights}
        out[name] = {pid: priority_score(weights, t, best) for pid, t in values.items()}
    return out


def job_minutes(config: dict, bench: dict, coding: bool) -> float:
    """A job's minutes in the study's cost model (resources.estimate, as `ddsweep plan` counts them): each cell of
    `bench` takes its share of a full cell's (`benchmark.requests_per_cell`) time."""
    est, full = config["resources"]["estimate"], config["benchmark"]["requests_per_cell"]
    share = sum(cell_share(c, bench["requests_per_cell"], full) for _, c in benchmark_cells(bench))
    return est["startup_min"] + share * bench["repeats"] * est["cell_min"] + (est["coding_min"] if coding else 0.0)


def run_grid(config: dict, rng: random.Random, launch_cv: float) -> tuple[dict[str, str], float]:
    """Every point, one launch with the configured repeats."""
    bench = config["benchmark"]
    n, repeats = bench["requests_per_cell"], bench["repeats"]
    figs, minutes = {}, 0.0
    for point in running_points(config):
        factor = math.exp(rng.gauss(0, launch_cv))
        figs[point.point_id] = figures(config, [measure(config, point, n, factor, rng, f"grid-repeat-{r}")
                                                for r in range(repeats)])
        minutes += job_minutes(config, bench, True)
    return recommend(config, figs), minutes


def run_adaptive(config: dict, rng: random.Random, launch_cv: float, workdir: Path) -> tuple[dict[str, str], float,
                                                                                              dict[str, int]]:
    """The baselines' one launch each, screen the others, select, refine, select, then the confirmation race in
    the grid's launches; the selections read request files as in the workflow (WORKDIR/screen/<id>/,
    WORKDIR/confirm/<id>/launch-<k>/)."""
    import json

    bench, sbench = config["benchmark"], screen_benchmark(config)
    n_screen = sbench["requests_per_cell"]
    points = {p.point_id: p for p in running_points(config)}
    minutes = 0.0

    def write_launch(directory: Path, records: list[dict]) -> None:
        (directory / "bench").mkdir(parents=True, exist_ok=True)
        (directory / "bench" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (directory / "status.json").write_text("{}")

    baselines = set(running_baselines(config))
    runs: dict[str, list[list[dict]]] = {}
    first = first_confirm_launch(config)

    def screen(point: Point) -> None:
        """A screening job; where it stands for the candidate's launch 0, its requests are merged as that launch."""
        nonlocal minutes
        records = measure(config, point, n_screen, math.exp(rng.gauss(0, launch_cv)), rng, "screen")
        write_launch(workdir / "screen" / point.point_id, records)
        if first:
            runs[point.point_id] = [records]
        minutes += job_minutes(config, sbench, False)

    def launch(point: Point, k: int, matrix: dict, coding: bool) -> None:
        """Launch k of a point: `matrix`'s repeats at one launch factor, written as one launch; it costs a launch of
        `matrix` (a baseline's: every cell and repeat; a candidate's: `confirm_benchmark`)."""
        nonlocal minutes
        factor = math.exp(rng.gauss(0, launch_cv))
        reps = [measure(config, point, bench["requests_per_cell"], factor, rng, f"confirm-repeat-{r}")
                for r in range(matrix["repeats"])]
        runs.setdefault(point.point_id, []).extend(reps)
        write_launch(workdir / "confirm" / point.point_id / f"launch-{k}", [r for rep in reps for r in rep])
        minutes += job_minutes(config, matrix, coding)

    for point in points.values():  # the baselines once, every repeat and the coding eval; the others screened
        if point.point_id in baselines:
            launch(point, 0, bench, True)
        else:
            screen(point)
    round1 = select_round(config, workdir / "screen", [p for p in points if p not in baselines], None,
                          workdir / "confirm")
    refined = {pid: resolve_point(config, pid) for pid in round1.refine}  # as the workflow screens them
    for point in refined.values():
        screen(point)
    race = select_round(config, workdir / "screen", [], round1.to_json(), workdir / "confirm")
    all_points = {**points, **refined}
    entered = len([p for p in race.survivors if p not in baselines])
    last = confirm_launches(config) - 1
    for k in range(first, last + 1):
        for pid in race.survivors:  # launch k of every candidate still in the race (interleaved in the workflow)
            if pid not in baselines:
                launch(all_points[pid], k, confirm_benchmark(config, k), k == last)
        if k < last:
            race = race_round(config, workdir / "screen", workdir / "confirm", race.to_json(), k)
    settle_bench, settled, k = regime_benchmark(config), 0, last
    while settle_launches(config):  # the settling rounds: the unsettled leaders and rivals run the regime cells
        race = race_round(config, workdir / "screen", workdir / "confirm", race.to_json(), k)
        if not race.settle:
            break
        k += 1
        for pid in race.settle:
            records = measure(config, all_points[pid], bench["requests_per_cell"],
                              math.exp(rng.gauss(0, launch_cv)), rng, "settle")
            runs[pid].append(records)
            write_launch(workdir / "confirm" / pid / f"launch-{k}", records)
            minutes += job_minutes(config, settle_bench, False)
            settled += 1
    figs = {pid: figures(config, runs[pid]) for pid in race.survivors}
    funnel = {"screened": len(points), "refined": len(refined), "confirmed": f"{entered}→{len(race.survivors)}",
              "settling": settled}
    return recommend(config, figs), minutes, funnel


def main() -> int:
    """Run both strategies over several seeds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run from this one (a fresh set: 100)")
    parser.add_argument("--launch-cv", type=float, default=0.04, help="true variation between launches")
    parser.add_argument("--assumed-cv", type=float, default=0.04, help="sweep.screen.launch_cv the selection assumes")
    parser.add_argument("--margin", type=float, default=0.02, help="practical-equivalence margin")
    parser.add_argument("--refine-step", type=int, default=2, help="sweep.refine budget step (0: no refinement)")
    parser.add_argument("--confidence", type=float, help="sweep.screen.confidence (default: the schema's)")
    parser.add_argument("--race-keep", type=int, help="sweep.screen.race_keep (default: the schema's; 0: no cap)")
    parser.add_argument("--settle-launches", type=int,
                        help="sweep.screen.settle_launches (default: the schema's; 0: no settling)")
    parser.add_argument("--budgets", type=lambda text: [int(b) for b in text.split(",")],
                        help="the grid's budgets, comma-separated (default: config/config.yaml's 4,8,12,16)")
    parser.add_argument("--unsettled", action="store_true",
                        help="keep the default config's windowed cells: every screened cell is then unsettled")
    parser.add_argument("--screen-requests", type=int, default=8, help="sweep.screen.requests_per_cell")
    args = parser.parse_args()
    config = study(args.assumed_cv, args.refine_step, args.confidence, args.race_keep, args.budgets,
                   args.settle_launches, args.unsettled, args.screen_requests)
    grid_points = running_points(config)  # the points the workflow runs: one per alias group

    def truth(name: str, pick: str) -> float:
        """The pick's true score, each regime normalised by the best grid point (refinement points too)."""
        return true_scores(config, [resolve_point(config, pick)], grid_points)[name][pick]

    priorities = list(config["analysis"]["priorities"])
    print(f"SIMULATED (stand-in model); {len(grid_points)} grid points that run, launch_cv {args.launch_cv}, assumed "
          f"{args.assumed_cv}, margin {args.margin:.0%}, refine budget step {args.refine_step or 'none'}")
    print("| seed | grid job-h | adaptive job-h | ratio | screened / refined / confirmed / settling launches | "
          + " | ".join(f"{p} grid / adaptive" for p in priorities) + " |")
    print("|---" * (5 + len(priorities)) + "|")
    started = time.perf_counter()
    totals = {"grid": 0.0, "adaptive": 0.0, "grid_ok": 0, "adaptive_ok": 0, "adaptive_ok_where_grid": 0, "grid_n": 0,
              "rerun_ok": 0, "rerun_ok_where_grid": 0}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        grid_picks, grid_min = run_grid(config, random.Random(f"grid-{seed}"), args.launch_cv)
        rerun_picks, _ = run_grid(config, random.Random(f"grid-rerun-{seed}"), args.launch_cv)
        with tempfile.TemporaryDirectory() as tmp:
            ad_picks, ad_min, funnel = run_adaptive(copy.deepcopy(config), random.Random(f"adaptive-{seed}"),
                                                    args.launch_cv, Path(tmp))
        cells = []
        for name in priorities:
            best = max(true_scores(config, grid_points, grid_points)[name].values())

            def verdict(pick: str, name: str = name, best: float = best) -> tuple[bool, str]:
                score = truth(name, pick)
                ok = score >= (1 - args.margin) * best
                return ok, f"{'ok' if ok else 'WRONG'} {score / best - 1:+.1%}"

            g_ok, g_text = verdict(grid_picks[name])
            a_ok, a_text = verdict(ad_picks[name])
            r_ok, _ = verdict(rerun_picks[name])
            totals["rerun_ok"] += r_ok
            totals["rerun_ok_where_grid"] += r_ok and g_ok
            totals["grid_ok"] += g_ok
            totals["adaptive_ok"] += a_ok
            totals["adaptive_ok_where_grid"] += a_ok and g_ok
            totals["grid_n"] += 1
            cells.append(f"{g_text} / {a_text}")
        totals["grid"] += grid_min
        totals["adaptive"] += ad_min
        print(f"| {seed} | {grid_min / 60:.1f} | {ad_min / 60:.1f} | {ad_min / grid_min:.0%} | "
              f"{funnel['screened']} / {funnel['refined']} / {funnel['confirmed']} / {funnel['settling']} | "
              + " | ".join(cells) + " |")
    print(f"\ncorrect recommendations: grid {totals['grid_ok']}/{totals['grid_n']}, adaptive "
          f"{totals['adaptive_ok']}/{totals['grid_n']} (adaptive correct where grid is: "
          f"{totals['adaptive_ok_where_grid']}/{totals['grid_ok']}); adaptive job time "
          f"{totals['adaptive'] / totals['grid']:.1%} of the grid's; {time.perf_counter() - started:.0f} s")
    print(f"reference, the same grid run again with fresh noise: {totals['rerun_ok']}/{totals['grid_n']} correct, "
          f"correct where the first grid is: {totals['rerun_ok_where_grid']}/{totals['grid_ok']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
