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

Usage: python benchmarks/bench_coverage.py [--studies 4000] [--seed 1]
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


def main() -> int:
    """Print the coverage table as Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=4000, help="synthetic studies per cell of the table")
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
    print(f"\n(took {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
