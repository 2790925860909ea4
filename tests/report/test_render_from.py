"""`ddsweep summarize --from summary.json` writes the Markdown the full summarize writes, byte for byte: the
summary is a rendering of the decision object alone (for a synthetic study here, for a committed GPU record's
store; the demo study's check is in tests/workflow/test_workflow.py)."""

from __future__ import annotations

import copy
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml
from resultsets import broken_set, write_results
from studies import REGIMES_CONFIG, TruePoint, build

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.outcome import Outcome, SchemaError
from ddsweep.cli import main
from ddsweep.commands.summarize import summarize
from ddsweep.findings.summary import build_outcome
from ddsweep.point.launches import merge_launches
from ddsweep.report.render import render_markdown

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "benchmarks" / "records"
GPU_RECORD = RECORDS / "2026-12-06-h100-stability-finished"


def rendered_from(summary_json: Path, out: Path) -> bytes:
    """The Markdown `ddsweep summarize --from SUMMARY_JSON --out OUT` writes."""
    assert main(["summarize", "--from", str(summary_json), "--out", str(out)]) == 0
    return (out / "optimization_summary.md").read_bytes()


def test_a_study_with_failed_points_renders_the_same_from_its_summary_json(tmp_path: Path) -> None:
    spec = broken_set()
    result = summarize(write_results(spec, tmp_path), tmp_path / "reports", spec.config, plots=False)
    assert result.outcome.points.by_status.get("failed")  # failures by cause are part of what is compared
    assert rendered_from(result.summary_json_path, tmp_path / "again") == result.summary_path.read_bytes()


def test_summary_json_is_exactly_the_decision_object(tmp_path: Path) -> None:
    spec = broken_set()
    result = summarize(write_results(spec, tmp_path), tmp_path / "reports", spec.config, plots=False)
    document = json.loads(result.summary_json_path.read_text(encoding="utf-8"))
    assert Outcome.from_json(document) == result.outcome
    assert list(document) == list(result.outcome.to_json())


def test_service_level_limits_render_the_same_from_the_json_form() -> None:
    config = copy.deepcopy(REGIMES_CONFIG)
    config["analysis"]["priorities"] = {"interactive": {"latency": 1.0, "slo": {"ttft_p99_s": 2.0},
                                                        "slo_cell": {"context": 128, "concurrency": 32}}}
    points = [TruePoint("fast-but-slow-start", decode=150.0, ttft_p99=3.0),
              TruePoint("bs8-b8-t4-w2048", decode=120.0, ttft_p99=1.0)]
    outcome = build_outcome(analyse(build(points, 3), Settings.from_config(config)))
    again = Outcome.from_json(json.loads(json.dumps(outcome.to_json())))
    assert again == outcome
    text = render_markdown(again)
    assert text == render_markdown(outcome)
    assert "### Service-level limits of `interactive`" in text and "fails: " in text


def test_a_summary_of_another_schema_is_refused_with_the_way_out(tmp_path: Path, capsys) -> None:
    old = tmp_path / "summary.json"
    old.write_text(json.dumps({"schema_version": 2, "study": "x"}), encoding="utf-8")
    with pytest.raises(SchemaError, match="schema_version 2"):
        Outcome.from_json(json.loads(old.read_text(encoding="utf-8")))
    assert main(["summarize", "--from", str(old), "--out", str(tmp_path / "out")]) == 2
    assert "run `ddsweep summarize` on the results again" in capsys.readouterr().err
    assert not (tmp_path / "out" / "optimization_summary.md").exists()


def without_keys(doc: object, *keys: str) -> object:
    """`doc` with every mapping's `keys` left out, at any depth."""
    if isinstance(doc, dict):
        return {k: without_keys(v, *keys) for k, v in doc.items() if k not in keys}
    if isinstance(doc, list):
        return [without_keys(v, *keys) for v in doc]
    return doc


@pytest.mark.slow
@pytest.mark.full("summarizes a GPU record's whole store again: 100 MB of request records, about 20 s")
def test_the_gpu_records_store_summarized_again_renders_the_same_from_its_summary_json(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """A committed GPU study's store (4 launches from one machine, the other 2 from a second, as its record's README
    puts them together) is merged and summarized again with the study's config (the summary's reproduce section):
    the decision is the one the GPU machine wrote, and it renders the same from the new summary.json."""
    with tarfile.open(RECORDS / "2026-12-06-h100-stability-resumed" / "store-stability.tar.xz", mode="r:xz") as first:
        first.extractall(tmp_path, filter="data")
    with tarfile.open(GPU_RECORD / "store-launch-1.tar.xz", mode="r:xz") as second:
        for unit in {Path(*Path(m.name).parts[:4]) for m in second.getmembers() if len(Path(m.name).parts) > 4}:
            shutil.rmtree(tmp_path / unit)  # the not-started records the second machine replaced
        second.extractall(tmp_path, filter="data")
    committed = json.loads((GPU_RECORD / "summary.json").read_text(encoding="utf-8"))
    reproduce = next(s for s in committed["sections"] if s["kind"] == "reproduce")
    config = yaml.safe_load(reproduce["code2"]["text"])
    monkeypatch.chdir(tmp_path)  # the record's paths are relative to its study directory
    shutil.copy(GPU_RECORD / "plan.json", "results/plan.json")  # each point's cost, as on the machine
    Path("results/study_config.yaml").write_text(reproduce["code2"]["text"], encoding="utf-8")
    for point in sorted(Path("results/launches").iterdir()):
        merge_launches(sorted(point.glob("launch-*")), Path("results/points") / point.name)
    result = summarize(Path("results"), Path("summarized"), config, plots=False)
    assert result.outcome.points.by_status == {"ok": 3} and not result.simulated
    again = json.loads(result.summary_json_path.read_text(encoding="utf-8"))
    # the decision the GPU machine wrote, less what later versions add to it: an interval's degrees of freedom
    assert without_keys(again["decision"], "df") == committed["decision"]
    assert rendered_from(result.summary_json_path, Path("from-json")) == result.summary_path.read_bytes()
