"""How closely bench_adaptive.py's emulation follows the stand-in it stands for (SIMULATED).

bench_adaptive.py judges both strategies against a truth computed from the stand-in's model and emulates the
stand-in's measurements instead of starting it. This script starts it: for a few points of the default study it
runs the regime cells as a settling job does (`ddsweep.adaptive.stages.regime_benchmark`: the primary workload,
the configured requests per cell, one repeat, no coding eval) with `ddsweep run-point`, the workflow's own job
command, which starts `ddsweep sim-server` with the study's presets through the launcher code that starts a real
server. The stand-in runs without launch noise and with a different acceptance seed per launch, so
the launches' mean estimates its expectation. It prints, per point and regime, that mean with its standard error
next to the emulation's truth (`bench_adaptive.true_value`), and per priority both orders of the points by the
summary's score.

The emulation follows the stand-in's model (acceptance of the primary workload's prompt kind, requests that stop
at their natural end of sequence, a batch that shrinks as a wave's requests finish) but draws each request's
acceptance as the normal approximation of its verify steps' mean, and lets a cell's requests run in waves.

Usage: python benchmarks/bench_emulation.py [--launches 4] [--tokens 128] [--points ar,...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_adaptive import (  # noqa: E402
    figures,
    knobs_of,
    priority_score,
    prompt_kind,
    stops_at_eos,
    study,
    true_value,
)

from ddsweep.adaptive.refinement import resolve_point  # noqa: E402
from ddsweep.adaptive.stages import regime_benchmark  # noqa: E402
from ddsweep.config.records import point_record  # noqa: E402

POINTS = ["ar", "dflash-bs8-w2048", "bs8-b4-t2-w2048", "bs8-b4-t2-woff", "bs16-b4-t2-w2048", "bs8-b8-t4-w2048",
          "bs8-b16-t4-w2048"]


def stand_in_config(tokens: int) -> dict:
    """The default study (as bench_adaptive.py sets it up) with `tokens` per request and the stand-in as its
    launcher: the presets' command lines unchanged, no launch noise, the lenient contract (no SGLang import per
    start)."""
    config = study(0.03, 0)
    config["benchmark"]["max_new_tokens"] = tokens
    config["simulated"] = True
    config["engine"]["launcher"] = ["{python}", "-m", "ddsweep", "sim-server", "--sim-startup-delay", "0.2",
                                    "--sim-strict", "off"]
    config["engine"]["startup_timeout_s"] = 120
    return config


def launch(config: dict, point_id: str, seed: int, workdir: Path) -> list[dict]:
    """One job of the regime cells for `point_id` with acceptance seed `seed`; its measured requests."""
    record = point_record(config, resolve_point(config, point_id))
    record["benchmark"] = regime_benchmark(config)
    record["coding_eval"] = {**record["coding_eval"], "enabled": False}
    record["engine"] = copy.deepcopy(record["engine"])
    record["engine"]["launcher"] = [*record["engine"]["launcher"], "--sim-seed", str(seed)]
    out = workdir / f"{point_id}-{seed}"
    job = subprocess.run([sys.executable, "-m", "ddsweep", "run-point", "--record", json.dumps(record), "--out",
                          str(out), "--done", str(out / "done.json")], capture_output=True, text=True, check=False)
    if job.returncode != 0 or not (out / "status.json").exists():
        raise RuntimeError(f"{point_id} launch {seed} failed: {job.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "bench" / "requests.jsonl").read_text().splitlines()]
    return [r for r in rows if not r.get("warmup")]


def main() -> int:
    """Run the stand-in's launches and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=4, help="launches per point (acceptance seeds 1..N)")
    parser.add_argument("--tokens", type=int, default=128, help="max_new_tokens per request (the study's: 512)")
    parser.add_argument("--points", type=lambda text: text.split(","), default=POINTS)
    parser.add_argument("--jobs", type=int, default=2, help="launches run at once")
    args = parser.parse_args()
    config = stand_in_config(args.tokens)
    n = config["benchmark"]["requests_per_cell"]
    regimes = config["analysis"]["regimes"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = {(pid, seed): pool.submit(launch, config, pid, seed, Path(tmp))
                   for pid in args.points for seed in range(1, args.launches + 1)}
        runs = {pid: [futures[(pid, seed)].result() for seed in range(1, args.launches + 1)] for pid in args.points}
    print(f"SIMULATED: the stand-in (no launch noise, {args.launches} launches per point, {n} requests per cell, "
          f"{args.tokens} tokens) against bench_adaptive.py's emulation; {time.perf_counter() - started:.0f} s\n")
    print("| point | regime | stand-in mean ± se | emulation truth | stand-in / emulation |")
    print("|---|---|---|---|---|")
    measured: dict[str, dict[str, float]] = {}
    truth: dict[str, dict[str, float]] = {}
    for pid in args.points:
        per_launch = [figures(config, [run]) for run in runs[pid]]
        measured[pid], truth[pid] = {}, {}
        for regime in regimes:
            name = regime["name"]
            values = [f[name] for f in per_launch if name in f]
            if not values:
                continue
            mean = statistics.fmean(values)
            se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
            true = true_value(knobs_of(resolve_point(config, pid)), regime["metric"], regime["context"],
                              regime["concurrency"], args.tokens, n, prompt_kind(config), stops_at_eos(config))
            measured[pid][name], truth[pid][name] = mean, true
            print(f"| {pid} | {name} | {mean:.3g} ± {se:.2g} | {true:.3g} | {mean / true:.3f} |")
    print("\n| priority | order by the stand-in (score) | order by the emulation (score) |")
    print("|---|---|---|")
    for name, weights in config["analysis"]["priorities"].items():
        orders = []
        for figs in (measured, truth):
            best = {r: max(f[r] for f in figs.values()) for r in weights}
            scores = {pid: priority_score(weights, f, best) for pid, f in figs.items()}
            orders.append(", ".join(f"{pid} ({scores[pid]:.3f})" for pid in sorted(scores, key=scores.get,
                                                                                      reverse=True)))
        print(f"| {name} | {orders[0]} | {orders[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
