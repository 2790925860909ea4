"""A point job notices that the workflow which launched it has ended, and stops instead of measuring on.

Snakemake runs a job's shell command in a shell of its own (`bash -c`), which runs `ddsweep run-point`; under Slurm
the job step runs Snakemake on the node (`python -m snakemake ... --executor slurm-jobstep`), which does the same.
A SIGTERM sent to Snakemake alone (`kill`, a wrapper's timeout, a CI limit) ends Snakemake but not its jobs: the
shell and the job are reparented and would go on measuring beside the next invocation's. So the job records the
nearest Snakemake process among its ancestors when it starts (the one that launched it: on a Slurm node, the job
step's) and polls it; once that process is gone (or a zombie, or its pid reused), the job is told why."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

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
