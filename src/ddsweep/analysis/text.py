"""Text helpers for failure reasons, shared by the summary and the adaptive funnel (which must not pay for pandas
by importing analysis.results)."""

from __future__ import annotations


def first_line(text: str | None) -> str | None:
    """The first non-empty line of a message (a failure's one-line reason)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else None
