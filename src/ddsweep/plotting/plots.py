"""The sweep's plots as PNG files, each readable on its own (title, units, labelled axes, legend).

Every plot file is always written: when its data is missing the figure says so, so workflow outputs exist.
When any result is simulated, every figure carries a visible "SIMULATED" label.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ddsweep.analysis.coding_outcomes import LosslessResult, coding_stats  # noqa: E402
from ddsweep.analysis.regimes import ResolvedRegime  # noqa: E402
from ddsweep.analysis.results import METRIC_LABELS, ResultSet, ar_point_id, window_label  # noqa: E402
from ddsweep.plotting.pareto_plot import gpu_count_of, operating_points, pareto_figure  # noqa: E402

SIMULATED_LABEL = "SIMULATED RESULTS (stand-in server, not real hardware)"
BASELINE_KINDS = ("ar", "dflash")


@dataclass
class PlotData:
    """What the plots draw: the loaded results, the resolved regimes, the Pareto set and the lossless check."""

    results: ResultSet
    regimes: dict[str, ResolvedRegime]
    pareto: list[str]
    lossless: LosslessResult
    picks: dict[str, list[str]] = field(default_factory=dict)  # recommended point -> the priorities it serves

    @property
    def simulated(self) -> bool:
        """True when any result is simulated."""
        return self.results.simulated

    def ok_groups(self, metric: str) -> pd.DataFrame:
        """Group rows of one metric for completed points."""
        ok_ids = {p.point_id for p in self.results.ok_points()}
        g = self.results.groups
        return g[(g["metric"] == metric) & g["point_id"].isin(ok_ids)]


def _figure(data: PlotData, title: str, panels: int = 1, ncols: int = 1,
            panel_size: tuple[float, float] = (7.0, 4.5)) -> tuple[Figure, list]:
    """Create a figure with `panels` axes, a title, and the SIMULATED label when needed."""
    ncols = max(1, min(ncols, panels))
    nrows = math.ceil(panels / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows + 0.8),
                             squeeze=False)
    flat = list(axes.flat)
    for extra in flat[panels:]:
        extra.set_visible(False)
    fig.suptitle(("[SIMULATED] " if data.simulated else "") + title, fontsize=13, fontweight="bold")
    if data.simulated:
        fig.text(0.5, 0.005, SIMULATED_LABEL, ha="center", va="bottom", color="red", fontsize=12,
                 fontweight="bold")
    return fig, flat[:panels]


def _no_data(data: PlotData, title: str, what: str) -> Figure:
    """A figure stating that there is no data for `what`."""
    fig, (ax,) = _figure(data, title)
    ax.axis("off")
    ax.text(0.5, 0.5, f"no data for {what}", ha="center", va="center", fontsize=14, transform=ax.transAxes)
    return fig


def _kind_of(data: PlotData, point_id: str) -> str | None:
    """The kind of a point."""
    p = data.results.point(point_id)
    return p.kind if p else None


def _yerr(frame: pd.DataFrame) -> np.ndarray:
    """Asymmetric error bars from CI columns."""
    return np.vstack([(frame["mean"] - frame["ci_low"]).clip(lower=0),
                      (frame["ci_high"] - frame["mean"]).clip(lower=0)])


def throughput_vs_concurrency(data: PlotData) -> Figure:
    """Aggregate output throughput against concurrency, one line per point, baselines dashed."""
    title = "Aggregate output throughput vs concurrency"
    g = data.ok_groups("output_throughput_tok_s")
    if g.empty:
        return _no_data(data, title, "aggregate throughput (output_throughput_tok_s)")
    contexts = sorted(g["context"].unique())
    fig, axes = _figure(data, title, len(contexts), ncols=2)
    colors = plt.get_cmap("tab20")
    for ax, context in zip(axes, contexts, strict=True):
        at = g[g["context"] == context]
        for index, (point_id, rows) in enumerate(at.groupby("point_id", sort=True)):
            rows = rows.sort_values("concurrency")
            dashed = _kind_of(data, point_id) in BASELINE_KINDS
            ax.errorbar(rows["concurrency"], rows["mean"], yerr=_yerr(rows), marker="o", capsize=3,
                        linestyle="--" if dashed else "-", linewidth=2 if dashed else 1.2, label=point_id,
                        color=colors(index % 20))
        ax.set_xscale("log", base=2)
        concurrencies = sorted(at["concurrency"].unique())
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.set_xlabel("concurrent requests (C)")
        ax.set_ylabel("aggregate output throughput (tok/s)")
        ax.set_title(f"context {context} tokens (mean of repeats, {data.results.confidence:.0%} CI; baselines dashed)")
        ax.grid(True, alpha=0.3)
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="point")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return fig


def decode_speed_by_point(data: PlotData) -> Figure:
    """Single-request decode speed of each point, one panel per context length, with CI bars."""
    title = "Single-request decode speed by point"
    g = data.ok_groups("decode_tok_s")
    if g.empty:
        return _no_data(data, title, "decode speed (decode_tok_s)")
    contexts = sorted(g["context"].unique())
    fig, axes = _figure(data, title, len(contexts), ncols=1, panel_size=(11.0, 4.5))
    for ax, context in zip(axes, contexts, strict=True):
        at = g[g["context"] == context]
        lowest = at["concurrency"].min()
        at = at[at["concurrency"] == lowest].sort_values("mean", ascending=False)
        colors = ["tab:gray" if _kind_of(data, pid) in BASELINE_KINDS else "tab:blue" for pid in at["point_id"]]
        ax.bar(range(len(at)), at["mean"], yerr=_yerr(at), capsize=3, color=colors)
        ax.set_xticks(range(len(at)), at["point_id"], rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("decode speed per request (tok/s)")
        ax.set_xlabel("sweep point (grey: baselines)")
        ax.set_title(f"context {context} tokens, C={lowest} (mean of repeats, bars = {data.results.confidence:.0%} CI)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return fig


def _panels(points: list) -> list[tuple]:
    """Distinct (block_size, window) panels of DDTree points, in a stable order."""
    keys = {(p.block_size, p.window) for p in points}
    return sorted(keys, key=lambda k: (k[0] or 0, -1 if k[1] is None else k[1]))


def _ddtree_points(data: PlotData) -> list:
    """Completed DDTree points."""
    return [p for p in data.results.ok_points() if p.kind == "ddtree"]


def acceptance_vs_budget(data: PlotData) -> Figure:
    """Acceptance length against budget, one line per topk, one panel per (block size, window)."""
    title = "Mean acceptance length vs tree budget"
    resolved = data.regimes.get("max_acceptance") or next(
        (r for r in data.regimes.values() if r.regime.metric == "acceptance_length"), None)
    points = [p for p in _ddtree_points(data) if resolved is not None and resolved.figure(p.point_id)]
    if not points:
        return _no_data(data, title, "acceptance length of DDTree points")
    panels = _panels(points)
    fig, axes = _figure(data, f"{title} ({resolved.cell()})", len(panels), ncols=2)
    budgets = sorted({p.budget for p in points})
    for ax, (block_size, window) in zip(axes, panels, strict=True):
        members = [p for p in points if p.block_size == block_size and p.window == window]
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlim(budgets[0] - 1, budgets[-1] + 1)
        for topk in sorted({p.topk for p in members}):
            line = sorted((p for p in members if p.topk == topk), key=lambda p: p.budget)
            figs = [resolved.figure(p.point_id) for p in line]
            frame = pd.DataFrame(figs)
            ax.errorbar([p.budget for p in line], frame["mean"], yerr=_yerr(frame), marker="o", capsize=3,
                        label=f"topk {topk}")
        ax.set_xlabel("tree budget (draft tokens verified per step)")
        ax.set_ylabel("acceptance length (tokens/verify step)")
        ax.set_title(f"block size {block_size}, window {window_label(window)}")
        ax.legend(title="topk", fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return fig


def _cell_label(value: float, low: float, high: float) -> str:
    """A heatmap cell's figure (whole numbers for throughputs, decimals for small figures) over its interval's
    half-width relative to the figure."""
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if math.isnan(low) or math.isnan(high) or not value:
        return f"{text}\n(no CI)"
    return f"{text}\n±{(high - low) / 2 / abs(value):.0%}"


def _heatmap(data: PlotData, regime_name: str, title: str) -> Figure:
    """Budget x topk heatmap of a regime's figure, one panel per (block size, window)."""
    resolved = data.regimes.get(regime_name)
    points = [p for p in _ddtree_points(data) if resolved is not None and resolved.figure(p.point_id)]
    if not points:
        return _no_data(data, title, f"the {regime_name} regime (DDTree points)")
    metric = resolved.regime.metric
    panels = _panels(points)
    fig, axes = _figure(data, f"{title}: {metric} at {resolved.cell()}", len(panels), ncols=2,
                        panel_size=(6.0, 4.8))
    values = [resolved.figure(p.point_id)["mean"] for p in points]
    vmin, vmax = min(values), max(values)
    image = None
    for ax, (block_size, window) in zip(axes, panels, strict=True):
        members = [p for p in points if p.block_size == block_size and p.window == window]
        budgets = sorted({p.budget for p in members})
        topks = sorted({p.topk for p in members})
        grid = np.full((len(budgets), len(topks)), np.nan)
        bounds = np.full((len(budgets), len(topks), 2), np.nan)
        for p in members:
            fig_p = resolved.figure(p.point_id)
            grid[budgets.index(p.budget), topks.index(p.topk)] = fig_p["mean"]
            bounds[budgets.index(p.budget), topks.index(p.topk)] = (fig_p["ci_low"], fig_p["ci_high"])
        cmap = "viridis_r" if resolved.regime.lower_is_better else "viridis"
        image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
        for i in range(len(budgets)):
            for j in range(len(topks)):
                if not np.isnan(grid[i, j]):
                    red, green, blue, _ = image.cmap(image.norm(grid[i, j]))
                    ink = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"
                    ax.text(j, i, _cell_label(grid[i, j], *bounds[i, j]), ha="center", va="center", color=ink,
                            fontsize=9, fontweight="bold")
        ax.set_xticks(range(len(topks)), [str(t) for t in topks])
        ax.set_yticks(range(len(budgets)), [str(b) for b in budgets])
        ax.set_xlabel("topk (branches per depth)")
        ax.set_ylabel("tree budget")
        ax.set_title(f"block size {block_size}, window {window_label(window)}\n"
                     f"(cell: mean, ± half-width of its {data.results.confidence:.0%} CI)", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 0.9, 0.95))
    colorbar_axes = fig.add_axes((0.92, 0.15, 0.02, 0.7))
    fig.colorbar(image, cax=colorbar_axes, label=METRIC_LABELS.get(metric, metric))
    return fig


