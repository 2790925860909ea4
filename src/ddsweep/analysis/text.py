"""The one-line reason of a failure, shared by the summary and the adaptive funnel (which must not pay for pandas
by importing analysis.results)."""

from __future__ import annotations


def first_line(text: str | None) -> str | None:
    """The first non-empty line of a message (a failure's one-line reason), without a trailing clause that only
    introduces the lines after it ("…; last log lines:")."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return None
    head, _, intro = lines[0].rpartition("; ")
    return head if head and intro.endswith(":") and len(lines) > 1 else lines[0]
