"""Each attempt of a point job marks its start and its end in `<out>/started/`, and copies both marks to the study
store at once (DDSWEEP_STORE), so that an attempt lost with its machine is known as interrupted at the next
invocation, wherever it runs (ddsweep.store), and an attempt that is still running is waited for, not joined."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddsweep.slurm import slurm_job_running
from ddsweep.store import StoreError, StudyStore, attempt_id, attempts_of, interrupted_attempts, mark_attempt

STORE_ENV = "DDSWEEP_STORE"
# How often a waiting attempt asks whether the running one has ended.
LIVE_POLL_S = 15.0


def unit_of(out_dir: Path) -> str | None:
    """A job's output directory as a unit of the store (`results/points/<id>`), or None outside a results tree."""
    parts = Path(os.path.abspath(out_dir)).parts
    if "results" not in parts:
        return None
    index = len(parts) - 1 - parts[::-1].index("results")
    return "/".join(parts[index:]) if index + 1 < len(parts) else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class AttemptMarks:
    """The start and end marks of this attempt (a context manager: an attempt that leaves by an unexpected exception
    is marked ended with it; one that is killed outright leaves its start alone, which is what marks it lost)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.unit = unit_of(self.out_dir)
        self.host = socket.gethostname()
        self.started = _now()
        self.attempt = attempt_id(self.started, self.host, os.getpid())
        self.store: StudyStore | None = None
        self._ended = False
        url = os.environ.get(STORE_ENV)
        if url and self.unit:
            try:
                self.store = StudyStore.open(url)
            except StoreError as exc:
                print(f"ddsweep run-point: WARNING: {exc}; this attempt is marked locally only", file=sys.stderr)

    def _mark(self, phase: str, info: dict[str, Any]) -> None:
        try:
            mark_attempt(self.out_dir, self.attempt, phase, info, self.store, self.unit)
        except StoreError as exc:
            print(f"ddsweep run-point: WARNING: {exc}; the {phase} of this attempt is marked locally only",
                  file=sys.stderr)

    def __enter__(self) -> AttemptMarks:
        self._mark("start", {"host": self.host, "started_utc": self.started, "pid": os.getpid(),
                             "slurm_job_id": os.environ.get("SLURM_JOB_ID")})
        return self

    def ended(self, error_kind: str | None, error: str | None) -> None:
        """Mark this attempt's end: completed (`error_kind` None) or failed with that kind."""
        reason = (error or "").strip().splitlines()[0] if error else None
        self._mark("end", {"ended_utc": _now(), "error_kind": error_kind, "reason": reason})
        self._ended = True

    def interruptions(self) -> list[dict[str, Any]]:
        """The earlier attempts of this job that never finished."""
        return interrupted_attempts(self.out_dir, current=self.attempt)

    def __exit__(self, exc_type: type | None, exc: BaseException | None, _tb: object) -> None:
        if not self._ended:
            interrupted = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit))
            self.ended("interrupted" if interrupted else "error",
                       repr(exc) if exc else "the job ended without a terminal record")


def _process_runs(pid: int, started_utc: str | None) -> bool:
    """Whether process `pid` on this host is a `run-point` that started no later than `started_utc` (a pid reused
    since by another process is not it)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    began = boot + ticks / os.sysconf("SC_CLK_TCK")
    mark = datetime.fromisoformat(started_utc).timestamp() if started_utc else began
    return b"run-point" in command and began <= mark + 5


def live_attempts(out_dir: Path) -> list[dict[str, Any]]:
    """The earlier attempts of this job that are still running: a start with no end whose Slurm job Slurm still
    lists (a job that outlived the Snakemake that submitted it), or whose process lives on this host."""
    live = []
    for entry in attempts_of(out_dir):
        start = entry.get("start")
        if start is None or "end" in entry or start.get("pid") == os.getpid():
            continue
        job = start.get("slurm_job_id")
        if job and job != os.environ.get("SLURM_JOB_ID"):
            running = slurm_job_running(str(job), start.get("host"))
        elif start.get("host") == socket.gethostname() and isinstance(start.get("pid"), int):
            running = _process_runs(start["pid"], start.get("started_utc"))
        else:
            running = False
        if running:
            live.append(start)
    return live


def wait_for_live_attempts(out_dir: Path, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Wait until no earlier attempt of this job runs (a second attempt beside it would mix their files and measure
    the point twice); returns those waited for."""
    waited: list[dict[str, Any]] = []
    while live := live_attempts(out_dir):
        if not waited:
            names = "; ".join(f"attempt {a['attempt']} (Slurm job {a.get('slurm_job_id') or '-'}, host "
                              f"{a.get('host')}, started {a.get('started_utc')})" for a in live)
            progress(f"{out_dir}: an earlier attempt of this job is still running: {names}; waiting for it to end "
                     "before this one starts")
        waited = live
        time.sleep(LIVE_POLL_S)
    return waited
