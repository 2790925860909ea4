"""How often the adaptive screening's bands contain the true difference (SIMULATED, the stand-in's model).

A dropped point's reason shows its relative difference to the screening's best with a band of ±z standard errors
(`ddsweep.adaptive.selection.bands`, z from `sweep.screen.confidence`). The band is a selection rule, not a
confidence interval: the best is chosen from the same noisy figures, so its figure is biased upward and the bands
around it are shifted. This script screens the default study's points (as `bench_adaptive.py` emulates them: one
launch each, `sweep.screen.requests_per_cell` requests per regime cell, launch noise exp(N(0, cv)) with the
selection assuming that cv) and counts, per regime,

- how often a point's own figure ± its half width (`ScreenedFigure.half_width`: z·se, the within-launch part at
  Student's t) contains its true figure (whether the standard errors are right), and
- how often the band of its difference to the screening's best contains the true difference.

The truth is `bench_adaptive.true_value`: the expectation of the emulated cell, without launch noise.

Usage: python benchmarks/bench_screen_bands.py [--seeds 50] [--launch-cv 0.02 0.03 0.04] [--confidence 0.9]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time

from bench_adaptive import knobs_of, measure, prompt_kind, stops_at_eos, study, true_value

from ddsweep.adaptive.screening import LOWER_IS_BETTER, regime_scores
from ddsweep.adaptive.selection import bands
from ddsweep.adaptive.stages import screen_benchmark
from ddsweep.config.plan import running_points


def coverage(cv: float, seeds: int, confidence: float) -> dict[str, list[int]]:
    """Per regime: [figures covered, figures, bands covered, bands] over `seeds` screenings."""
    config = study(cv, 0, confidence)
    regimes = config["analysis"]["regimes"]
    tokens = config["benchmark"]["max_new_tokens"]
    n = screen_benchmark(config)["requests_per_cell"]
    points = {p.point_id: p for p in running_points(config)}
    counts = {r["name"]: [0, 0, 0, 0] for r in regimes}
    for seed in range(seeds):
        rng = random.Random(f"bands-{cv}-{seed}")
        launches = {pid: [measure(config, p, n, math.exp(rng.gauss(0, cv)), rng, f"screen-{seed}")]
                    for pid, p in points.items()}
        scores = regime_scores(config, launches)
        for regime in regimes:
            name = regime["name"]

            def truth(pid: str, regime: dict = regime) -> float:
                value = true_value(knobs_of(points[pid]), regime["metric"], regime["context"],
                                   regime["concurrency"], tokens, n, prompt_kind(config), stops_at_eos(config))
                return 1.0 / value if regime["metric"] in LOWER_IS_BETTER else value

            for verdict in bands(scores[name], name, confidence):
                est = scores[name][verdict.point_id]
                counts[name][0] += abs(math.log(est.value / truth(verdict.point_id))) <= est.half_width(confidence)
                counts[name][1] += 1
                if verdict.point_id != verdict.best:
                    true_diff = truth(verdict.point_id) / truth(verdict.best) - 1
                    counts[name][2] += verdict.low <= true_diff <= verdict.high
                    counts[name][3] += 1
    return counts


def main() -> int:
    """Print, per launch variation and regime, the two coverages."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--launch-cv", type=float, nargs="+", default=[0.02, 0.03, 0.04])
    parser.add_argument("--confidence", type=float, default=0.9, help="sweep.screen.confidence")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"SIMULATED (stand-in model); {args.seeds} screenings per row, confidence {args.confidence:.0%}")
    print("| launch_cv | regime | point figure ± half width contains the truth | band vs the screening's best contains "
          "the true difference |")
    print("|---|---|---|---|")
    for cv in args.launch_cv:
        for name, (fig_in, figs, band_in, band_n) in coverage(cv, args.seeds, args.confidence).items():
            print(f"| {cv} | {name} | {fig_in / figs:.1%} ({figs}) | {band_in / band_n:.1%} ({band_n}) |")
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
