"""A point job notices that the workflow which launched it has ended, and stops instead of measuring on.

Snakemake runs a job's shell command in a shell of its own (`bash -c`), which runs `ddsweep run-point`; under Slurm
the job step runs Snakemake on the node (`python -m snakemake ... --executor slurm-jobstep`), which does the same.
A SIGTERM sent to Snakemake alone (`kill`, a wrapper's timeout, a CI limit) ends Snakemake but not its jobs: the
shell and the job are reparented and would go on measuring beside the next invocation's. So the job records the
nearest Snakemake process among its ancestors when it starts (the one that launched it: on a Slurm node, the job
step's) and polls it; once that process is gone (or a zombie, or its pid reused), the job is told why.

Snakemake itself answers a SIGTERM by waiting for its running jobs to finish ("Will exit after finishing currently
running jobs"), which for a point is hours. The workflow therefore makes that SIGTERM also reach the point jobs it
runs on its machine (`stop_point_jobs_on_sigterm`, called from workflow/rules/common.smk): each stops its server
and records itself as interrupted, and Snakemake then ends."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import psutil

POLL_S = 1.0


def is_snakemake(cmdline: list[str]) -> bool:
    """Whether a command line runs Snakemake: `snakemake ...`, `python -m snakemake ...` or `python .../snakemake`
    (a console script run by its interpreter)."""
    if not cmdline:
        return False
    program = os.path.basename(cmdline[0])
    if program == "snakemake":
        return True
    if not program.startswith("python"):
        return False
    args = iter(cmdline[1:])
    for arg in args:
        if arg == "-m":
            return next(args, "") == "snakemake"
        if not arg.startswith("-"):
            return os.path.basename(arg) == "snakemake"
    return False


def launching_workflow(pid: int | None = None) -> psutil.Process | None:
    """The nearest Snakemake process among the ancestors of `pid` (this process by default), or None (a point run
    by hand, or from another tool)."""
    with contextlib.suppress(psutil.Error):
        for parent in psutil.Process(pid or os.getpid()).parents():
            with contextlib.suppress(psutil.Error):
                if is_snakemake(parent.cmdline()):
                    return parent
    return None


def is_gone(process: psutil.Process) -> bool:
    """Whether `process` has ended: no longer running (a zombie counts as ended), or its pid now names another."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


class WorkflowWatch:
    """Polls the workflow process that launched this job from a thread; calls `on_gone(cause)` once when it has
    ended, unless stopped first."""

    def __init__(self, workflow: psutil.Process, on_gone: Callable[[str], None], poll_s: float = POLL_S) -> None:
        """Watch `workflow`; `on_gone` runs in the watching thread."""
        self.workflow = workflow
        self.on_gone = on_gone
        self.poll_s = poll_s
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="workflow-watch", daemon=True)

    @property
    def description(self) -> str:
        """`snakemake (pid N)`, for messages."""
        return f"snakemake (pid {self.workflow.pid})"

    def start(self) -> WorkflowWatch:
        """Start polling; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling; once this returns, `on_gone` is not called any more."""
        with self._lock:
            self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self.poll_s):
            if not is_gone(self.workflow):
                continue
            with self._lock:
                if not self._stopped.is_set():
                    self.on_gone(f"the end of the workflow that launched this job ({self.description} is gone)")
            return


def is_point_job(cmdline: list[str]) -> bool:
    """Whether a command line is `ddsweep run-point ...` (the console script or `python -m ddsweep`)."""
    return "run-point" in cmdline[1:4] and any(os.path.basename(part) == "ddsweep" for part in cmdline[:3])


def point_jobs(pid: int | None = None) -> list[psutil.Process]:
    """The `ddsweep run-point` processes among the descendants of `pid` (this process by default)."""
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid or os.getpid()).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if is_point_job(child.cmdline()):
                    found.append(child)
    return found


def stop_point_jobs_on_sigterm() -> bool:
    """In the Snakemake process: make the SIGTERM on which Snakemake waits for its running jobs also send SIGTERM to
    the point jobs among its descendants. Returns whether this Snakemake has the handler it wraps (its job
    scheduler's `exit_gracefully`); where not, its point jobs still stop once Snakemake is gone (WorkflowWatch)."""
    try:
        from snakemake.scheduling.job_scheduler import JobScheduler
    except ImportError:
        return False
    graceful = getattr(JobScheduler, "exit_gracefully", None)
    if graceful is None or getattr(graceful, "stops_point_jobs", False):
        return graceful is not None

    def exit_gracefully(self: Any, *args: Any) -> Any:
        for job in point_jobs():
            with contextlib.suppress(psutil.Error):
                job.send_signal(signal.SIGTERM)
        return graceful(self, *args)

    exit_gracefully.stops_point_jobs = True  # type: ignore[attr-defined]
    JobScheduler.exit_gracefully = exit_gracefully  # type: ignore[method-assign]
    return True
