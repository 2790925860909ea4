"""Coding outcomes per point: pass rates with truncations and real failures counted apart, and the exact-match
comparison of every point's outputs against the `ar` baseline's (losslessness)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ddsweep.analysis.results import ResultSet, ar_point_id, is_truncated, read_coding_repeat


@dataclass
class LosslessResult:
    """Exact-match comparison of every point's coding outputs against the `ar` baseline's, next to the rate at
    which `ar` agrees with itself (the floor; None when `ar` answered only once)."""

    available: bool
    reason: str | None
    by_point: dict[str, dict[str, Any]]
    floor: dict[str, Any] | None = None


def lossless_vs_ar(results: ResultSet) -> LosslessResult:
    """Compare each point's coding outputs with the ar baseline's, against the ar-vs-ar floor
    (ddsweep.coding.lossless.assess_lossless: a point is flagged only when below the floor with confidence)."""
    from ddsweep.coding.lossless import assess_lossless

    ar_id = ar_point_id(results)
    if ar_id is None or ar_id not in results.coding_records:
        return LosslessResult(False, "no completed `ar` point with coding outputs to compare against", {})

    def usable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if isinstance(r.get("task_id"), str)]

    repeat = read_coding_repeat(results.results_dir, ar_id)
    assessed = assess_lossless(usable(results.coding_records[ar_id]), usable(repeat) if repeat else None,
                               {pid: usable(records) for pid, records in results.coding_records.items()
                                if pid != ar_id}, results.confidence)
    return LosslessResult(True, None, assessed["points"], assessed["floor"])


def coding_stats(results: ResultSet) -> pd.DataFrame:
    """Per point: problems, passed, pass rate, truncation failures and real failures, counted separately.

    Problems whose request failed are left out: they say nothing about the model's answers."""
    rows = []
    for point_id, all_records in results.coding_records.items():
        records = [r for r in all_records if r.get("error_kind") != "request"]
        failed = [r for r in records if not r.get("passed")]
        truncated = [r for r in failed if is_truncated(r)]
        retried_pass = sum(1 for r in truncated if isinstance(r.get("retry"), dict) and r["retry"].get("passed"))
        kinds: dict[str, int] = {}
        for r in failed:
            if not is_truncated(r):
                kind = str(r.get("error_kind") or "unknown")
                kinds[kind] = kinds.get(kind, 0) + 1
        rows.append({
            "point_id": point_id, "problems": len(records), "passed": len(records) - len(failed),
            "pass_rate": (len(records) - len(failed)) / len(records) if records else math.nan,
            "truncated_failures": len(truncated), "real_failures": len(failed) - len(truncated),
            "passed_after_retry": retried_pass,
            "real_failure_kinds": ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())),
        })
    columns = ["point_id", "problems", "passed", "pass_rate", "truncated_failures", "real_failures",
               "passed_after_retry", "real_failure_kinds"]
    return pd.DataFrame(rows, columns=columns)
