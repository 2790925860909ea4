"""What ddsweep reads from Slurm's own tools: durations as squeue prints them (`%L` time left, `%M` elapsed), and
the time left to this job."""

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
