"""Measure the coverage of the summary's printed 95% intervals on synthetic studies with known truth.

Each synthetic repeat (one benchmark cell) of a point is the mean of 8 per-request figures, each drawn from a
gamma distribution of mean 1 (skewed or mild per scenario), times a launch/repeat effect exp(N(0, σ_launch))
corrected to mean 1, times the true figure μ; so the expected per-repeat figure is exactly μ. Two points share
a per-repeat prompt effect (same prompts per repeat index, as in the real benchmark). For 3, 5 and 10 repeats the script
counts how often

- the interval of one point's figure (`statistics.mean_interval`, as printed per regime) contains μ, and
- the interval of a ratio (`statistics.log_difference(...).ratio()`, as printed for speed-ups over `ar`)
  contains μ_A / μ_B,

and, for reference, how often [min, max] of the repeats (what the old bootstrap of three repeats printed as a
95% interval) contains the true median of a repeat's figure.

A second table covers the layout a study runs by default, where the launch is the unit (`sweep.launches` 2, the
repeats split across them): every repeat of one launch shares that launch's effect, several points are measured
at the cell, and the printed figure interval comes from the launch variance pooled over those points
(`launch_model.launch_intervals`, what `results.group_table` prints), the ratio interval from the pooled two-way
launch variance paired on the launch index (`launch_model.launch_difference`, what the decisions test). It counts
how often each contains μ (every point) and μ_A / μ_B (the first two points), and, where the points' launch
variation differs, how often the interval of the most variable points contains theirs.

Usage: python benchmarks/bench_coverage.py [--studies 4000] [--launch-studies 4000] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics as pystats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import pandas as pd  # noqa: E402

from ddsweep.analysis.launch_model import (  # noqa: E402
    cell_launches,
    launch_difference,
    launch_intervals,
    pooled_variances,
)
from ddsweep.analysis.statistics import log_difference, mean_interval  # noqa: E402

REPEATS = (3, 5, 10)
REQUESTS = 8  # requests per cell
SCENARIOS = {  # name: (gamma shape of per-request noise, σ of the launch/repeat effect, σ of the prompt effect)
    "skewed requests (CV 71%), launch 3%": (2.0, 0.03, 0.01),
    "mild requests (CV 14%), launch 10%": (50.0, 0.10, 0.03),
}


def repeat_figure(rng: random.Random, mu: float, shape: float, launch: float, shared: float) -> float:
    """One repeat's figure: μ × launch effect × prompt effect × mean of the per-request noise (all mean 1)."""
    requests = sum(rng.gammavariate(shape, 1 / shape) for _ in range(REQUESTS)) / REQUESTS
    return mu * math.exp(rng.gauss(0, launch) - launch ** 2 / 2) * shared * requests


def coverage(n: int, shape: float, launch: float, shared_sd: float, studies: int,
             rng: random.Random) -> dict[str, float]:
    """Fractions of studies whose intervals contain the truth, for one repeat count and noise scenario."""
    mean_hits = ratio_hits = range_hits = 0
    mu_a, mu_b = 150.0, 100.0
    # The true median of one repeat's figure, by simulation (for the [min, max] reference only).
    reference = [repeat_figure(rng, mu_a, shape, launch, 1.0) for _ in range(20000)]
    true_median = pystats.median(reference)
    for _ in range(studies):
        shared = [math.exp(rng.gauss(0, shared_sd) - shared_sd ** 2 / 2) for _ in range(n)]
        a = {k: repeat_figure(rng, mu_a, shape, launch, shared[k]) for k in range(n)}
        b = {k: repeat_figure(rng, mu_b, shape, launch, shared[k]) for k in range(n)}
        est = mean_interval(list(a.values()))
        mean_hits += est.low <= mu_a <= est.high
        ratio = log_difference(a, b).ratio()
        ratio_hits += ratio.low <= mu_a / mu_b <= ratio.high
        range_hits += min(a.values()) <= true_median <= max(a.values())
    return {"mean": mean_hits / studies, "ratio": ratio_hits / studies, "range": range_hits / studies}


