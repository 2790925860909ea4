"""The plot of `ddsweep compare`: B over A per matched point with interval bars, from the comparison document."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def compare_plot(doc: dict[str, Any], path: Path) -> Path:
    """B over A per matched point with interval bars, one panel per regime, the line of no change at 1."""
    import matplotlib.pyplot as plt

    from ddsweep.plotting.plots import SIMULATED_LABEL, save_figure

    m = doc["matched"]
    regimes = m["regimes"]
    rows = m["points"]
    panels = max(1, len(regimes))
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 1.2 + 0.45 * max(3, len(rows))), squeeze=False,
                             sharey=True)
    title = f"B ({doc['b']['study']}) over A ({doc['a']['study']}) per matched point"
    fig.suptitle(("[SIMULATED] " if doc["simulated"] else "") + title, fontsize=12, fontweight="bold")
    for ax, r in zip(axes[0], regimes, strict=False):
        ys, xs, lows, highs = [], [], [], []
        for i, row in enumerate(rows):
            ratio = row["regimes"][r["name"]]["ratio"]
            if ratio and ratio["value"] is not None:
                ys.append(i)
                xs.append(ratio["value"])
                lows.append(ratio["value"] - (ratio["ci_low"] if ratio["ci_low"] is not None else ratio["value"]))
                highs.append((ratio["ci_high"] if ratio["ci_high"] is not None else ratio["value"]) - ratio["value"])
        ax.errorbar(xs, ys, xerr=[lows, highs], fmt="o", capsize=3, color="tab:blue")
        ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_ylim(-0.6, max(1, len(rows)) - 0.4)
        ax.set_title(f"{r['name']}\n{r['metric']} at context {r['context']}, C={r['concurrency']}", fontsize=9)
        ax.set_xlabel(f"B / A (> 1: B better; bars {m['level']:.0%} CI)")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(rows)), [row["point_id"] for row in rows], fontsize=8)
    axes[0][0].set_ylabel("matched point")
    if not rows:
        axes[0][0].text(0.5, 0.5, "no data for matched points", ha="center", transform=axes[0][0].transAxes)
    if doc["simulated"]:
        fig.text(0.5, 0.005, SIMULATED_LABEL, ha="center", va="bottom",
                 color="red", fontsize=11, fontweight="bold")
    fig.tight_layout(rect=(0, 0.04, 1, 0.93))
    return save_figure(fig, path)
