"""The measured launch-to-launch spread: how much one server launch's figure differs from another's of the same
point, pooled over the study's points that ran in two or more launches (a grid study's `sweep.launches`, an
adaptive study's confirmation launches; launches.json maps each repeat to its launch).

Per regime cell, the spread is the pooled standard deviation of the launch figures (each the mean log figure of
the launch's repeats) around each point's mean (so a relative standard deviation), with Σ(launches − 1) degrees of
freedom and a chi-square interval. A launch is the unit, not a repeat: repeats of one launch share its launch
effect. The spread contains the within-launch noise of one launch's figure as well, so it bounds the launch
variation from above.
An adaptive study compares it with the launch variation its screening assumed (`sweep.screen.launch_cv`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddsweep.analysis.decisions import Decisions


@dataclass(frozen=True)
class Spread:
    """The pooled relative standard deviation between launches at one regime cell, with its interval."""

    regime: str
    metric: str
    cell_text: str
    sd: float
    low: float
    high: float
    df: int
    points: int
    level: float


def pooled_spread(per_launch: dict[str, dict[int, float]], level: float) -> tuple[float, float, float, int] | None:
    """(sd, low, high, df) of the log figures around each point's mean, pooled over points with two or more
    launches; None without any such point."""
    ss, df = 0.0, 0
    for values in per_launch.values():
        logs = [math.log(v) for v in values.values() if v and v > 0]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        ss += sum((x - mean) ** 2 for x in logs)
        df += len(logs) - 1
    if df == 0:
        return None
    sd = math.sqrt(ss / df)
    alpha = 1 - level
    from scipy import special  # imported when first needed (ddsweep.analysis.statistics says why)

    # chi-square quantiles from the upper tail (scipy.special.chdtri, what scipy.stats.chi2 evaluates)
    upper, lower = special.chdtri(df, alpha / 2), special.chdtri(df, 1 - alpha / 2)
    return sd, math.sqrt(ss / upper), math.sqrt(ss / lower), df


def launched_points(results_dir: Path) -> list[str]:
    """Points whose directory holds merged launches (launches.json with two or more completed launches)."""
    found = []
    for path in sorted(Path(results_dir).glob("points/*/launches.json")):
        try:
            launches = json.loads(path.read_text(encoding="utf-8")).get("launches") or []
        except (OSError, ValueError):
            continue
        if len(launches) >= 2:
            found.append(path.parent.name)
    return found


def measured_spreads(decisions: Decisions, launched: list[str]) -> list[Spread]:
    """The spread at each regime's cell over this study's points that ran in two or more launches."""
    ok = {p.point_id for p in decisions.results.ok_points()}
    ids = [pid for pid in launched if pid in ok]
    out = []
    for outcome in decisions.regimes:
        resolved = outcome.resolved
        per_launch = {pid: {k: math.exp(log) for k, log in resolved.launches.get(pid, {}).items()} for pid in ids}
        found = pooled_spread(per_launch, decisions.settings.confidence)
        if found is None:
            continue
        sd, low, high, df = found
        out.append(Spread(resolved.regime.name, resolved.regime.metric, resolved.cell(), sd, low, high, df,
                          sum(len(launches) >= 2 for launches in per_launch.values()), decisions.settings.confidence))
    return out


def spread_block(decisions: Decisions, results_dir: Path) -> dict[str, Any]:
    """The caveat block stating the measured launch-to-launch spread, or that it was not measured; in an adaptive
    study, whether the assumed `sweep.screen.launch_cv` was optimistic."""
    spreads = measured_spreads(decisions, launched_points(results_dir))
    config = decisions.settings.config or {}
    sweep = config.get("sweep") or {}
    if not spreads:
        return {"kind": "launch_spread", "title": "Launch-to-launch spread", "text": (
            "Not measured: no point of this study ran in two or more server launches, so every interval holds the "
            "variation within one launch only, not the variation between launches and nodes that separates two "
            "configurations in practice (docs/statistics.md).")}
    rows = [[s.regime, f"{s.metric} at {s.cell_text}", f"{s.sd:.1%}",
             f"{s.low:.1%}–{s.high:.1%}", s.df, s.points] for s in spreads]
    text = (f"Relative standard deviation of one launch's figure around its point's mean, pooled over the points "
            f"that ran in two or more launches ({spreads[0].level * 100:.3g}% interval; within-launch noise "
            "included, so it bounds the launch variation from above).")
    items = []
    assumed = (sweep.get("screen") or {}).get("launch_cv") if sweep.get("strategy") == "adaptive" else None
    if assumed is not None:
        for s in spreads:
            if s.low > assumed:
                items.append(f"**The screening's assumed launch variation was optimistic** at {s.regime}: "
                             f"sweep.screen.launch_cv = {assumed:.1%}, measured {s.sd:.1%} "
                             f"({s.low:.1%}–{s.high:.1%}): points may have been dropped in the screening that a "
                             "wider band would have kept; raise launch_cv to at least the measured figure.")
            elif s.sd > assumed:
                items.append(f"{s.regime}: measured {s.sd:.1%} is above the assumed launch_cv {assumed:.1%}, within "
                             f"its interval ({s.low:.1%}–{s.high:.1%}).")
            else:
                items.append(f"{s.regime}: the assumed launch_cv {assumed:.1%} is not below the measured {s.sd:.1%}.")
    return {"kind": "launch_spread", "title": "Launch-to-launch spread", "text": text,
            "table": {"columns": ["regime", "metric at cell", "spread", "interval", "df", "points"], "rows": rows},
            "items": items, "spreads": [s.__dict__ for s in spreads], "assumed_launch_cv": assumed}