# The launch layout: repeats per launch, and scenarios (gamma shape of per-request noise, σ of the launch effect
# per point, cycled over the points, points at the cell).
LAUNCH_SPLITS = {"2 launches, 2+1 repeats (the default)": (2, 1), "3 launches, 1 repeat each": (1, 1, 1)}
LAUNCH_SCENARIOS = {
    "skewed requests, launch 3%, 6 points": (2.0, (0.03,), 6),
    "mild requests, launch 10%, 6 points": (50.0, (0.10,), 6),
    "skewed requests, launch 3%, 2 points": (2.0, (0.03,), 2),
    "mild requests, launch 1% or 6% by point, 6 points": (50.0, (0.01, 0.06), 6),
}
COLUMN = "decode_tok_s_median"


def launch_study(rng: random.Random, split: tuple[int, ...], shape: float, sigmas: tuple[float, ...],
                 points: int) -> tuple[pd.DataFrame, list[float], list[float]]:
    """One cell's rows (a repeat each) for `points` points in launches of `split` repeats; the true figures and
    the points' launch σ."""
    truth = [100.0 * (1 + 0.1 * p) for p in range(points)]
    sigma = [sigmas[p % len(sigmas)] for p in range(points)]
    rows = []
    for p in range(points):
        repeat = 0
        for launch, repeats in enumerate(split):
            effect = math.exp(rng.gauss(0, sigma[p]) - sigma[p] ** 2 / 2)  # shared by the launch's repeats
            for _ in range(repeats):
                requests = sum(rng.gammavariate(shape, 1 / shape) for _ in range(REQUESTS)) / REQUESTS
                rows.append({"point_id": f"p{p}", "context": 128, "concurrency": 1, "launch": launch,
                             "repeat": repeat, COLUMN: truth[p] * effect * requests})
                repeat += 1
    return pd.DataFrame(rows), truth, sigma


def launch_coverage(split: tuple[int, ...], shape: float, sigmas: tuple[float, ...], points: int, studies: int,
                    rng: random.Random) -> dict[str, float]:
    """Fractions of intervals that contain the truth in the launch layout (figure: every point; ratio: the first
    two points; most variable: the figures of the points with the largest launch σ)."""
    figure_hits = figure_n = ratio_hits = top_hits = top_n = 0
    for _ in range(studies):
        cells, truth, sigma = launch_study(rng, split, shape, sigmas, points)
        intervals = launch_intervals(cells, {"decode_tok_s": COLUMN}, 0.95)
        for p in range(points):
            low, high, _ = intervals[(f"p{p}", 128, 1, "decode_tok_s")]
            hit = low <= truth[p] <= high
            figure_hits, figure_n = figure_hits + hit, figure_n + 1
            if sigma[p] == max(sigma):
                top_hits, top_n = top_hits + hit, top_n + 1
        figures = cell_launches(cells, COLUMN)
        _, _, v2, df2 = pooled_variances(figures)
        ratio = launch_difference(figures["p1"], figures["p0"], v2, df2).ratio(0.95)
        ratio_hits += ratio.low <= truth[1] / truth[0] <= ratio.high
    return {"figure": figure_hits / figure_n, "ratio": ratio_hits / studies, "top": top_hits / top_n}


def main() -> int:
    """Print the coverage table as Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=4000, help="synthetic studies per cell of the table")
    parser.add_argument("--launch-studies", type=int, default=4000, help="synthetic studies per row, launch layout")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.perf_counter()
    print(f"{args.studies} studies per row; nominal level 95%; {REQUESTS} requests per cell\n")
    print("| scenario | repeats | figure interval (t on repeat means) | ratio interval (paired log t) "
          "| [min, max] of repeats (old) |")
    print("|---|---|---|---|---|")
    for name, (shape, launch, shared) in SCENARIOS.items():
        for n in REPEATS:
            c = coverage(n, shape, launch, shared, args.studies, rng)
            print(f"| {name} | {n} | {c['mean']:.1%} | {c['ratio']:.1%} | {c['range']:.1%} |")
    print(f"\nThe launch layout: {args.launch_studies} studies per row; nominal level 95%\n")
    print("| scenario | launches | figure interval (pooled launch variance) | ratio interval (two-way, paired "
          "launches) | figure interval of the most variable points |")
    print("|---|---|---|---|---|")
    for name, (shape, sigmas, points) in LAUNCH_SCENARIOS.items():
        for split_name, split in LAUNCH_SPLITS.items():
            c = launch_coverage(split, shape, sigmas, points, args.launch_studies, rng)
            top = f"{c['top']:.1%}" if len(set(sigmas)) > 1 else "(all alike)"
            print(f"| {name} | {split_name} | {c['figure']:.1%} | {c['ratio']:.1%} | {top} |")
    print(f"\n(took {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
