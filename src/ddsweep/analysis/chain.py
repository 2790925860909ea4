"""Does DDTree beat the DFlash chain at the same block size and window? One ratio per regime and baseline.

For every completed DFlash baseline, the best DDTree point with the same block size and window (by the regime's
figure) is compared with it, as the paired ratio of the decisions (> 1: DDTree better). The best of k DDTree
points is a selection, so its interval is at the Bonferroni level 1 - (1 - confidence)/k, which covers the
chosen point's ratio whichever was chosen. PR #29907 turns the overlap scheduler off for DDTree while DFLASH
keeps it: each ratio names its baseline and whether that baseline ran with `--disable-overlap-schedule` (the
like-for-like comparison) or with the overlap scheduler on (the tree and the scheduler change together)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddsweep.analysis.regimes import ResolvedRegime
from ddsweep.analysis.results import PointRecord, same_knob, window_label
from ddsweep.formatting import interval_meaningful, no_interval

if TYPE_CHECKING:
    from ddsweep.analysis.decisions import Decisions

NO_OVERLAP_FLAG = "--disable-overlap-schedule"


def overlap_off(decisions: Decisions, point: PointRecord) -> bool | None:
    """Whether the point's server ran with the overlap scheduler off (None without the study config)."""
    config = decisions.settings.config
    if not config:
        return None
    preset = (config.get("engine") or {}).get("presets", {}).get(point.preset) or {}
    args = [*preset.get("args", []), *((config.get("target") or {}).get("server_args") or [])]
    return NO_OVERLAP_FLAG in [str(a) for a in args]


def _baseline_text(decisions: Decisions, point: PointRecord) -> str:
    """The baseline's id and its scheduling, as the section prints it."""
    off = overlap_off(decisions, point)
    if off is None:
        return f"`{point.point_id}` (scheduling unknown)"
    return (f"`{point.point_id}` (overlap scheduler off, like DDTree)" if off else
            f"`{point.point_id}` (overlap scheduler on; DDTree runs with it off)")


def _verdict(low: float, high: float) -> str:
    """The ratio interval's answer."""
    if low > 1:
        return "DDTree better"
    if high < 1:
        return "chain better"
    return "not separated"


def chain_rows(decisions: Decisions) -> list[dict[str, Any]]:
    """One row per regime and DFlash baseline that has DDTree points at its block size and window."""
    ok = decisions.results.ok_points()
    level = decisions.settings.confidence
    rows = []
    for base in (p for p in ok if p.kind == "dflash"):
        matched = [p for p in ok if p.kind == "ddtree" and same_knob(p.block_size, base.block_size)
                   and same_knob(p.window, base.window)]
        for outcome in decisions.regimes:
            resolved: ResolvedRegime = outcome.resolved
            if not resolved.figure(base.point_id):
                continue
            sign = -1.0 if resolved.regime.lower_is_better else 1.0
            measured = [p.point_id for p in matched if resolved.figure(p.point_id)]
            if not measured:
                continue
            best = max(measured, key=lambda pid: (sign * resolved.figure(pid)["mean"], pid))
            family = 1 - (1 - level) / len(measured)
            ratio = resolved.speedup(best, base.point_id, family)
            if ratio is None:
                continue
            rows.append({"regime": resolved.regime.name, "metric": resolved.regime.metric,
                         "cell_text": resolved.cell(), "baseline": base.point_id,
                         "baseline_text": _baseline_text(decisions, base),
                         "overlap_off": overlap_off(decisions, base), "block_size": base.block_size,
                         "window": base.window, "ddtree": best, "candidates": len(measured),
                         "ratio": ratio.as_dict(),
                         "verdict": _verdict(ratio.low, ratio.high) if ratio.has_interval else "no interval"})
    return rows


def chain_section(decisions: Decisions) -> dict[str, Any] | None:
    """The summary section answering whether DDTree beats the DFlash chain, per regime (None without a DFlash
    baseline that has DDTree points at its block size and window)."""
    rows = chain_rows(decisions)
    if not rows:
        return None

    def ratio_text(row: dict[str, Any]) -> str:
        r = row["ratio"]
        if not interval_meaningful(r["value"], r["ci_low"], r["ci_high"], r.get("n"), r.get("df")):
            return f"{r['value']:.2f}× ({no_interval(r.get('n'))})"
        return f"{r['value']:.2f}× ({r['level'] * 100:.3g}% CI {r['ci_low']:.2f}–{r['ci_high']:.2f})"

    table = [[f"{row['regime']} ({row['metric']} at {row['cell_text']})",
              f"{row['block_size']}, {window_label(row['window'])}", row["baseline_text"],
              f"`{row['ddtree']}` (best of {row['candidates']})", ratio_text(row), row["verdict"]] for row in rows]
    fair = [row for row in rows if row["overlap_off"]]
    note = ("Ratios against a baseline with the overlap scheduler off compare the tree alone." if fair else
            f"No DFlash baseline ran with `{NO_OVERLAP_FLAG}`, so every ratio also contains the overlap "
            "scheduler DDTree does without; `baselines.dflash.no_overlap_preset` adds that baseline.")
    return {"kind": "ddtree_vs_chain", "title": "Does DDTree beat the DFlash chain? (same block size and window)",
            "text": ("For each regime and DFlash baseline: the best DDTree point at the baseline's block size and "
                     "window against the chain, as the paired ratio of the decisions (> 1: DDTree better). The "
                     "interval is at the Bonferroni level over the DDTree points it was chosen from, so choosing the "
                     "best does not flatter it. " + note),
            "table": {"columns": ["regime", "block size, window", "baseline", "DDTree point", "DDTree / chain",
                                  "answer"], "rows": table},
            "rows": rows}
