"""How figures, intervals and ratios are written: shared by the analysis, which writes the sentences and tables of
the decision object, and the report, which renders that object. Works on JSON-shaped figures
(`{value, ci_low, ci_high, n, level}`); imports nothing from the package."""

from __future__ import annotations

import math
from typing import Any

MIN_INTERVAL_SAMPLES = 3
MORE_NEEDED = "more repeats or launches are needed for an interval"


def interval_meaningful(value: float | None, low: float | None, high: float | None, n: int | None,
                        df: float | None = None) -> bool:
    """Whether an interval can be printed as one: from at least MIN_INTERVAL_SAMPLES samples, or where its degrees
    of freedom are given (launch figures pooled over the points) at least as many as they give, and no wider
    than the figure itself (a 95% interval from two samples spans ±12.7 standard errors: "0.00–34565")."""
    enough = df >= MIN_INTERVAL_SAMPLES - 1 if df is not None else n is not None and n >= MIN_INTERVAL_SAMPLES
    return value is not None and low is not None and high is not None and enough and high - low <= abs(value)


def no_interval(n: int | None, samples: list[str] | None = None) -> str:
    """What is printed instead of a meaningless interval: 'n = 2: 710–760; more repeats ... needed'."""
    shown = f": {'–'.join(samples)}" if samples and len(samples) > 1 else ""
    return f"n = {n or 0}{shown}; {MORE_NEEDED}"


def fmt(metric: str, value: float | None) -> str:
    """Format a figure with precision suited to its metric."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if metric == "acceptance_length":
        return f"{value:.2f}"
    if "tok_s" in metric:
        return f"{value:.1f} tok/s"
    if metric.endswith("per_s"):
        return f"{value:.2f} req/s"
    return f"{value:.3f} s"


def figure_text(metric: str, fig: dict[str, Any] | None, level: float) -> str:
    """'160.0 tok/s (95% CI 156.8–163.2, 3 repeats)'."""
    if not fig or fig.get("value") is None:
        return "n/a"
    if not interval_meaningful(fig["value"], fig.get("ci_low"), fig.get("ci_high"), fig.get("n"), fig.get("df")):
        return f"{fmt(metric, fig['value'])} ({no_interval(fig.get('n'))})"
    low, high = fmt(metric, fig["ci_low"]).split(" ")[0], fmt(metric, fig["ci_high"]).split(" ")[0]
    return f"{fmt(metric, fig['value'])} ({level:.0%} CI {low}–{high})"


def ratio_dict_text(est: dict[str, Any] | None) -> str:
    """'2.41× (95% CI 2.30–2.52)'; without an interval that means something, 'n = 2; more repeats or launches are
    needed for an interval'."""
    if not est or est.get("value") is None:
        return "n/a"
    if not interval_meaningful(est["value"], est.get("ci_low"), est.get("ci_high"), est.get("n"), est.get("df")):
        return f"{est['value']:.2f}× ({no_interval(est.get('n'))})"
    return f"{est['value']:.2f}× ({est['level'] * 100:.3g}% CI {est['ci_low']:.2f}–{est['ci_high']:.2f})"
