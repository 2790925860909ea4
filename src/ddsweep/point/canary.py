"""`ddsweep canary`: what each family's canary start says about the set-up the family's other points would run in.

The canary (config/families.py) runs before the other points of its family. When it failed on the machine before
its server became healthy (an infrastructure failure at start-up, after its own retries: a library that does not
load, a missing launcher, a start-up timeout), every server of that build would most likely fail the same way: the
family's other first-stage jobs are recorded as not started (`error_kind: not_started`, persisted, with the
canary's cause) and no server of theirs is started; the next invocation drops those records with the canary's and
runs them all again (ddsweep.point.failures.drop_persisted_records). A canary that failed because of its
configuration (refused flags, an engine traceback) or completed stops nothing. A job that already has a record
keeps it. The verdicts go to results/canary.json (docs/results-schema.md)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddsweep.config.families import Family, families, job_dirs
from ddsweep.config.records import point_record
from ddsweep.config.study import find_point
from ddsweep.point.failures import INFRASTRUCTURE, read_record
from ddsweep.point.lifecycle import render_server
from ddsweep.point.preflight import PROBE_PORT
from ddsweep.point.run import PointRun, done_record, write_point_file
from ddsweep.storage import write_json_atomic

NOT_STARTED = "not_started"
# Failures of a canary that say nothing about its family's set-up: a stop from outside.
NOT_SHARED = frozenset({"interrupted", NOT_STARTED})
CAUSE_KEYS = ("error_kind", "error", "classified_by", "failure_class")


@dataclass
class Verdict:
    """One family's canary and what its record decided: `ok` (completed), `failed` (its own failure, the family
    goes on), `blocked` (a shared cause: the family's other jobs were not started) or `missing` (no record)."""

    family: str
    canary: str
    record: str
    status: str
    cause: dict[str, Any] | None = None
    not_started: list[str] = field(default_factory=list)


def shared_cause(job_dir: Path) -> dict[str, Any] | None:
    """The canary's failure when its family shares it: recorded on the machine (infrastructure, after the job's
    retries), before the server became healthy, and not a stop from outside; None otherwise."""
    done, failure = read_record(job_dir / "done.json"), read_record(job_dir / "failure.json")
    if not done or done.get("status") != "failed" or not failure:
        return None
    if failure.get("failure_class") != INFRASTRUCTURE or failure.get("error_kind") in NOT_SHARED:
        return None
    if (failure.get("steps") or {}).get("server") == "ok":
        return None
    return {**{key: failure.get(key) for key in CAUSE_KEYS}, "error": _head(failure.get("error"))}


def _head(error: Any) -> str:
    """The first line of an error, without the clause that introduces the log lines after it."""
    lines = str(error or "").strip().splitlines()
    return lines[0].removesuffix("; last log lines:") if lines else "no message"


def not_started_error(canary: str, family: str, cause: dict[str, Any], canary_dir: Path) -> str:
    """The one-line error of a job that was not started because of its family's canary."""
    return (f"not started: the canary `{canary}` of build {family} failed at start-up on the machine "
            f"({cause.get('error_kind')}: {cause.get('error')}; its failure.json and server.log are in "
            f"{canary_dir}); fix the cause and run the workflow again")


def write_not_started(record: dict, job_dir: Path, family: Family, cause: dict[str, Any], canary_dir: Path) -> bool:
    """Record a job of the family as not started (point.json, failure.json, done.json persisted), unless it has
    a record already; returns whether it wrote one."""
    if (job_dir / "done.json").exists():
        return False
    job_dir.mkdir(parents=True, exist_ok=True)
    run = PointRun(point_id=record["point_id"], simulated=bool(record.get("simulated")))
    write_point_file(record, render_server(record, PROBE_PORT), job_dir, run)
    error = not_started_error(family.canary, family.name, cause, canary_dir)
    write_json_atomic(job_dir / "failure.json", run.record(
        "failed", error_kind=NOT_STARTED, error=error, failure_class=INFRASTRUCTURE,
        classified_by=f"the canary of build {family.name} failed at start-up on the machine: its other points "
                      "share the set-up, so none was started", attempt=0, persisted=True, attempts=0,
        canary={"point_id": family.canary, "family": family.name, "record": canary_dir.as_posix(), **cause}))
    write_json_atomic(job_dir / "done.json", done_record(record["point_id"], "failed", NOT_STARTED, error,
                                                         persisted_after=0))
    return True


def decide(config: dict, results_dir: Path) -> list[Verdict]:
    """Every family's verdict from its canary's first-stage record; writes the not-started records of the jobs
    of each blocked family (the canary's later launches included)."""
    verdicts = []
    for family in families(config):
        canary_dir = job_dirs(config, results_dir, family.canary)[0]
        done = read_record(canary_dir / "done.json")
        cause = shared_cause(canary_dir)
        status = "missing" if not done else "blocked" if cause else "ok" if done.get("status") == "ok" else "failed"
        verdict = Verdict(family.name, family.canary, canary_dir.as_posix(), status, cause)
        if cause:
            for point_id in family.members:
                record = point_record(config, find_point(config, point_id))
                for job_dir in job_dirs(config, results_dir, point_id):
                    if job_dir != canary_dir and write_not_started(record, job_dir, family, cause, canary_dir):
                        verdict.not_started.append(job_dir.as_posix())
        verdicts.append(verdict)
    return verdicts


def _run(args: argparse.Namespace) -> int:
    """`ddsweep canary`: decide every family's verdict and write them."""
    config = json.loads(args.config_json)
    verdicts = decide(config, Path(args.results))
    for v in verdicts:
        line = f"build {v.family}: canary `{v.canary}` {v.status}"
        if v.cause:
            line += (f" ({v.cause['error_kind']}, the machine's failure at start-up); {len(v.not_started)} job(s) "
                     "recorded as not started, run again by the next invocation")
        print(f"ddsweep canary: {line}", file=sys.stderr)
    write_json_atomic(args.write, {"families": [asdict(v) for v in verdicts]})
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `canary` subcommand."""
    parser = subparsers.add_parser("canary", help="after each build's canary start: stop that build's other points "
                                   "when the canary failed at start-up on the machine", description=__doc__)
    parser.add_argument("--config-json", required=True, help="the validated study configuration, as JSON")
    parser.add_argument("--results", default="results", help="the results directory (default results)")
    parser.add_argument("--write", required=True, metavar="FILE", help="where the verdicts go (results/canary.json)")
    parser.set_defaults(func=_run)

