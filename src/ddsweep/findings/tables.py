"""The overview table beside the decisions and the tidy CSV files of results/tables/ (docs/results-schema.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from ddsweep.analysis.coding_outcomes import LosslessResult, coding_stats
from ddsweep.analysis.regimes import ResolvedRegime
from ddsweep.analysis.results import KNOBS, ResultSet, ar_point_id


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
