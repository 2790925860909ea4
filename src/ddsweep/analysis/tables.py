"""Per-point tables beside the decisions: coding outcomes, output comparison against `ar`, the overview table,
and the tidy CSV files of results/tables/ (docs/results-schema.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ddsweep.analysis.regimes import ResolvedRegime
from ddsweep.analysis.results import KNOBS, ResultSet, ar_point_id, is_truncated, read_coding_repeat


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
    (ddsweep.coding.lossless.assess_lossless: a point is flagged only when clearly below the floor)."""
    from ddsweep.coding.lossless import assess_lossless

    ar_id = ar_point_id(results)
    if ar_id is None or ar_id not in results.coding_records:
        return LosslessResult(False, "no completed `ar` point with coding outputs to compare against", {})

    def usable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if isinstance(r.get("task_id"), str)]

    repeat = read_coding_repeat(results.results_dir, ar_id)
    assessed = assess_lossless(usable(results.coding_records[ar_id]), usable(repeat) if repeat else None,
                               {pid: usable(records) for pid, records in results.coding_records.items()
                                if pid != ar_id})
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


def overview_table(results: ResultSet, regimes: list[ResolvedRegime], lossless: LosslessResult) -> pd.DataFrame:
    """One row per point: regime figures with CIs, speed-up over `ar` at the same cell, coding figures."""
    ar_id = ar_point_id(results)
    coding = coding_stats(results).set_index("point_id")
    rows = []
    for p in results.points:
        row: dict[str, Any] = {"point_id": p.point_id, "kind": p.kind, **p.knobs(), "status": p.status}
        for resolved in regimes:
            name = resolved.regime.name
            fig = resolved.figure(p.point_id)
            row[f"{name}_{resolved.regime.metric}"] = fig["mean"] if fig else math.nan
            row[f"{name}_ci_low"] = fig["ci_low"] if fig else math.nan
            row[f"{name}_ci_high"] = fig["ci_high"] if fig else math.nan
            speedup = resolved.speedup(p.point_id, ar_id, results.confidence) if fig else None
            row[f"{name}_speedup_vs_ar"] = math.nan if speedup is None else speedup.value
            row[f"{name}_speedup_ci_low"] = math.nan if speedup is None else speedup.low
            row[f"{name}_speedup_ci_high"] = math.nan if speedup is None else speedup.high
        has_coding = p.point_id in coding.index
        row["pass_rate"] = coding.at[p.point_id, "pass_rate"] if has_coding else math.nan
        row["truncated_failures"] = coding.at[p.point_id, "truncated_failures"] if has_coding else math.nan
        match = lossless.by_point.get(p.point_id)
        row["exact_match_rate_vs_ar"] = match.get("exact_match_rate") if match else (
            1.0 if p.point_id == ar_id and has_coding and lossless.available else math.nan)
        row["simulated"] = p.simulated
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    for knob in KNOBS:
        frame[knob] = pd.array(frame[knob].tolist(), dtype="Int64")
    return frame


def write_tables(results: ResultSet, tables_dir: str | Path, overview: pd.DataFrame) -> dict[str, Path]:
    """Write points, bench_cells, bench_groups, coding and overview CSVs atomically; return their paths."""
    from ddsweep.storage import write_text_atomic

    tables_dir = Path(tables_dir)
    frames = {
        "points": results.points_frame(), "bench_cells": results.cells, "bench_groups": results.groups,
        "coding": results.coding, "overview": overview, "failures": results.failures_frame(),
        "jobs": results.jobs_frame(),
    }
    paths = {}
    for name, frame in frames.items():
        if frame.empty and not len(frame.columns):
            frame = pd.DataFrame(columns=["point_id", "simulated"])
        if "simulated" not in frame.columns:
            frame = frame.assign(simulated=results.simulated)
        paths[name] = write_text_atomic(tables_dir / f"{name}.csv", frame.to_csv(index=False))
    return paths
