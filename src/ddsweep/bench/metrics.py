"""Descriptions of a benchmark's cells for cells.json: figures across repeats and the context check (pure
functions). The figures themselves are ddsweep.figures'; intervals are the analysis's (analysis/statistics.py)."""

from __future__ import annotations

from collections.abc import Sequence

from ddsweep.figures import median


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
