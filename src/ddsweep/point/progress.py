"""A point job's progress lines: timestamped, to stderr (the job's log) and to the attempt's own progress.log."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

# The attempt's own progress lines, in its point directory (results-schema.md).
PROGRESS_LOG = "progress.log"


def stamped(message: str) -> str:
    """A progress line with the time it was written."""
    return f"[{datetime.now().strftime('%H:%M:%S')}] {message}"


def to_stderr(message: str) -> None:
    """Progress lines go to stderr (the job's log) with a timestamp."""
    print(stamped(message), file=sys.stderr, flush=True)


def logged(progress: Callable[[str], None], path: Path) -> tuple[Callable[[str], None], Callable[[str], None]]:
    """`progress` that also appends each line, timestamped, to `path` (the attempt's own log, which stays with its
    record: a later attempt moves it to attempts/ with the rest, whereas Snakemake removes a job's log file before
    every attempt), and a writer to that file alone. A line that cannot be written is left out of the file only."""

    def to_file(message: str) -> None:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as handle:
            handle.write(stamped(message) + "\n")

    def both(message: str) -> None:
        progress(message)
        to_file(message)
    return both, to_file
