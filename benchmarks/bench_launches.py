"""Are the summary's named winners the true best when server launches vary? Synthetic grid studies (SIMULATED).

Each study has the true figures of a grid of points at a latency and a throughput cell. A repeat's figure is
truth × exp(launch effect + prompt effect + within-launch noise): the launch effect N(0, launch_cv) is drawn
once per server launch and shared by every repeat of that launch; the prompt effect is shared by every point at
one repeat index (the same prompts); the within-launch noise is per repeat. The analysis is the summary's own
(`ddsweep.analysis.decisions.analyse` on a ResultSet), with

- `launches 1`: every repeat of a point in one launch (the old grid default): the launch effect is invisible to
  the repeats and the tests count repeats as independent;
- `launches 2`: the repeats split 2 + 1 across two launches (`sweep.launches: 2`, the default), the launch the
  unit, its variance pooled over the study's points (`ddsweep.analysis.launch_model`).

It counts, over seeds, the regime winners and priority picks the summary names (decided) and how many of them
are not the true best. Usage: python benchmarks/bench_launches.py [--seeds 300] [--launch-cv 0.03]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ddsweep.analysis.decisions import Settings, analyse  # noqa: E402
from ddsweep.analysis.results import (  # noqa: E402
    CELL_COLUMNS,
    KNOBS,
    REQUEST_COLUMNS,
    PointRecord,
    ResultSet,
    group_table,
)

CONFIG = {"analysis": {
    "regimes": [{"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
                {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128, "concurrency": 32}],
    "priorities": {"latency_first": {"latency": 1.0}, "throughput_first": {"throughput": 1.0},
                   "balanced": {"latency": 0.5, "throughput": 0.5}}}}
# (budget, true decode tok/s at C=1, true throughput tok/s at C=32): a grid with a clear and a close leader
TRUTH = [(4, 150.0, 950.0), (6, 158.0, 880.0), (8, 166.0, 860.0), (10, 171.0, 820.0), (12, 175.0, 790.0),
         (14, 176.5, 760.0), (16, 170.0, 730.0), (20, 160.0, 700.0), (24, 150.0, 650.0), (32, 140.0, 600.0)]
REPEATS = 3


def study(rng: random.Random, launches: int, launch_cv: float, within: float, prompt: float) -> ResultSet:
    """One synthetic grid study as the summary reads it (cells with their launch)."""
    shares = [REPEATS // launches + (1 if k < REPEATS % launches else 0) for k in range(launches)]
    prompt_effect = {(cell, r): rng.gauss(0, prompt) for cell in ("lat", "thr") for r in range(REPEATS)}
    rows, points = [], []
    for budget, decode, throughput in TRUTH:
        pid = f"bs8-b{budget}-t4-w2048"
        knobs = {"budget": budget, "topk": 4, "block_size": 8, "window": 2048}
        points.append(PointRecord(pid, kind="ddtree", preset="ddtree", status="ok", **knobs))
        rep = 0
        for k, share in enumerate(shares):
            effect = {cell: rng.gauss(0, launch_cv) for cell in ("lat", "thr")}
            for _ in range(share):
                def draw(truth: float, cell: str, rep: int = rep, effect: dict = effect) -> float:
                    return truth * math.exp(effect[cell] + prompt_effect[(cell, rep)] + rng.gauss(0, within))
                base = {"point_id": pid, "kind": "ddtree", **knobs, "repeat": rep, "simulated": True,
                        "source": "synthetic", "completed": 8, "failed": 0,
                        "launch": k if launches > 1 else None}
                rows.append({**base, "context": 128, "concurrency": 1, "decode_tok_s_median": draw(decode, "lat")})
                rows.append({**base, "context": 128, "concurrency": 32,
                             "output_throughput_tok_s": draw(throughput, "thr")})
                rep += 1
    cells = pd.DataFrame(rows, columns=list(CELL_COLUMNS))
    for knob in KNOBS:
        cells[knob] = pd.array(cells[knob].tolist(), dtype="Int64")
    return ResultSet(results_dir=Path("synthetic"), points=points, cells=cells, groups=group_table(cells),
                     coding=pd.DataFrame(), coding_records={}, coding_summaries={},
                     requests=pd.DataFrame(columns=list(REQUEST_COLUMNS)))


def truth_of(point_id: str) -> dict[str, float]:
    """The true figures of a point, by regime and priority (the balanced score relative to the best)."""
    budget = int(point_id.split("-b")[1].split("-")[0])
    decode, throughput = next((d, t) for b, d, t in TRUTH if b == budget)
    best_d, best_t = max(d for _, d, _ in TRUTH), max(t for _, _, t in TRUTH)
    return {"latency": decode, "throughput": throughput, "latency_first": decode, "throughput_first": throughput,
            "balanced": math.sqrt(decode / best_d * throughput / best_t)}


def run(seeds: int, launches: int, launch_cv: float, within: float, prompt: float) -> dict[str, list[int]]:
    """Per decision: [named, wrong] over the seeds."""
    settings = Settings.from_config(CONFIG)
    ids = [f"bs8-b{b}-t4-w2048" for b, _, _ in TRUTH]
    best = {name: max(truth_of(pid)[name] for pid in ids) for name in truth_of(ids[0])}
    counts: dict[str, list[int]] = {name: [0, 0] for name in best}
    for seed in range(seeds):
        decisions = analyse(study(random.Random(seed), launches, launch_cv, within, prompt), settings)
        named = {o.resolved.regime.name: o.winner for o in decisions.regimes}
        named.update({p.name: p.point_id if p.decided else None for p in decisions.priorities})
        for name, winner in named.items():
            if winner is not None:
                counts[name][0] += 1
                counts[name][1] += truth_of(winner)[name] < best[name]
    return counts


def main() -> int:
    """Print, per launch layout, how often a named winner is the true best."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--launch-cv", type=float, default=0.03)
    parser.add_argument("--within", type=float, default=0.01, help="within-launch noise per repeat")
    parser.add_argument("--prompt", type=float, default=0.01, help="prompt effect shared at one repeat index")
    args = parser.parse_args()
    print(f"SIMULATED: {args.seeds} synthetic grid studies of {len(TRUTH)} points, {REPEATS} repeats, launch "
          f"variation {args.launch_cv:.0%}, within-launch {args.within:.0%}, prompt effect {args.prompt:.0%}")
    print(f"{'layout':<12} {'decision':<18} {'named':>6} {'wrong':>6} {'right when named':>17}")
    for launches in (1, 2):
        started = time.monotonic()
        counts = run(args.seeds, launches, args.launch_cv, args.within, args.prompt)
        for name, (named, wrong) in counts.items():
            right = f"{(named - wrong) / named:.1%}" if named else "n/a"
            print(f"{'launches ' + str(launches):<12} {name:<18} {named:>6} {wrong:>6} {right:>17}")
        total_named = sum(c[0] for c in counts.values())
        total_wrong = sum(c[1] for c in counts.values())
        overall = f"{(total_named - total_wrong) / total_named:.1%}" if total_named else "n/a"
        print(f"{'launches ' + str(launches):<12} {'all':<18} {total_named:>6} {total_wrong:>6} {overall:>17}"
              f"   ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
