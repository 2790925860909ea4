"""The recommended points' full HumanEval (coding_eval.full_on_picks): records, plan and the summary section."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import demo_config

from ddsweep.config.operational import measurement_record
from ddsweep.config.plan import format_plan, full_picks_coding_min
from ddsweep.config.records import coding_full_record, point_record
from ddsweep.config.study import find_point
from ddsweep.findings.full_coding import full_coding_block, recommended_points


def _answers(path: Path, texts: dict[str, str], passed: bool = True) -> None:
    path.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"task_id": task, "response": text, "passed": passed, "error_kind": None,
                         "finish_reason": "stop"}) for task, text in texts.items()]
    (path / "problems.jsonl").write_text("\n".join(lines) + "\n")


def test_full_on_picks_changes_no_point_record_and_its_job_runs_every_problem_without_a_benchmark():
    plain = demo_config()
    picks = demo_config(coding_eval={"full_on_picks": True})
    point = find_point(plain, "bs8-b8-t4-w2048")
    assert measurement_record(point_record(plain, point)) == measurement_record(point_record(picks, point))
    record = coding_full_record(picks, point)
    assert record["benchmark"] is None and record["stage"] == "coding_full"
    assert record["coding_eval"]["limit"] is None and record["coding_eval"]["task_ids"] is None
    assert record["coding_eval"]["ar_repeat"] is False and record["point_id"] == "bs8-b8-t4-w2048"


def test_the_plan_counts_one_launch_and_the_whole_humaneval_per_priority():
    config = demo_config(coding_eval={"full_on_picks": True, "limit": 8})
    est = config["resources"]["estimate"]
    priorities = len(config["analysis"]["priorities"])
    assert full_picks_coding_min(config) == priorities * (est["startup_min"] + est["coding_min"] * 164 / 8)
    assert "full HumanEval on the recommended points" in format_plan(config)
    assert full_picks_coding_min(demo_config()) == 0


def test_recommended_points_collects_the_priorities_of_each_pick():
    document = {"decision": {"priorities": [{"priority": "latency", "recommended": "a"},
                                            {"priority": "throughput", "recommended": "b"},
                                            {"priority": "balanced", "recommended": "a"},
                                            {"priority": "slo", "recommended": None}]}}
    assert recommended_points(document) == {"a": ["latency", "balanced"], "b": ["throughput"]}


def test_a_pick_that_differs_from_ar_beyond_the_floor_and_a_failed_full_run_are_caveats(tmp_path):
    tasks = {f"HumanEval/{i}": f"return {i}" for i in range(40)}
    _answers(tmp_path / "points" / "ar" / "coding", tasks)
    (tmp_path / "points" / "ar" / "coding" / "problems_repeat.jsonl").write_text(
        (tmp_path / "points" / "ar" / "coding" / "problems.jsonl").read_text())
    _answers(tmp_path / "coding_full" / "same" / "coding", tasks)
    _answers(tmp_path / "coding_full" / "drifted" / "coding", {t: "return None" for t in tasks}, passed=False)
    (tmp_path / "coding_full" / "broken").mkdir(parents=True)
    (tmp_path / "coding_full" / "broken" / "failure.json").write_text(
        json.dumps({"error_kind": "startup_timeout", "error": "not healthy within 60 s"}))
    picks = tmp_path / "coding_full" / "picks.json"
    picks.write_text(json.dumps({"picks": {"same": ["latency"], "drifted": ["throughput"], "broken": ["balanced"]},
                                 "run": ["broken", "drifted", "same"], "already_full": []}))
    section, caveats = full_coding_block(tmp_path, picks, "ar")
    rows = {row["point_id"]: row for row in section["rows"]}
    assert rows["same"]["exact_match"]["rate"] == 1.0 and rows["same"]["below_floor"] is False
    assert rows["drifted"]["below_floor"] is True and rows["drifted"]["passed"]["successes"] == 0
    assert rows["broken"]["failure"]["kind"] == "startup_timeout" and rows["broken"]["problems"] == 0
    kinds = {(c["kind"], c["title"].split("`")[1]) for c in caveats}
    assert kinds == {("full_coding_not_lossless", "drifted"), ("full_coding_failed", "broken")}


def test_no_section_without_the_picks_file(tmp_path):
    assert full_coding_block(tmp_path, tmp_path / "coding_full" / "picks.json", "ar") is None
