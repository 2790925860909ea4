"""Intervals and comparisons on per-repeat figures: the one statistical method of the summary.

Repeats (one benchmark cell each) are the independent units. A point's figure at a cell is the mean of its
per-repeat figures with a Student-t interval; two points are compared by the ratio of their figures, from the
per-repeat log ratios paired on the repeat index (same prompts), else Welch's t on the logs. Winners need
one-sided tests beyond an equivalence margin with Holm's step-down correction. docs/statistics.md explains
why.

The distributions are SciPy's special functions (`scipy.special.stdtrit`, `stdtr`), which `scipy.stats.t`
itself evaluates: importing `scipy.stats` costs about a second of CPU in every `ddsweep` process that only
needs a quantile (select, plan, funnel), and a study starts dozens of them. Even `scipy.special` is imported
only when a quantile is first asked for: every Snakemake invocation (and each of its Slurm jobs) loads the
workflow, which imports this module without computing anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile; a fractional df (Welch) is rounded down, which is conservative."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be within (0, 1), got {p}")
    from scipy import special

    return float(special.stdtrit(_whole(df), p))


def _whole(df: float) -> int:
    """Degrees of freedom rounded down, at least 1."""
    return max(1, int(math.floor(df)))


@dataclass(frozen=True)
class Estimate:
    """A figure with its confidence interval (NaN bounds when fewer than two repeats) and its basis."""

    value: float
    low: float
    high: float
    n: int
    level: float
    # the interval's degrees of freedom where they are not n - 1 (a ratio of launch figures pooled over the points)
    df: float | None = None

    @property
    def has_interval(self) -> bool:
        """True when the interval is defined (two or more repeats)."""
        return not (math.isnan(self.low) or math.isnan(self.high))

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-ready form: value, ci_low, ci_high (None when undefined), n, level, and df where set."""
        def clean(x: float) -> float | None:
            return None if math.isnan(x) else x
        out = {"value": clean(self.value), "ci_low": clean(self.low), "ci_high": clean(self.high),
               "n": self.n, "level": self.level}
        return out if self.df is None else {**out, "df": self.df}


def mean_interval(values: Sequence[float], level: float = 0.95) -> Estimate:
    """Mean of per-repeat values with the Student-t interval (n - 1 degrees of freedom); no interval for n < 2."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(xs)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, level)
    mean = sum(xs) / n
    if n < 2:
        return Estimate(mean, math.nan, math.nan, n, level)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, level)


@dataclass(frozen=True)
class LogDifference:
    """Mean log ratio of two points' figures, its standard error and degrees of freedom (paired or Welch)."""

    mean: float
    se: float
    df: float
    n: int
    paired: bool

    def ratio(self, level: float = 0.95) -> Estimate:
        """The ratio exp(mean) with its t interval at `level` (no interval without degrees of freedom)."""
        if self.df < 1 or math.isnan(self.se):
            return Estimate(math.exp(self.mean), math.nan, math.nan, self.n, level)
        half = t_quantile(0.5 + level / 2, self.df) * self.se
        return Estimate(math.exp(self.mean), math.exp(self.mean - half), math.exp(self.mean + half), self.n, level,
                        self.df)

    def p_greater(self, threshold: float) -> float:
        """One-sided p-value of H0: true log ratio <= log(threshold) against H1: it is larger."""
        if self.df < 1 or math.isnan(self.se):
            return 1.0
        gap = self.mean - math.log(threshold)
        if self.se == 0:
            return 0.0 if gap > 0 else 1.0
        from scipy import special

        return float(special.stdtr(_whole(self.df), -gap / self.se))  # the upper tail: P(T > gap / se)


def log_difference(a: Mapping[int, float], b: Mapping[int, float]) -> LogDifference | None:
    """Compare per-repeat figures of two points (repeat index -> positive value): paired log ratios on the
    repeats both have when there are two or more, else Welch's t on the logs; None without positive data."""
    la = {k: math.log(v) for k, v in a.items() if v is not None and v > 0}
    lb = {k: math.log(v) for k, v in b.items() if v is not None and v > 0}
    if not la or not lb:
        return None
    common = sorted(set(la) & set(lb))
    if len(common) >= 2:
        d = [la[k] - lb[k] for k in common]
        n = len(d)
        mean = sum(d) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
        return LogDifference(mean, sd / math.sqrt(n), n - 1, n, True)
    xa, xb = list(la.values()), list(lb.values())
    ma, mb = sum(xa) / len(xa), sum(xb) / len(xb)
    if len(xa) < 2 or len(xb) < 2:
        return LogDifference(ma - mb, math.nan, 0, min(len(xa), len(xb)), False)
    va = sum((x - ma) ** 2 for x in xa) / (len(xa) - 1) / len(xa)
    vb = sum((x - mb) ** 2 for x in xb) / (len(xb) - 1) / len(xb)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1)) if se > 0 else len(xa) + len(xb) - 2
    return LogDifference(ma - mb, se, df, min(len(xa), len(xb)), False)


def combined_difference(parts: Sequence[tuple[float, Mapping[int, float], Mapping[int, float]]]
                        ) -> LogDifference | None:
    """Weighted sum of log ratios over several cells, paired per repeat: parts are (weight, a, b) with
    repeat-indexed figures; repeats missing from any part are left out. None with fewer than two repeats."""
    total = sum(w for w, _, _ in parts)
    if not parts or total <= 0:
        return None
    common: set[int] | None = None
    for _, a, b in parts:
        keys = {k for k in a if a[k] and a[k] > 0} & {k for k in b if b[k] and b[k] > 0}
        common = keys if common is None else common & keys
    reps = sorted(common or [])
    if len(reps) < 2:
        return None
    d = [sum(w / total * (math.log(a[k]) - math.log(b[k])) for w, a, b in parts) for k in reps]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return LogDifference(mean, sd / math.sqrt(n), n - 1, n, True)


def holm(p_values: Mapping[str, float], alpha: float) -> dict[str, bool]:
    """Holm's step-down procedure: which null hypotheses are rejected with family-wise error <= alpha."""
    ordered = sorted(p_values.items(), key=lambda kv: (kv[1], kv[0]))
    m = len(ordered)
    rejected: dict[str, bool] = {}
    stop = False
    for i, (key, p) in enumerate(ordered):
        if not stop and p <= alpha / (m - i):
            rejected[key] = True
        else:
            stop = True
            rejected[key] = False
    return rejected


def holm_levels(p_values: Mapping[str, float], alpha: float) -> dict[str, float]:
    """The significance level each hypothesis faces in Holm's procedure, alpha / (m - rank), rank 0 for the
    smallest p-value: a one-sided test rejects at that level exactly when the two-sided interval at
    1 - 2·level lies beyond the null (so that the printed interval and the test agree)."""
    ordered = sorted(p_values.items(), key=lambda kv: (kv[1], kv[0]))
    return {key: alpha / (len(ordered) - i) for i, (key, _) in enumerate(ordered)}
