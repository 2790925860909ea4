"""The scheduled reference runs (sweep.reference): compared with the reference point's own result in a caveat
with numbers and hosts, and kept out of every decision and table of points."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
from resultsets import SynthPoint, drafter_bound_set, write_point, write_results

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.drift import load_reference_runs
from ddsweep.analysis.results import load_results
from ddsweep.commands.summarize import summarize
from ddsweep.findings.summary import build_outcome


def write_end_run(results: Path, start: SynthPoint, host: str, factor: float, failed: bool = False) -> Path:
    """An end-of-study run of `start` on `host`, `factor` times as fast; returns its done.json."""
    end = dataclasses.replace(start, decode_c1=start.decode_c1 * factor,
                              throughput_c32=start.throughput_c32 * factor, coding=[],
                              failure={"error_kind": "startup_exit", "error": "server exited"} if failed else None)
    staged = write_point(results / "reference" / "staging", end)
    directory = staged.rename(results / "reference" / f"end-{host}")
    (results / "reference" / "staging").rmdir()
    environment = json.loads((directory / "environment.json").read_text())
    environment.update(hostname=host, slurm={"job_id": "4242", "node": host})
    (directory / "environment.json").write_text(json.dumps(environment))
    (directory / "done.json").write_text("{}")
    return directory / "done.json"


def reference_document(tmp_path: Path, factors: dict[str, float]) -> dict:
    """The summary document (decisions only, no plots) of the drafter-bound study with end runs of `ar`."""
    spec = drafter_bound_set()
    results = write_results(spec, tmp_path)
    done = [write_end_run(results, spec.point("ar"), host, f) for host, f in factors.items()]
    settings = Settings.from_config(spec.config)
    decisions = analyse(load_results(results), settings)
    decisions.reference = load_reference_runs(results, done, settings.confidence)
    return build_outcome(decisions).to_json()


@pytest.mark.parametrize(("factor", "verdict"), [(1.08, "drift"), (1.0, "within")])
def test_an_end_run_is_compared_with_the_start_per_regime_with_numbers_and_hosts(tmp_path, factor, verdict):
    document = reference_document(tmp_path, {"gpu07": factor})
    caveat = next(c for c in document["caveats"] if c["kind"] == "reference_runs")
    latency = next(c for c in caveat["comparisons"] if c["regime"] == "latency")
    assert latency["host"] == "gpu07" and latency["verdict"] == verdict
    assert latency["ratio"]["value"] == pytest.approx(factor, rel=1e-6)
    assert latency["ratio"]["ci_low"] is not None and latency["ratio"]["level"] == 0.95
    assert caveat["drift"] is (verdict == "drift")
    assert "`gpu07`" in caveat["text"] and "`ar`" in caveat["text"]
    row = next(r for r in caveat["table"]["rows"] if r[1] == "latency")
    assert row[0] == "`gpu07`" and row[3] == f"{factor:.3f}×" and row[5] == verdict
    if verdict == "drift":
        assert "more than the 2% equivalence margin" in caveat["text"]
        assert any("gpu07" in item and "1.080×" in item for item in caveat["items"])
    else:
        assert "no drift beyond the 2% margin" in caveat["text"] and not caveat["items"]


def test_each_host_is_compared_and_a_failed_end_run_is_named(tmp_path):
    spec = drafter_bound_set()
    results = write_results(spec, tmp_path)
    done = [write_end_run(results, spec.point("ar"), "gpu01", 1.0),
            write_end_run(results, spec.point("ar"), "gpu02", 1.2),
            write_end_run(results, spec.point("ar"), "gpu03", 1.0, failed=True)]
    settings = Settings.from_config(spec.config)
    decisions = analyse(load_results(results), settings)
    decisions.reference = load_reference_runs(results, done, settings.confidence)
    caveat = next(c for c in build_outcome(decisions).caveats if c["kind"] == "reference_runs")
    verdicts = {c["host"]: c["verdict"] for c in caveat["comparisons"] if c["regime"] == "latency"}
    assert verdicts == {"gpu01": "within", "gpu02": "drift"}
    assert "No completed end-of-study run on `gpu03`" in caveat["text"]


def test_no_reference_caveat_without_end_runs(tmp_path):
    document = reference_document(tmp_path, {})
    assert not [c for c in document["caveats"] if c["kind"] == "reference_runs"]


@pytest.mark.slow
def test_reference_runs_never_enter_rankings_pareto_picks_or_tables(tmp_path):
    spec = drafter_bound_set()
    results = write_results(spec, tmp_path)
    # an end run far faster than every point: if it entered the decisions it would win everything
    done = write_end_run(results, spec.point("ar"), "gpu05", 5.0)
    without = analyse(load_results(results), Settings.from_config(spec.config))
    result = summarize(results, tmp_path / "reports", spec.config, reference=[done], plots=False)
    assert result.regime_winners == {o.resolved.regime.name: o.winner for o in without.regimes}
    assert result.pareto == without.pareto
    assert result.priority_picks == {p.name: p.point_id for p in without.priorities}
    for table in ("points", "bench_cells", "bench_groups", "overview", "jobs"):
        rows = list(csv.DictReader((results / "tables" / f"{table}.csv").open()))
        assert rows and not [r for r in rows if "@" in (r.get("point_id") or "") or "gpu05" in str(r)], table
    caveat = next(c for c in result.document["caveats"] if c["kind"] == "reference_runs")
    assert caveat["drift"] and "gpu05" in caveat["text"]
    assert "Reference point at the start and the end of the study" in result.summary_path.read_text()
