"""Progress output of the long CLI steps (`ddsweep bench`, `ddsweep coding-eval`): on a terminal one line redrawn
in place with a progress bar; anywhere else (a job's log file) every line as it comes, so logs stay readable."""

from __future__ import annotations

import re
import shutil
import sys
from typing import TextIO

# A step line starts with its count: "cell 3/24 …" (benchmark) or "[3/164] …" (coding eval).
STEP_COUNT = re.compile(r"^\W*(?:cell\s+)?(\d+)/(\d+)\b")
BAR_WIDTH = 24


class ProgressLine:
    """A progress callback: call it with each progress line; `close()` ends the redrawn line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        """Write to `stream` (default stderr); draw a bar only when it is a terminal."""
        self.stream = stream or sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar = ""
        self.drawn = False

    def __call__(self, line: str) -> None:
        """Show one progress line: a step line moves the bar, any other line is shown beside the last bar."""
        if not self.terminal:
            print(line, file=self.stream, flush=True)
            return
        count = STEP_COUNT.match(line)
        if count:
            done, total = int(count.group(1)), max(1, int(count.group(2)))
            filled = min(BAR_WIDTH, round(BAR_WIDTH * done / total))
            self.bar = f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {done}/{total}"
        columns = shutil.get_terminal_size((100, 20)).columns
        text = f"{self.bar} {line.strip()}" if self.bar else line.strip()
        self.stream.write("\r" + text[: columns - 1].ljust(columns - 1))
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """End the redrawn line, so what is printed next starts on a line of its own."""
        if self.terminal and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False
