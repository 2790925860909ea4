"""Every plot is written, readable, labelled SIMULATED when it must be, and says when it has no data."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure
from resultsets import ResultSetSpec, drafter_bound_set, simulated_set, write_results

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.results import load_results
from ddsweep.plotting.plots import PLOTS, PlotData, write_plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def figure_texts(fig: Figure) -> str:
    """All text a reader sees on a figure: titles, axis labels, annotations, legends."""
    parts = [t.get_text() for t in fig.texts] + [fig.get_suptitle()]
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), *(t.get_text() for t in ax.texts)]
        legend = ax.get_legend()
        if legend is not None:
            parts += [t.get_text() for t in legend.get_texts()]
    return "\n".join(parts)


def plot_data(spec: ResultSetSpec, root: Path) -> PlotData:
    """Load a written spec and prepare what the plots draw."""
    results = load_results(write_results(spec, root))
    decisions = analyse(results, Settings.from_config(spec.config))
    return PlotData(results, {o.resolved.regime.name: o.resolved for o in decisions.regimes}, decisions.pareto,
                    decisions.lossless)


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_simulated_label_on_every_plot(name: str, tmp_path: Path) -> None:
    fig = PLOTS[name](plot_data(simulated_set(), tmp_path))
    try:
        assert "SIMULATED" in figure_texts(fig)
    finally:
        plt.close(fig)


@pytest.mark.slow
def test_real_plots_are_labelled_and_not_simulated(tmp_path: Path) -> None:
    spec = drafter_bound_set()
    data = plot_data(spec, tmp_path)
    for name, build in PLOTS.items():
        fig = build(data)
        try:
            text = figure_texts(fig)
            assert "SIMULATED" not in text, name
            assert "no data" not in text, name
            labelled = [ax for ax in fig.axes if ax.get_xlabel() and ax.get_ylabel()]
            assert labelled, f"{name} has no labelled axes"
        finally:
            plt.close(fig)
    pareto = PLOTS["pareto"](data)
    try:
        text = figure_texts(pareto)
        assert all(pid in text for pid in data.pareto)
        dominated = [p.point_id for p in spec.points if p.point_id not in data.pareto and p.kind == "ddtree"]
        assert not any(pid in text.split("\n") for pid in dominated)
    finally:
        plt.close(pareto)


def test_missing_data_still_writes_every_file(tmp_path: Path) -> None:
    (tmp_path / "results" / "points").mkdir(parents=True)
    results = load_results(tmp_path / "results")
    decisions = analyse(results, Settings.from_config(None))
    data = PlotData(results, {o.resolved.regime.name: o.resolved for o in decisions.regimes}, [],
                    decisions.lossless)
    for name, build in PLOTS.items():
        fig = build(data)
        try:
            assert "no data for" in figure_texts(fig), name
        finally:
            plt.close(fig)
    paths = write_plots(data, tmp_path / "plots")
    assert set(paths) == set(PLOTS)
    for path in paths.values():
        assert path.read_bytes()[:8] == PNG_MAGIC
    assert not list((tmp_path / "plots").glob(".*"))


@pytest.mark.parametrize("name", ["throughput_vs_concurrency", "decode_speed_by_point"])
def test_interval_bars_are_labelled_with_the_studys_confidence(name: str, tmp_path: Path) -> None:
    spec = drafter_bound_set()
    results = load_results(write_results(spec, tmp_path), confidence=0.9)
    decisions = analyse(results, Settings.from_config(spec.config))
    fig = PLOTS[name](PlotData(results, {o.resolved.regime.name: o.resolved for o in decisions.regimes},
                               decisions.pareto, decisions.lossless))
    try:
        text = figure_texts(fig)
        assert "90% CI" in text and "95% CI" not in text
    finally:
        plt.close(fig)
