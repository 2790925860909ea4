"""Progress output: a bar redrawn in place on a terminal, plain lines in a log file."""

from __future__ import annotations

import io

from ddsweep.console import BAR_WIDTH, ProgressLine


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_redrawn_line_with_a_bar(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # the width the line is cut to; a pytest-xdist worker reports 80
    stream = Terminal()
    progress = ProgressLine(stream)
    progress("cell 6/24 coding ctx=128 C=1 rep=0: 8/8 ok, 512.0 tok/s")
    progress("  coding ctx=128 C=4 repeat 1: 3 done, 4 in flight, 600 tok/s")
    progress("[164/164] HumanEval/163: passed")
    progress.close()
    text = stream.getvalue()
    frames = text.split("\r")[1:]
    assert len(frames) == 3 and text.endswith("\n") and text.count("\n") == 1
    quarter = BAR_WIDTH // 4
    assert frames[0].startswith(f"[{'#' * quarter}{'-' * (BAR_WIDTH - quarter)}] 6/24 cell 6/24")
    assert frames[1].startswith(f"[{'#' * quarter}{'-' * (BAR_WIDTH - quarter)}] 6/24   ".rstrip())
    assert "4 in flight" in frames[1]  # a line without a count is shown beside the last bar
    assert frames[2].startswith(f"[{'#' * BAR_WIDTH}] 164/164")


def test_a_log_file_gets_every_line_as_it_comes() -> None:
    stream = io.StringIO()
    progress = ProgressLine(stream)
    progress("cell 1/2 prose ctx=128 C=1 rep=0: 8/8 ok")
    progress("[1/8] HumanEval/0: passed")
    progress.close()
    assert stream.getvalue() == "cell 1/2 prose ctx=128 C=1 rep=0: 8/8 ok\n[1/8] HumanEval/0: passed\n"
