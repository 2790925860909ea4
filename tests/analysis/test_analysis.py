"""Loading results into tidy tables: schema columns, tolerance of broken points, simulated flags."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from resultsets import REPEATS, broken_set, coding_set, drafter_bound_set, simulated_set, write_results

from ddsweep.analysis.coding_outcomes import lossless_vs_ar
from ddsweep.analysis.regimes import resolve_regime
from ddsweep.analysis.results import (
    CELL_COLUMNS,
    CODING_COLUMNS,
    FAILURE_COLUMNS,
    GROUP_COLUMNS,
    JOB_COLUMNS,
    POINT_COLUMNS,
    PointRecord,
    failure_patterns,
    load_results,
)
from ddsweep.analysis.settings import Regime
from ddsweep.analysis.text import first_line
from ddsweep.cli import main
from ddsweep.findings.tables import overview_table, write_tables
from ddsweep.plotting.plots import PLOTS


def test_broken_points_are_recorded_with_reasons(tmp_path: Path) -> None:
    spec = broken_set()
    results = load_results(write_results(spec, tmp_path))
    status = {p.point_id: p.status for p in results.points}
    assert {pid for pid, s in status.items() if s == "ok"} == spec.expected["ok"]
    assert {pid for pid, s in status.items() if s == "malformed"} == spec.expected["malformed"]
    assert {pid for pid, s in status.items() if s == "incomplete"} == spec.expected["incomplete"]
    for pid, kind in spec.expected["failed"].items():
        record = results.point(pid)
        assert record.status == "failed" and record.error_kind == kind and record.error
    assert all(results.point(pid).error for pid in spec.expected["malformed"] | spec.expected["incomplete"])
    good = results.point("bs8-b8-t4-w2048")
    assert any("malformed line" in issue for issue in good.issues)
    assert len(results.coding_records["bs8-b8-t4-w2048"]) == len(spec.point("bs8-b8-t4-w2048").coding)


def test_failures_table_lists_every_point_that_did_not_complete_with_a_one_line_reason(tmp_path: Path) -> None:
    spec = broken_set()
    results = load_results(write_results(spec, tmp_path))
    failures = results.failures_frame().set_index("point_id")
    expected = spec.expected["failed"].keys() | spec.expected["malformed"] | spec.expected["incomplete"]
    assert set(failures.index) == set(expected)
    for pid, kind in spec.expected["failed"].items():
        assert failures.loc[pid, "error_kind"] == kind
        assert failures.loc[pid, "reason"] == results.point(pid).error.strip().splitlines()[0].strip()
    assert set(results.jobs_frame()["point_id"]) == {p.point_id for p in results.points}


def test_a_knob_threshold_that_separates_failed_points_is_stated():
    def point(budget: int, kind: str | None) -> PointRecord:
        return PointRecord(f"b{budget}", "ddtree", budget=budget, topk=4, block_size=8, window=2048,
                           status="failed" if kind else "ok", error_kind=kind)
    points = [point(8, None), point(16, None), point(24, "startup_exit"), point(32, "startup_exit")]
    assert failure_patterns(points) == ["every point with budget >= 24 failed (startup_exit): b24, b32"]
    points[1] = point(16, "verify")
    assert failure_patterns(points) == ["every point with budget >= 24 failed (startup_exit): b24, b32"]
    points[0] = point(40, None)  # a completed point above the threshold: no pattern
    assert failure_patterns(points) == []


def test_tables_have_schema_columns_and_one_row_per_measurement(tmp_path: Path) -> None:
    spec = drafter_bound_set()
    results = load_results(write_results(spec, tmp_path))
    regimes = [resolve_regime(results, Regime("latency", "decode_tok_s", 128, 1))]
    paths = write_tables(results, tmp_path / "tables", overview_table(results, regimes, lossless_vs_ar(results)))
    assert set(paths) == {"points", "bench_cells", "bench_groups", "coding", "overview", "failures", "jobs"}
    tables = {name: pd.read_csv(path) for name, path in paths.items()}
    assert list(tables["points"].columns) == list(POINT_COLUMNS)
    assert list(tables["bench_cells"].columns) == list(CELL_COLUMNS)
    assert list(tables["bench_groups"].columns) == list(GROUP_COLUMNS)
    assert list(tables["coding"].columns) == list(CODING_COLUMNS)
    assert list(tables["failures"].columns) == list(FAILURE_COLUMNS)
    assert list(tables["jobs"].columns) == list(JOB_COLUMNS)
    assert all("simulated" in t.columns for t in tables.values())
    n_cells = sum(len(p.contexts) * len(p.concurrency) for p in spec.points)
    assert len(tables["bench_cells"]) == n_cells * REPEATS
    assert len(tables["points"]) == len(tables["overview"]) == len(spec.points)
    off = tables["points"].set_index("point_id").loc["bs8-b8-t4-woff", "window"]
    assert math.isnan(off)


def test_overview_speedup_is_relative_to_ar_at_the_same_cell(tmp_path: Path) -> None:
    spec = drafter_bound_set()
    results = load_results(write_results(spec, tmp_path))
    regimes = [resolve_regime(results, Regime("throughput", "output_throughput_tok_s", 128, 32))]
    overview = overview_table(results, regimes, lossless_vs_ar(results)).set_index("point_id")
    truth = spec.true_figures("output_throughput_tok_s", 128, 32)
    for pid, (median, _, _) in truth.items():
        # The ratio is the geometric mean of per-repeat ratios: equal to the ratio of the true figures when
        # both points spread alike, within 1% for the wide-spread point.
        assert math.isclose(overview.loc[pid, "throughput_speedup_vs_ar"], median / truth["ar"][0], rel_tol=0.01)
        low, high = overview.loc[pid, "throughput_speedup_ci_low"], overview.loc[pid, "throughput_speedup_ci_high"]
        assert low <= overview.loc[pid, "throughput_speedup_vs_ar"] <= high


def test_nearest_cell_is_resolved_when_the_configured_one_is_absent(tmp_path: Path) -> None:
    results = load_results(write_results(drafter_bound_set(), tmp_path))
    resolved = resolve_regime(results, Regime("x", "decode_tok_s", 3000, 24))
    assert (resolved.context, resolved.concurrency) == (4096, 32)
    assert resolved.note and "nearest" in resolved.note
    exact = resolve_regime(results, Regime("y", "decode_tok_s", 128, 8))
    assert exact.note is None and (exact.context, exact.concurrency) == (128, 8)


def test_simulated_flag_reaches_every_table(tmp_path: Path) -> None:
    results = load_results(write_results(simulated_set(), tmp_path))
    assert results.simulated
    for frame in (results.points_frame(), results.cells, results.groups, results.coding):
        assert len(frame) and frame["simulated"].all()
    real = load_results(write_results(coding_set(), tmp_path / "real"))
    assert not real.simulated and not real.cells["simulated"].any()


def test_truncation_is_read_from_flag_or_finish_reason(tmp_path: Path) -> None:
    spec = coding_set()
    results = load_results(write_results(spec, tmp_path))
    coding = results.coding[results.coding["point_id"] == spec.expected["truncating"]]
    assert int(coding["truncated"].sum()) == spec.expected["truncated"]
    assert int((~coding["passed"] & ~coding["truncated"]).sum()) == spec.expected["real_failures"]


@pytest.mark.slow
def test_cli_summarize_writes_tables_plots_and_summary(tmp_path: Path, capsys) -> None:
    spec = simulated_set()
    results = write_results(spec, tmp_path)
    config = tmp_path / "study.yaml"
    config.write_text("study: cli-study\ndrafter: {model_path: /m, trained_block_size: 8}\n", encoding="utf-8")
    code = main(["summarize", str(results), "--out", str(tmp_path / "reports"), "--config", str(config)])
    assert code == 0
    summary = tmp_path / "reports" / "optimization_summary.md"
    assert capsys.readouterr().out.strip() == str(summary)
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("# Optimization summary: cli-study") and "SIMULATED" in text
    assert f"--configfile {config}" in text
    for name in ("points", "bench_cells", "bench_groups", "coding", "overview"):
        assert (results / "tables" / f"{name}.csv").exists()
    drawn = {path.stem for path in (tmp_path / "reports" / "plots").glob("*.png")}
    assert drawn == set(PLOTS) and "pareto_per_user" in drawn
    # without the plots: the same summary, no plot drawn
    quick = tmp_path / "quick"
    assert main(["summarize", str(results), "--out", str(quick), "--config", str(config), "--no-plots"]) == 0
    assert (quick / "optimization_summary.md").read_text(encoding="utf-8") == text
    assert not list(quick.rglob("*.png"))
    assert main(["summarize", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r2")]) == 2


def test_a_failure_reason_is_its_first_line_without_the_label_of_the_log_lines_after_it():
    error = ("the server exited with code -9 during startup (port 5): RuntimeError: size mismatch; last log lines:\n"
             "Scheduler hit an exception: Traceback (most recent call last):\n")
    assert first_line(error) == "the server exited with code -9 during startup (port 5): RuntimeError: size mismatch"
    assert first_line("\n  a point failed; see: the log  \nmore") == "a point failed; see: the log"
    assert first_line("a cell failed; reasons:") == "a cell failed; reasons:"
    assert first_line("") is None
