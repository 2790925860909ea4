"""Descriptive statistics for benchmark figures: percentiles and medians (pure functions). Intervals are the
analysis's (analysis/statistics.py), computed from the request records."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    return _interpolate(sorted(values), q)


def _interpolate(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile of already sorted values, so several percentiles need one sort."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count)."""
    return percentile(values, 50.0)


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    """{"p50": ..., "p90": ..., "p99": ...} for `values`, with None entries when there are no values."""
    ordered = sorted(values)
    return {f"p{q}": (_interpolate(ordered, q) if ordered else None) for q in qs}


def summarize_repeats(values: Sequence[float | None]) -> dict:
    """{"median", "min", "max", "values"} across repeats, ignoring missing values (all None if none): a
    description for a reader of cells.json, not an interval; `ddsweep summarize` computes the intervals."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None, "values": list(values)}
    return {"median": median(present), "min": min(present), "max": max(present), "values": list(values)}


def context_check(prompt_tokens: Sequence[int | None], context: int, tolerance: float) -> dict:
    """Whether the server-reported prompt lengths of a cell's requests hit its target context within `tolerance`
    (relative); a cell whose server reported no length is flagged too, since nothing confirms its context."""
    reported = [n for n in prompt_tokens if n is not None]
    worst = max((abs(n - context) / context for n in reported), default=None)
    return {"prompt_tokens_min": min(reported, default=None), "prompt_tokens_max": max(reported, default=None),
            "prompt_tokens_max_rel_error": worst, "context_tolerance": tolerance,
            "prompt_tokens_off_target": worst is None or worst > tolerance}
