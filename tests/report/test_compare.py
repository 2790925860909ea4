"""`ddsweep compare`: matched points' ratios with intervals, picks side by side, environment changes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import demo_record
from resultsets import drafter_bound_set, write_results

from ddsweep.cli import main
from ddsweep.commands.compare import StudyError, open_study
from ddsweep.findings.comparison import command_changes, compare
from ddsweep.report.bundle import create_bundle
from ddsweep.report.compare import render_compare

# The stand-in's acceptance draws from its model unless fixed: study B's drafter has every draft rejected (1 token
# per step, the target's own), a change of speed that three repeats resolve on a loaded machine.
WEAK_ACCEPTANCE = 1
WEAK_DRAFTER = ["--sim-accept-fixed", str(WEAK_ACCEPTANCE)]
BENCH = {"contexts": [128], "concurrency": [1, 2], "max_new_tokens": 32, "requests_per_cell": 4, "repeats": 3,
         "warmup_requests": 1, "workloads": [{"name": "coding", "kind": "coding"}]}
POINTS = ("ar", "bs8-b4-t4-w2048")
ANALYSIS = {"regimes": [{"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
                        {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128, "concurrency": 2},
                        {"name": "acceptance", "metric": "acceptance_length", "context": 128, "concurrency": 1}]}


def standin_studies(root: Path) -> tuple[Path, Path]:
    """Two two-point studies against the stand-in, laid out like bundles (results/ beside config/): A with the
    stand-in's own drafter model, B with a drafter whose drafts are all rejected. Each point of A runs at the
    same time as B's, each in its own process, so both see the same machine load (the suite runs beside other
    tests) and the speed ratios show the drafter, not the load."""
    studies = {root / "study-a": ("/models/drafter-v1", []), root / "study-b": ("/models/drafter-v2", WEAK_DRAFTER)}
    for point_id in POINTS:
        runs = []
        for study, (drafter_path, sim_args) in studies.items():
            record = demo_record(point_id, sim_args=sim_args, benchmark=BENCH, coding_eval={"enabled": False},
                                 drafter={"model_path": drafter_path, "trained_block_size": 8}, analysis=ANALYSIS)
            out = study / "results" / "points" / point_id
            runs.append((out, subprocess.Popen(
                [sys.executable, "-m", "ddsweep", "run-point", "--record", json.dumps(record), "--out", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        for out, run in runs:
            _, errors = run.communicate(timeout=300)
            assert run.returncode == 0, errors[-3000:]
            assert json.loads((out / "status.json").read_text())["status"] == "ok"
    for study, (drafter_path, _) in studies.items():
        (study / "config").mkdir()
        (study / "config" / "study.yaml").write_text(yaml.safe_dump({
            "study": study.name, "drafter": {"model_path": drafter_path, "trained_block_size": 8},
            "analysis": ANALYSIS}))
    return tuple(studies)


@pytest.mark.slow
@pytest.mark.full("two stand-in studies measured end to end, then compared")
def test_a_weaker_drafter_shows_in_acceptance_and_speed_ratios_and_the_environment(tmp_path: Path) -> None:
    a, b = standin_studies(tmp_path)
    bundle = create_bundle("study-b", b / "results", b / "reports", b / "config" / "study.yaml", tmp_path)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(bundle), "--out", str(out)]) == 0
    doc = json.loads((out / "compare.json").read_text())
    rows = {r["point_id"]: r["regimes"] for r in doc["matched"]["points"]}
    assert set(rows) == set(POINTS)
    tree = rows["bs8-b4-t4-w2048"]
    a_acc = tree["acceptance"]["a"]["value"]
    assert a_acc > 2.5  # the stand-in's own model accepts more than the fixed 1
    acc = tree["acceptance"]["ratio"]
    b_acc = tree["acceptance"]["b"]["value"]
    assert b_acc == pytest.approx(WEAK_ACCEPTANCE, rel=0.05)  # the prefill's first token takes no verify step
    assert acc["value"] == pytest.approx(b_acc / a_acc, rel=0.02)
    assert acc["ci_low"] <= acc["value"] <= acc["ci_high"]
    for regime in ("latency", "throughput"):
        speed = tree[regime]["ratio"]
        assert speed["ci_high"] < 1.0, regime  # fewer accepted tokens per step: slower, with confidence
        assert not math.isclose(speed["ci_low"], speed["ci_high"])
        # ar does not use the drafter: its ratio moves only with the machine's load between the two studies
        assert speed["value"] < 0.8 * rows["ar"][regime]["ratio"]["value"], regime
    changed = doc["environment"]["changed"]
    assert "drafter path" in changed
    added = {"change": f"added `--sim-accept-fixed {WEAK_ACCEPTANCE}`", "points": list(POINTS)}
    assert added in doc["environment"]["commands"]
    text = (out / "compare.md").read_text()
    assert "/models/drafter-v2" in text and "| drafter path |" in text and "**yes**" in text
    assert "× (95% CI" in text
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_ratios_of_synthetic_studies_match_the_built_in_change(tmp_path: Path) -> None:
    spec_a, spec_b = drafter_bound_set(), drafter_bound_set()
    for p in spec_b.points:
        if p.kind == "ddtree":
            p.decode_c1 *= 1.25
        p.interconnect = "NVLink"
    spec_b.points = [p for p in spec_b.points if p.point_id != "bs16-b8-t4-w2048"]
    write_results(spec_a, tmp_path / "a")
    write_results(spec_b, tmp_path / "b")
    a = open_study(tmp_path / "a" / "results", tmp_path, spec_a.config)
    b = open_study(tmp_path / "b", tmp_path, spec_b.config)
    doc = compare(a, b)
    rows = {r["point_id"]: r["regimes"] for r in doc["matched"]["points"]}
    assert doc["matched"]["only_in_a"] == ["bs16-b8-t4-w2048"] and not doc["matched"]["only_in_b"]
    latency = rows["bs8-b8-t4-w2048"]["latency"]["ratio"]
    assert latency["ci_low"] < 1.25 < latency["ci_high"] and latency["value"] == pytest.approx(1.25, rel=1e-6)
    assert rows["ar"]["latency"]["ratio"]["value"] == pytest.approx(1.0)
    assert doc["environment"]["changed"] == ["interconnect"]
    assert {r["unit"] for r in doc["matched"]["points"]} == {"repeat"}
    text = render_compare(doc)
    assert "between repeats within a launch only" in text and "| `ar` | repeat |" in text
    for point in (tmp_path / "a" / "results" / "points").iterdir():  # A in two launches (2+1 repeats), not B
        (point / "launches.json").write_text(json.dumps({"launches": [{"repeats": [0, 1]}, {"repeats": [2]}]}))
    doc = compare(open_study(tmp_path / "a", tmp_path, spec_a.config), open_study(tmp_path / "b", tmp_path,
                                                                                spec_b.config))
    assert {r["unit"] for r in doc["matched"]["points"]} == {"repeat"}  # never A's launches against B's repeats
    latency = {r["point_id"]: r["regimes"] for r in doc["matched"]["points"]}["bs8-b8-t4-w2048"]["latency"]
    assert latency["ratio"]["n"] == 3 and latency["a"]["n"] == 3 and latency["b"]["n"] == 3
    for results in (tmp_path / "a" / "results", tmp_path / "b" / "results"):  # both: each repeat its own launch
        for point in (results / "points").iterdir():
            (point / "launches.json").write_text(json.dumps({"launches": [{}, {}, {}]}))
    doc = compare(open_study(tmp_path / "a", tmp_path, spec_a.config), open_study(tmp_path / "b", tmp_path,
                                                                                spec_b.config))
    assert {r["unit"] for r in doc["matched"]["points"]} == {"launch"}
    latency = {r["point_id"]: r["regimes"] for r in doc["matched"]["points"]}["bs8-b8-t4-w2048"]["latency"]["ratio"]
    assert latency["ci_low"] < 1.25 < latency["ci_high"] and latency["n"] == 3
    assert "| `ar` | launch |" in render_compare(doc)


def test_command_changes_name_the_words_that_differ() -> None:
    a = {"argv": ["python", "-m", "sglang.launch_server", "--speculative-draft-model-path", "/d1", "--tp", "8"],
         "env": {"SGLANG_DDTREE_MAX_TOPK": "4"}}
    b = {"argv": ["python", "-m", "sglang.launch_server", "--speculative-draft-model-path", "/d2", "--tp", "8"],
         "env": {"SGLANG_DDTREE_MAX_TOPK": "4", "X": "1"}}
    assert command_changes(a, b) == ["`--speculative-draft-model-path /d1` → `--speculative-draft-model-path /d2`",
                                     "environment `X=` → `X=1`"]
    assert command_changes(a, a) == []
    longer = {**b, "argv": [*b["argv"], "--sim-accept-fixed", "2"]}
    assert command_changes(b, longer) == ["added `--sim-accept-fixed 2`"]
    assert command_changes(longer, b) == ["removed `--sim-accept-fixed 2`"]


def test_a_path_that_is_not_a_study_is_named(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="not a results directory"):
        open_study(tmp_path, tmp_path)
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(StudyError, match="report bundle"):
        open_study(tmp_path / "x.txt", tmp_path)
    assert main(["compare", str(tmp_path / "missing"), str(tmp_path), "--out", str(tmp_path / "o")]) == 2
