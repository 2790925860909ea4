"""`ddsweep status [--watch]`: where a running study stands, from results/ and squeue.

Each point is `waiting` (not submitted yet), `pending` or `running` (Slurm job id, node, elapsed time), `done`
(headline figure: the first analysis regime's median), `failed` (error kind and one-line reason; a result of the
study, or the machine's failure on every attempt of this invocation, which the next one reruns), `not_started`
(its build's canary failed at start-up on the machine; the next invocation runs it) or `interrupted` (stopped from
outside; the next run resubmits it). The Slurm jobs counted are the study's own: run_point jobs whose working
directory is the results directory's parent (another study's point of the same name is not this one's). An
adaptive study's point that has no confirmed record yet is shown from its screening. Below the table: the failures
grouped by cause, GPU hours spent against `ddsweep plan`'s estimate, and an ETA from the measured point durations.
`--expect-measured N` exits 1 when fewer than N points were measured."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ddsweep.config.study import ConfigError, load_config
from ddsweep.findings.progress import study_status
from ddsweep.report.status import format_status
from ddsweep.slurm import parse_slurm_duration

SQUEUE_FORMAT = "%i|%T|%M|%N|%k|%Z"
COMMENT_PREFIX = "rule_run_point_wildcards_"
SQUEUE_STATES = {"PENDING": "pending", "CONFIGURING": "pending", "RUNNING": "running", "COMPLETING": "running",
                 "REQUEUED": "pending", "SUSPENDED": "pending"}



def squeue_jobs(study_dir: Path) -> dict[str, dict[str, Any]]:
    """Point id -> {job_id, state, elapsed_s, node} of this user's run_point jobs in squeue that run in `study_dir`
    (a resolved path; {} without Slurm): a point of the same name in another study's directory is that study's."""
    if shutil.which("squeue") is None:
        return {}
    try:
        done = subprocess.run(["squeue", "--me", "-h", "-o", SQUEUE_FORMAT], capture_output=True, text=True,
                              timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return {}
    jobs = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6 or not parts[4].startswith(COMMENT_PREFIX):
            continue
        job_id, state, elapsed, node, comment, workdir = parts
        if workdir and Path(workdir).resolve() != study_dir:
            continue
        jobs[comment[len(COMMENT_PREFIX):]] = {"job_id": job_id, "state": SQUEUE_STATES.get(state, state.lower()),
                                               "elapsed_s": parse_slurm_duration(elapsed),
                                               "node": node if node and not node.startswith("(") else None}
    return jobs


def _run(args: argparse.Namespace) -> int:
    """`ddsweep status`: print the table once, or every --watch seconds until every point has finished."""
    try:
        config = load_config(*args.config)
    except ConfigError as exc:
        print(f"ddsweep status: {exc}", file=sys.stderr)
        return 2
    while True:
        status = study_status(config, Path(args.results), squeue_jobs(Path(args.results).resolve().parent))
        text = format_status(status)
        if args.watch and sys.stdout.isatty():
            text = "\033[H\033[2J" + text
        print(text, flush=True)
        if not args.watch or status["finished"]:
            break
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            break
    measured = status["counts"]["done"]
    if measured < args.expect_measured:
        print(f"ddsweep status: {measured} point(s) measured, fewer than the {args.expect_measured} expected "
              "(--expect-measured)", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `status` subcommand."""
    parser = subparsers.add_parser("status", help="the state of every point of a running study, GPU hours, ETA",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", "-c", nargs="+", default=["config/config.yaml"], help="configuration file(s)")
    parser.add_argument("--results", default="results", help="the results directory (default results)")
    parser.add_argument("--watch", type=float, nargs="?", const=30.0, default=None, metavar="SECONDS",
                        help="refresh every SECONDS (default 30) until every point has finished")
    parser.add_argument("--expect-measured", type=int, default=0, metavar="N",
                        help="exit 1 when fewer than N points were measured (default 0: never)")
    parser.set_defaults(func=_run)
