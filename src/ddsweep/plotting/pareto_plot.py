"""The performance engineer's Pareto plot: per-user speed (decode tok/s of one request at each concurrency)
against aggregate output throughput (tok/s, and per GPU when the GPU count is known), one curve per point across
its concurrencies, both figures with their interval bars, the picks labelled and the frontier of all
(point, concurrency) operating points drawn."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
BASELINE_STYLE = {"ar": ("black", "--"), "dflash": ("dimgray", "-.")}
# The picks take strong colours; the other points tab10's rest, then tab20's light shades (no greys: baselines).
PICK_COLORS = ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange")
PALETTE = [plt.get_cmap("tab10")(i) for i in (5, 6, 8, 9)] + [
    plt.get_cmap("tab20")(i) for i in range(1, 20, 2) if i != 15]


def operating_points(groups: pd.DataFrame, ok_ids: set[str]) -> pd.DataFrame:
    """Per point, context and concurrency: aggregate throughput (x) and per-request decode speed (y), each
    with its interval; rows where both figures exist."""
    keys = ["point_id", "context", "concurrency"]
    cols = ["mean", "ci_low", "ci_high"]
    g = groups[groups["point_id"].isin(ok_ids)]
    x = g[g["metric"] == "output_throughput_tok_s"][keys + cols]
    y = g[g["metric"] == "decode_tok_s"][keys + cols]
    both = x.merge(y, on=keys, suffixes=("_x", "_y"))
    return both.sort_values(keys).reset_index(drop=True)


def frontier(points: pd.DataFrame) -> pd.DataFrame:
    """Operating points no other beats on both axes (by their means), sorted by throughput."""
    keep = []
    for i, row in points.iterrows():
        beaten = ((points["mean_x"] >= row["mean_x"]) & (points["mean_y"] >= row["mean_y"])
                  & ((points["mean_x"] > row["mean_x"]) | (points["mean_y"] > row["mean_y"])))
        if not beaten.any():
            keep.append(i)
    return points.loc[keep].sort_values("mean_x")


def _err(frame: pd.DataFrame, axis: str) -> np.ndarray:
    """Asymmetric interval bars (zero where a figure has no interval)."""
    low = (frame[f"mean_{axis}"] - frame[f"ci_low_{axis}"]).clip(lower=0).fillna(0)
    high = (frame[f"ci_high_{axis}"] - frame[f"mean_{axis}"]).clip(lower=0).fillna(0)
    return np.vstack([low, high])


def draw(ax: plt.Axes, points: pd.DataFrame, picks: dict[str, list[str]], kinds: dict[str, str],
         gpu_count: int | None, marker: dict[int, str]) -> None:
    """One panel: a curve per point (markers per concurrency), interval bars, picks named, the frontier."""
    picked_ids = sorted(picks)
    others = [pid for pid in sorted(kinds) if pid not in picks]
    front = frontier(points)
    ax.plot(front["mean_x"], front["mean_y"], color="gold", linewidth=9, alpha=0.45, zorder=0,
            solid_capstyle="round", label="frontier of operating points (means)")
    for point_id, rows in points.groupby("point_id", sort=True):
        rows = rows.sort_values("concurrency")
        picked = point_id in picks
        baseline = kinds.get(point_id) in BASELINE_STYLE
        color, style = BASELINE_STYLE.get(kinds.get(point_id, ""), (
            PICK_COLORS[picked_ids.index(point_id) % len(PICK_COLORS)] if picked
            else PALETTE[others.index(point_id) % len(PALETTE)], "-"))
        ax.errorbar(rows["mean_x"], rows["mean_y"], xerr=_err(rows, "x"), yerr=_err(rows, "y"), color=color,
                    linestyle=style, linewidth=2.6 if picked else 1.2, alpha=1.0 if picked or baseline else 0.6,
                    capsize=2, elinewidth=0.8, label=point_id + (" (pick)" if picked else ""))
        for c, x, y in zip(rows["concurrency"], rows["mean_x"], rows["mean_y"], strict=True):
            ax.plot(x, y, marker=marker[int(c)], color=color, markersize=8 if picked else 5, linestyle="none")
        if picked:
            last = rows.iloc[-1]
            ax.annotate(f"{point_id}\npick: {', '.join(picks[point_id])}", (last["mean_x"], last["mean_y"]),
                        textcoords="offset points", xytext=(-8, 14 + 34 * sorted(picks).index(point_id)),
                        ha="right", fontsize=8, fontweight="bold",
                        color=color, arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.8},
                        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.85, "edgecolor": color})
    ax.set_xlabel("aggregate output throughput (tok/s, steady state)")
    ax.set_ylabel("per-user speed: decode tok/s of one request")
    ax.grid(True, alpha=0.3)
    if gpu_count:
        top = ax.secondary_xaxis("top", functions=(lambda v: v / gpu_count, lambda v: v * gpu_count))
        top.set_xlabel(f"aggregate output throughput per GPU (tok/s/GPU, {gpu_count} GPUs)")


def panel_title(context: int) -> str:
    """The panel's title: the context and how to read the plot."""
    return f"context {context} tokens: up = faster per user, right = more total throughput"


def gpu_count_of(environments: list[dict]) -> int | None:
    """The GPU count every point ran on, or None when unknown or when points differ."""
    counts = {e.get("gpu_count") for e in environments if isinstance(e, dict)}
    counts.discard(None)
    if len(counts) != 1:
        return None
    count = next(iter(counts))
    return count if isinstance(count, int) and count > 0 else None


def pareto_figure(fig: Figure, axes: list, points: pd.DataFrame, picks: dict[str, list[str]],
                  kinds: dict[str, str], gpu_count: int | None, level: float) -> Figure:
    """Fill a figure made by the plots module with one panel per context and one legend beside them."""
    contexts = sorted({int(c) for c in points["context"]})
    concurrencies = sorted({int(c) for c in points["concurrency"]})
    marker = {c: MARKERS[i % len(MARKERS)] for i, c in enumerate(concurrencies)}
    legend: dict[str, Any] = {}
    for ax, context in zip(axes, contexts, strict=True):
        draw(ax, points[points["context"] == context], picks, kinds, gpu_count, marker)
        ax.set_title(panel_title(context), fontsize=10)
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    for c in concurrencies:
        legend[f"C={c} concurrent requests"] = Line2D([], [], marker=marker[c], color="gray", linestyle="none")
    fig.legend(list(legend.values()), list(legend), loc="center right", fontsize=8,
               title=f"curve = one point across C\n(bars: {level:.0%} CI of both figures)", title_fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 0.78, 0.95))
    return fig
