"""Server launches as the independent unit: a variance-components model over the study's points.

A point measured in several launches has figures x[k, r] (launch k, repeat r within it). In logs,
x = point + shared(k, r) + launch(k) + noise: the launch effect is shared by every repeat of one launch, so the
repeats of one launch are not independent and the launch is the unit. Each launch's figure is the mean log of
its repeats; the variance of a launch's figure around its point (launch variance plus the within-launch noise of
one launch's mean) is pooled over every point of the study at the same cell, which assumes the relative launch
variation is alike across points (it is a property of the servers and nodes, not of the knobs), and gives the
intervals many degrees of freedom even with two launches per point:

- a point's figure: its mean with the interval exp(± t · sqrt(v1 / L)), v1 the one-way pooled variance of launch
  figures (df Σ(L − 1));
- a comparison: the mean of the per-launch log ratios paired on the launch index (launch k of every point ran
  the same prompts), with standard error sqrt(2 · v2 / K) over the K shared launches, v2 the two-way pooled
  residual (the launch-index effect removed, df Σ(L − 1) − (launch indices − 1)).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from ddsweep.analysis.statistics import Estimate, LogDifference, mean_interval, t_quantile


def launch_figures(repeats: Mapping[int, float], launch_of: Mapping[int, int]) -> dict[int, float]:
    """Launch index -> mean log figure of its repeats (repeats without a launch are left out)."""
    logs: dict[int, list[float]] = {}
    for rep, value in repeats.items():
        if value and value > 0 and rep in launch_of:
            logs.setdefault(launch_of[rep], []).append(math.log(value))
    return {k: sum(v) / len(v) for k, v in logs.items()}


def pooled_variances(per_point: Mapping[str, Mapping[int, float]]) -> tuple[float, int, float, int]:
    """(v1, df1, v2, df2): one-way and two-way pooled variances of launch figures over points with two or more
    launches (log scale); a variance is NaN when its degrees of freedom are zero."""
    used = {pid: f for pid, f in per_point.items() if len(f) >= 2}
    ss1, df1 = 0.0, 0
    centred: dict[str, dict[int, float]] = {}
    for pid, figures in used.items():
        mean = sum(figures.values()) / len(figures)
        centred[pid] = {k: v - mean for k, v in figures.items()}
        ss1 += sum(d * d for d in centred[pid].values())
        df1 += len(figures) - 1
    effects: dict[int, list[float]] = {}
    for deviations in centred.values():
        for k, d in deviations.items():
            effects.setdefault(k, []).append(d)
    shared = {k: sum(v) / len(v) for k, v in effects.items()}
    ss2 = sum((d - shared[k]) ** 2 for deviations in centred.values() for k, d in deviations.items())
    df2 = df1 - (len(shared) - 1) if len(used) > 1 else 0
    return (ss1 / df1 if df1 else math.nan, df1, ss2 / df2 if df2 > 0 else math.nan, max(0, df2))


def figure_half_width(mean: float, launches: int, v1: float, df1: int, level: float) -> tuple[float, float]:
    """A point's (low, high) interval from its launches and the pooled launch variance (NaN without one)."""
    if launches < 1 or df1 < 1 or math.isnan(v1):
        return math.nan, math.nan
    half = t_quantile(0.5 + level / 2, df1) * math.sqrt(v1 / launches)
    return mean * math.exp(-half), mean * math.exp(half)


def launch_difference(a: Mapping[int, float], b: Mapping[int, float], v2: float, df2: int) -> LogDifference | None:
    """Mean log ratio of a over b paired on the launch index, with the pooled two-way launch variance."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    mean = sum(a[k] - b[k] for k in common) / len(common)
    if df2 < 1 or math.isnan(v2):
        return LogDifference(mean, math.nan, 0, len(common), True)
    return LogDifference(mean, math.sqrt(2 * v2 / len(common)), df2, len(common), True)


def read_launch_map(point_dir: Path) -> dict[int, int]:
    """Repeat index -> launch index of a point merged from launches (launches.json; each launch lists its
    repeats, else launch k is repeat k, the layout of one repeat per launch); empty for a single launch."""
    path = Path(point_dir) / "launches.json"
    try:
        launches = json.loads(path.read_text(encoding="utf-8")).get("launches") or []
    except (OSError, ValueError, AttributeError):
        return {}
    mapping: dict[int, int] = {}
    for k, launch in enumerate(launches):
        repeats = launch.get("repeats") if isinstance(launch, dict) else None
        for rep in repeats if isinstance(repeats, list) else [k]:
            mapping[int(rep)] = int(launch.get("launch", k)) if isinstance(launch, dict) else k
    return mapping if len(set(mapping.values())) >= 2 else {}


def cell_launches(cells: pd.DataFrame, column: str) -> dict[str, dict[int, float]]:
    """Per point: launch index -> launch figure (mean log of its repeats) of one cell's rows."""
    out: dict[str, dict[int, list[float]]] = {}
    if "launch" not in cells.columns:
        return {}
    for pid, launch, value in zip(cells["point_id"], cells["launch"], cells[column], strict=True):
        if launch is None or pd.isna(launch) or value is None or pd.isna(value) or float(value) <= 0:
            continue
        out.setdefault(str(pid), {}).setdefault(int(launch), []).append(math.log(float(value)))
    return {pid: {k: sum(v) / len(v) for k, v in figs.items()} for pid, figs in out.items()}


def point_estimates(at: pd.DataFrame, column: str, level: float) -> dict[str, Estimate]:
    """Per point of one cell's rows: the mean of its repeats with its interval at `level`, from its launches (the
    launch variance pooled over the cell's points, as `launch_intervals`) where it ran in two or more, else from
    its repeats."""
    by_launch = {key[0]: bounds for key, bounds in launch_intervals(at, {column: column}, level).items()}
    values: dict[str, list[float]] = {}
    for pid, value in zip(at["point_id"], at[column], strict=True):  # a plain loop: called per cell and metric
        values.setdefault(str(pid), []).extend([float(value)] if pd.notna(value) else [])
    out = {}
    for pid in sorted(values):
        estimate = mean_interval(values[pid], level)
        if pid in by_launch:
            low, high, _ = by_launch[pid]
            estimate = Estimate(estimate.value, low, high, estimate.n, level)
        out[pid] = estimate
    return out


def launch_intervals(cells: pd.DataFrame, columns: Mapping[str, str], level: float
                     ) -> dict[tuple[str, int, int, str], tuple[float, float, int]]:
    """(point, context, concurrency, metric) -> (low, high, launches) of points measured in two or more launches,
    from the launch variance pooled over the points at that cell; points of one launch are left out."""
    out: dict[tuple[str, int, int, str], tuple[float, float, int]] = {}
    if cells.empty or "launch" not in cells.columns or cells["launch"].isna().all():
        return out
    for (context, concurrency), at in cells.groupby(["context", "concurrency"], sort=True, dropna=True):
        for metric, column in columns.items():
            figures = cell_launches(at, column)
            v1, df1, _, _ = pooled_variances(figures)
            for pid, figs in figures.items():
                if len(figs) < 2:
                    continue
                values = [float(v) for v in at[at["point_id"] == pid][column] if pd.notna(v)]
                low, high = figure_half_width(sum(values) / len(values), len(figs), v1, df1, level)
                out[(pid, int(context), int(concurrency), metric)] = (low, high, len(figs))
    return out
