"""Text helpers for failure reasons, shared by the summary and the adaptive funnel (which must not pay for pandas
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


MIN_INTERVAL_SAMPLES = 3
MORE_NEEDED = "more repeats or launches are needed for an interval"


def interval_meaningful(value: float | None, low: float | None, high: float | None, n: int | None) -> bool:
    """Whether an interval can be printed as one: from at least MIN_INTERVAL_SAMPLES samples and no wider than
    the figure itself (a 95% interval from two samples spans ±12.7 standard errors: "0.00–34565")."""
    return (value is not None and low is not None and high is not None and n is not None
            and n >= MIN_INTERVAL_SAMPLES and high - low <= abs(value))


def no_interval(n: int | None, samples: list[str] | None = None) -> str:
    """What is printed instead of a meaningless interval: 'n = 2: 710–760; more repeats ... needed'."""
    shown = f": {'–'.join(samples)}" if samples and len(samples) > 1 else ""
    return f"n = {n or 0}{shown}; {MORE_NEEDED}"
