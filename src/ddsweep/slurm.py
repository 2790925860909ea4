"""What ddsweep reads from Slurm's own tools: durations as squeue prints them (`%L` time left, `%M` elapsed)."""

from __future__ import annotations

import re


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
