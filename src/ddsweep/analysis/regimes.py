"""Decision regimes: one metric at one (context, concurrency) cell, resolved onto the cells the results hold,
with each point's per-repeat and per-launch figures and the comparison of two points there."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from ddsweep.analysis.launch_model import cell_launches, launch_difference, pooled_variances
from ddsweep.analysis.results import METRIC_COLUMNS, ResultSet, is_missing
from ddsweep.analysis.settings import Regime
from ddsweep.analysis.statistics import Estimate, LogDifference, log_difference


@dataclass
class ResolvedRegime:
    """A regime mapped onto the cell actually present in the data, with one row per point."""

    regime: Regime
    context: int | None
    concurrency: int | None
    note: str | None
    table: pd.DataFrame
    repeats: dict[str, dict[int, float]] = field(default_factory=dict)
    # per point: launch index -> launch figure (mean log), and the pooled two-way launch variance (launch_model)
    launches: dict[str, dict[int, float]] = field(default_factory=dict)
    launch_variance: tuple[float, int] = (math.nan, 0)
    _figures: dict[str, dict[str, float]] | None = field(default=None, repr=False, compare=False)

    def cell(self) -> str:
        """The cell used, e.g. 'context 128, C=1'."""
        if self.context is None:
            return "no data"
        return f"context {self.context}, C={self.concurrency}"

    def figure(self, point_id: str) -> dict[str, float] | None:
        """Return {mean, ci_low, ci_high, repeats} of `point_id` in this regime, or None."""
        if self._figures is None:
            self._figures = {
                str(pid): {"mean": float(m), "ci_low": float(lo), "ci_high": float(hi), "repeats": int(n)}
                for pid, m, lo, hi, n in zip(self.table["point_id"], self.table["mean"], self.table["ci_low"],
                                             self.table["ci_high"], self.table["repeats"], strict=True)}
        figure = self._figures.get(point_id)
        return dict(figure) if figure else None

    def difference(self, point_id: str, other_id: str) -> LogDifference | None:
        """Log ratio of `point_id` over `other_id` in the better direction (> 0: `point_id` is better)."""
        la, lb = self.launches.get(point_id), self.launches.get(other_id)
        if la and lb and len(la) >= 2 and len(lb) >= 2:  # launches are the unit
            v2, df2 = self.launch_variance
            return launch_difference(lb, la, v2, df2) if self.regime.lower_is_better else launch_difference(
                la, lb, v2, df2)
        a, b = self.repeats.get(point_id), self.repeats.get(other_id)
        if not a or not b:
            return None
        diff = log_difference(b, a) if self.regime.lower_is_better else log_difference(a, b)
        return diff

    def units(self, point_id: str) -> dict[int, float]:
        """The independent figures of a point for combined comparisons: one per launch (exp of the launch's mean
        log, keyed by launch index) when it ran in two or more, else one per repeat."""
        launches = self.launches.get(point_id)
        if launches and len(launches) >= 2:
            return {k: math.exp(v) for k, v in launches.items()}
        return self.repeats.get(point_id, {})

    def speedup(self, point_id: str, other_id: str | None, level: float) -> Estimate | None:
        """How many times better `point_id` is than `other_id` (> 1: better), with its interval."""
        diff = self.difference(point_id, other_id) if other_id else None
        return diff.ratio(level) if diff else None


def repeat_values(cells: pd.DataFrame, metric: str, context: int, concurrency: int,
                  point_ids: list[str] | None = None) -> dict[str, dict[int, float]]:
    """Per point: repeat index -> the per-repeat figure of `metric` at one cell (missing values left out)."""
    column = METRIC_COLUMNS[metric]
    at = cells[(cells["context"] == context) & (cells["concurrency"] == concurrency)]
    if point_ids is not None:
        at = at[at["point_id"].isin(point_ids)]
    out: dict[str, dict[int, float]] = {}
    for pid, rep, value in zip(at["point_id"], at["repeat"], at[column], strict=True):
        if not is_missing(value) and not math.isnan(float(value)):
            out.setdefault(str(pid), {})[int(rep) if not is_missing(rep) else 0] = float(value)
    return out


def resolve_regime(results: ResultSet, regime: Regime, point_ids: list[str] | None = None) -> ResolvedRegime:
    """Select the regime's metric at its cell (or the nearest cell present) for each point in `point_ids`."""
    groups = results.groups
    data = groups[groups["metric"] == regime.metric]
    if point_ids is not None:
        data = data[data["point_id"].isin(point_ids)]
    if data.empty:
        return ResolvedRegime(regime, None, None, f"no {regime.metric} figures in the data", data.copy())
    data = data[(data["context"] > 0) & (data["concurrency"] > 0)]
    if data.empty:
        return ResolvedRegime(regime, None, None, f"no {regime.metric} figures at a valid cell", data.copy())
    contexts = sorted({int(c) for c in data["context"].dropna()})
    context = min(contexts, key=lambda c: (abs(math.log(c / regime.context)), c))
    at_context = data[data["context"] == context]
    concurrencies = sorted({int(c) for c in at_context["concurrency"].dropna()})
    concurrency = min(concurrencies, key=lambda c: (abs(math.log(c / regime.concurrency)), c))
    note = None
    if (context, concurrency) != (regime.context, regime.concurrency):
        note = (f"configured cell context {regime.context}, C={regime.concurrency} is not in the data; "
                f"used the nearest available, context {context}, C={concurrency}")
    table = data[(data["context"] == context) & (data["concurrency"] == concurrency)]
    table = table.sort_values(["mean", "point_id"], ascending=[regime.lower_is_better, True]).reset_index(drop=True)
    repeats = repeat_values(results.cells, regime.metric, context, concurrency, list(table["point_id"]))
    cells = results.cells
    at = cells[(cells["context"] == context) & (cells["concurrency"] == concurrency)
               & cells["point_id"].isin(list(table["point_id"]))]
    launches = cell_launches(at, METRIC_COLUMNS[regime.metric])
    _, _, v2, df2 = pooled_variances(launches)
    return ResolvedRegime(regime, context, concurrency, note, table, repeats, launches, (v2, df2))
