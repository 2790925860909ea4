"""Statistics for benchmark figures: percentiles, medians and confidence intervals (pure functions)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 12345


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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Cumulative distribution function of Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Inverse of `t_cdf` by bisection (p in (0, 1))."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be within (0, 1), got {p}")
    low, high = -1e6, 1e6
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Confidence interval of the mean from Student's t (needs at least two values)."""
    n = len(values)
    if n < 2:
        raise ValueError("a t-interval needs at least two values")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def bootstrap_median_ci(values: Sequence[float], confidence: float = 0.95, samples: int = BOOTSTRAP_SAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median, reproducible through a fixed seed."""
    if not values:
        raise ValueError("bootstrap of an empty sequence")
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(median([values[rng.randrange(n)] for _ in range(n)]) for _ in range(samples))
    alpha = (1.0 - confidence) / 2.0
    return percentile(medians, 100 * alpha), percentile(medians, 100 * (1 - alpha))


def median_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """95% interval for the median across repeats: the value itself for one repeat, the t-interval of the
    mean for two, a fixed-seed bootstrap for three or more."""
    if not values:
        raise ValueError("confidence interval of an empty sequence")
    if len(values) == 1:
        return values[0], values[0]
    if len(values) < 3:
        return t_interval(values, confidence)
    return bootstrap_median_ci(values, confidence)


def summarize_repeats(values: Sequence[float | None]) -> dict:
    """{"median", "ci_low", "ci_high", "values"} across repeats, ignoring missing values (all None if none)."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return {"median": None, "ci_low": None, "ci_high": None, "values": list(values)}
    low, high = median_ci(present)
    return {"median": median(present), "ci_low": low, "ci_high": high, "values": list(values)}


def context_check(prompt_tokens: Sequence[int | None], context: int, tolerance: float) -> dict:
    """Whether the server-reported prompt lengths of a cell's requests hit its target context within `tolerance`
    (relative); a cell whose server reported no length is flagged too, since nothing confirms its context."""
    reported = [n for n in prompt_tokens if n is not None]
    worst = max((abs(n - context) / context for n in reported), default=None)
    return {"prompt_tokens_min": min(reported, default=None), "prompt_tokens_max": max(reported, default=None),
            "prompt_tokens_max_rel_error": worst, "context_tolerance": tolerance,
            "prompt_tokens_off_target": worst is None or worst > tolerance}