def heatmap_latency(data: PlotData) -> Figure:
    """Budget x topk heatmap of the latency regime (single-request decode speed)."""
    return _heatmap(data, "latency", "Latency regime")


def heatmap_throughput(data: PlotData) -> Figure:
    """Budget x topk heatmap of the throughput regime (aggregate throughput at high concurrency)."""
    return _heatmap(data, "throughput", "Throughput regime")


def pareto(data: PlotData) -> Figure:
    """Latency regime figure against throughput regime figure, with the non-dominated points named."""
    title = "Latency–throughput trade-off (Pareto front)"
    lat, thr = data.regimes.get("latency"), data.regimes.get("throughput")
    if lat is None or thr is None:
        return _no_data(data, title, "the latency and throughput regimes")
    figs = [(p.point_id, lat.figure(p.point_id), thr.figure(p.point_id)) for p in data.results.ok_points()]
    figs = [(pid, a, b) for pid, a, b in figs if a and b]
    if not figs:
        return _no_data(data, title, "points with both latency and throughput figures")
    pts = [(pid, a["mean"], b["mean"]) for pid, a, b in figs]
    fig, (ax,) = _figure(data, title, panel_size=(9.0, 6.0))
    bars = pd.DataFrame([{"x": a["mean"], "y": b["mean"], "x_low": a["ci_low"], "x_high": a["ci_high"],
                          "y_low": b["ci_low"], "y_high": b["ci_high"]} for _, a, b in figs])
    ax.errorbar(bars["x"], bars["y"], xerr=np.vstack([(bars["x"] - bars["x_low"]).fillna(0),
                                                      (bars["x_high"] - bars["x"]).fillna(0)]),
                yerr=np.vstack([(bars["y"] - bars["y_low"]).fillna(0), (bars["y_high"] - bars["y"]).fillna(0)]),
                fmt="none", ecolor="tab:gray", elinewidth=0.8, capsize=2, alpha=0.7,
                label=f"{data.results.confidence:.0%} CI of both figures")
    front = [pt for pt in pts if pt[0] in data.pareto]
    others = [pt for pt in pts if pt[0] not in data.pareto]
    ax.scatter([p[1] for p in others], [p[2] for p in others], color="tab:gray", label="dominated point")
    ax.scatter([p[1] for p in front], [p[2] for p in front], color="tab:red", s=60, label="Pareto-optimal point")
    front.sort(key=lambda p: p[1])
    ax.plot([p[1] for p in front], [p[2] for p in front], color="tab:red", linestyle="-", linewidth=1)
    for pid, x, y in front:
        ax.annotate(pid, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ar_id = ar_point_id(data.results)
    for pid, x, y in others:
        if pid == ar_id:
            ax.annotate(f"{pid} (baseline)", (x, y), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.set_xlabel(f"{METRIC_LABELS.get(lat.regime.metric, lat.regime.metric)} at {lat.cell()}")
    ax.set_ylabel(f"{METRIC_LABELS.get(thr.regime.metric, thr.regime.metric)} at {thr.cell()}")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return fig


def pareto_per_user(data: PlotData) -> Figure:
    """Per-user speed against aggregate throughput, one curve per point across concurrencies."""
    title = "Per-user speed vs aggregate throughput, one curve per point across concurrency"
    points = operating_points(data.results.groups, {p.point_id for p in data.results.ok_points()})
    if points.empty:
        return _no_data(data, title, "points with both decode speed and aggregate throughput")
    contexts = sorted({int(c) for c in points["context"]})
    fig, axes = _figure(data, title, len(contexts), ncols=1, panel_size=(13.0, 6.0))
    kinds = {p.point_id: str(p.kind) for p in data.results.ok_points()}
    gpus = gpu_count_of([p.environment for p in data.results.ok_points()])
    return pareto_figure(fig, axes, points, data.picks, kinds, gpus, data.results.confidence)


def coding(data: PlotData) -> Figure:
    """Coding pass rate and exact-match rate vs ar, per point."""
    title = "Coding check: pass rate and exact match with ar outputs"
    stats = coding_stats(data.results)
    if stats.empty:
        return _no_data(data, title, "the coding check")
    from ddsweep.coding.lossless import wilson_interval

    ar_id = ar_point_id(data.results)
    exact, exact_bars = [], []
    for pid in stats["point_id"]:
        match = data.lossless.by_point.get(pid)
        exact.append(match.get("exact_match_rate") if match else (1.0 if pid == ar_id and data.lossless.available
                                                                  else np.nan))
        low, high = (match.get("ci_low"), match.get("ci_high")) if match else (None, None)
        exact_bars.append((exact[-1] - low, high - exact[-1]) if low is not None and high is not None else (0, 0))
    passing = [wilson_interval(int(r.passed), int(r.problems)) for r in stats.itertuples()]
    pass_bars = [(max(0.0, r.pass_rate - lo), max(0.0, hi - r.pass_rate)) if r.problems else (0, 0)
                 for r, (lo, hi) in zip(stats.itertuples(), passing, strict=True)]
    fig, (ax,) = _figure(data, title, panel_size=(max(7.0, 0.7 * len(stats) + 3), 5.0))
    x = np.arange(len(stats))
    ax.bar(x - 0.2, stats["pass_rate"] * 100, width=0.4, label="pass rate (%, bars: 95% Wilson interval)",
           color="tab:green", yerr=np.array(pass_bars).T * 100, capsize=3)
    ax.bar(x + 0.2, np.array(exact, dtype=float) * 100, width=0.4, color="tab:purple", capsize=3,
           yerr=np.array(exact_bars, dtype=float).T * 100,
           label="identical to ar output (%, bars: 95% Wilson interval)")
    for i, row in enumerate(stats.itertuples()):
        if row.truncated_failures:
            ax.annotate(f"{row.truncated_failures} truncated", (i - 0.2, row.pass_rate * 100),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_xticks(x, stats["point_id"], rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("share of problems (%)")
    ax.set_xlabel("sweep point")
    if not data.lossless.available:
        ax.text(0.5, 0.97, f"exact match not computed: {data.lossless.reason}", transform=ax.transAxes,
                ha="center", va="top", fontsize=8)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return fig


PLOTS: dict[str, Callable[[PlotData], Figure]] = {
    "throughput_vs_concurrency": throughput_vs_concurrency,
    "decode_speed_by_point": decode_speed_by_point,
    "acceptance_vs_budget": acceptance_vs_budget,
    "heatmap_latency": heatmap_latency,
    "heatmap_throughput": heatmap_throughput,
    "pareto": pareto,
    "pareto_per_user": pareto_per_user,
    "coding": coding,
}


def write_plots(data: PlotData, plots_dir: str | Path) -> dict[str, Path]:
    """Draw every plot into PLOTS_DIR/<name>.png (written via a temporary file); return the paths."""
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, build in PLOTS.items():
        paths[name] = save_figure(build(data), plots_dir / f"{name}.png")
    return paths


def save_figure(fig: Figure, path: Path) -> Path:
    """Write a figure as PNG through a temporary file in the same directory (a file that exists is whole), then
    close it."""
    tmp = path.with_name(f".{path.stem}.tmp.png")
    # tight_layout has already placed the axes; without a layout engine savefig skips its layout pass (a second
    # draw of every artist), and the image is the same
    fig.set_layout_engine("none")
    try:
        fig.savefig(tmp, dpi=110)
        tmp.replace(path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path

