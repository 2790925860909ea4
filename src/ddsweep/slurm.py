"""What ddsweep reads from Slurm's own tools: durations as squeue prints them (`%L` time left, `%M` elapsed), and
the time left to this job, and whether another job still runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess


def parse_slurm_duration(text: str) -> float | None:
    """Seconds of a Slurm duration (`days-hours[:minutes[:seconds]]`, `hours:minutes:seconds`, `minutes:seconds`,
    `seconds`); None for UNLIMITED, NOT_SET or anything else."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", text.strip())
    if not match:
        return None
    days, clock = match.groups()
    parts = [int(x) for x in clock.split(":")]
    if days is not None:  # after days the first field is hours
        parts += [0] * (3 - len(parts))
    hours, minutes, seconds = [0] * (3 - len(parts)) + parts
    return float(((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_time_left_s() -> float | None:
    """Seconds left before this Slurm job's time limit (`squeue -o %L`), or None outside a job, without a limit,
    or when squeue does not answer."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or not shutil.which("squeue"):
        return None
    try:
        answer = subprocess.run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True,
                                timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_slurm_duration(answer)


# Job states of squeue's %T after which the job runs no more (a preempted job Slurm requeues turns PENDING).
ENDED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})


def slurm_job_running(job: str, host: str | None = None) -> bool | None:
    """Whether Slurm job `job` is still queued or running (`squeue -j`), and where `host` is given, as the job whose
    batch host that is (a job id seen on another cluster, as a store's marks may carry, names another job here);
    None where squeue does not answer here."""
    if not shutil.which("squeue"):
        return None
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %B"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    # a job Slurm no longer lists: no line, or "Invalid job id specified" with a non-zero status; one it still
    # lists may have ended (squeue shows every state of a job asked for by id where its version does)
    state, _, batch_host = (done.stdout.strip().split("\n")[0] if done.returncode == 0 else "").partition(" ")
    if not state or state in ENDED_STATES:
        return False
    known = batch_host.strip() not in ("", "n/a", "(null)")
    return not (host and known and batch_host.strip().split(".")[0] != host.split(".")[0])
