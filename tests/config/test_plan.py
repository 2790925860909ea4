"""Alias groups: points with the same server configuration run once; the plan shows trees, groups and estimates."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from configs import study_yaml
from conftest import copy_workflow, demo_config
from faketransformers import fake_transformers

from ddsweep.adaptive.stages import (
    DEFAULT_UNSETTLED_SHARE,
    chosen_strategy,
    format_stage_plan,
    is_adaptive,
    stage_estimates,
    strategy_choice,
    unsettled_share,
)
from ddsweep.cli import main
from ddsweep.config.plan import (
    benchmark_cells,
    cell_requests,
    cell_share,
    count_hosts,
    estimate_minutes,
    format_plan,
    plan_document,
    plan_points,
    running_points,
)
from ddsweep.config.records import point_record
from ddsweep.config.study import expand_points, validate_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study() -> dict:
    """The shipped study configuration, validated."""
    return validate_config(study_yaml())


def small_grid(study: dict, run_aliases: bool = False) -> dict:
    """A grid with known groups at block size 8 (L = 7), window 2048:
    budget 7 is the chain fast path (topk 1, 2, 4 one group); budget 8 gives width min(2, topk)
    (topk 1 alone; topk 2 and 4 one group); budget 16 gives width min(3, topk) (1, 2 and 4 all distinct)."""
    config = copy.deepcopy(study)
    config["sweep"]["grid"] = {"budget": [7, 8, 16], "topk": [1, 2, 4], "block_size": [8], "window": [2048]}
    config["sweep"]["constraints"] = []
    config["sweep"]["run_aliases"] = run_aliases
    config["baselines"]["dflash"] = None
    return validate_config(config)


EXPECTED_GROUPS = {
    "bs8-b7-t1-w2048": ["bs8-b7-t1-w2048", "bs8-b7-t2-w2048", "bs8-b7-t4-w2048"],
    "bs8-b8-t2-w2048": ["bs8-b8-t2-w2048", "bs8-b8-t4-w2048"],
}


def test_a_grid_with_known_alias_groups_runs_one_point_per_group(study):
    config = small_grid(study)
    planned = {p.point.point_id: p for p in plan_points(config)}
    assert len(planned) == 10  # ar + 9 ddtree
    groups: dict[str, list[str]] = {}
    for p in planned.values():
        groups.setdefault(p.group, []).append(p.point.point_id)
    assert {rep: sorted(members) for rep, members in groups.items() if len(members) > 1} == EXPECTED_GROUPS
    running = [p.point_id for p in running_points(config)]
    assert sorted(running) == sorted(["ar", "bs8-b7-t1-w2048", "bs8-b8-t1-w2048", "bs8-b8-t2-w2048",
                                      "bs8-b16-t1-w2048", "bs8-b16-t2-w2048", "bs8-b16-t4-w2048"])
    assert planned["bs8-b7-t4-w2048"].alias_of == "bs8-b7-t1-w2048" and not planned["bs8-b7-t4-w2048"].runs
    assert planned["bs8-b8-t4-w2048"].alias_of == "bs8-b8-t2-w2048"
    assert planned["bs8-b16-t4-w2048"].alias_of is None and planned["bs8-b16-t4-w2048"].tree.width == 3


def test_points_drafting_one_tree_at_other_verify_widths_are_twins_not_aliases(study):
    """topk 1 past the spine is a width-1 tree: the chain of 7 that budget 7 drafts, verified at 9 and 17 slots."""
    config = small_grid(study)
    planned = {p.point.point_id: p for p in plan_points(config)}
    chain = ["bs8-b7-t1-w2048", "bs8-b8-t1-w2048", "bs8-b16-t1-w2048"]
    assert [planned[i].tree.nodes for i in chain] == [7, 7, 7]
    assert [planned[i].tree.verify_width for i in chain] == [8, 9, 17]
    assert len({planned[i].group for i in chain}) == 3 and all(planned[i].runs for i in chain)
    assert {planned[i].twins for i in chain} == {"bs8-b7-t1-w2048"}
    assert planned["bs8-b8-t2-w2048"].twins is None and planned["bs8-b7-t2-w2048"].twins == "bs8-b7-t1-w2048"
    document = plan_document(config)
    assert document["twin_groups"] == [{"first": "bs8-b7-t1-w2048", "groups": chain}]
    assert "acceptance twins" in format_plan(config) and "  " + ", ".join(chain) in format_plan(config)


def test_an_unconfirmed_tree_rule_merges_no_points_unless_trusted(study):
    config = copy.deepcopy(small_grid(study))
    config["engine"]["presets"]["ddtree"]["verify"]["log_patterns"] = []
    planned = plan_points(validate_config(config))
    assert all(p.runs and p.alias_of is None for p in planned)
    assert "no verify.log_patterns entry confirms tree rule ddtree-pr29907" in format_plan(validate_config(config))
    config["engine"]["presets"]["ddtree"]["tree"]["trusted"] = True
    trusted = {p.point.point_id: p for p in plan_points(validate_config(config))}
    assert trusted["bs8-b7-t4-w2048"].alias_of == "bs8-b7-t1-w2048"


def test_run_aliases_runs_every_point_but_keeps_the_groups(study):
    config = small_grid(study, run_aliases=True)
    assert len(running_points(config)) == len(expand_points(config)) == 10
    document = plan_document(config)
    assert document["distinct_server_configurations"] == 7
    aliases = {e["point_id"]: e["alias_of"] for e in document["points"] if e["alias_of"]}
    assert aliases == {"bs8-b7-t2-w2048": "bs8-b7-t1-w2048", "bs8-b7-t4-w2048": "bs8-b7-t1-w2048",
                       "bs8-b8-t4-w2048": "bs8-b8-t2-w2048"}
    assert all(e["runs"] for e in document["points"])


def test_window_and_block_size_keep_points_apart(study):
    config = copy.deepcopy(study)
    config["sweep"]["grid"] = {"budget": [8], "topk": [2, 4], "block_size": [8, 16], "window": [2048, None]}
    planned = plan_points(validate_config(config))
    ddtree = [p for p in planned if p.point.kind == "ddtree"]
    assert len(ddtree) == 8 and len({p.group for p in ddtree}) == 4
    assert all(p.point.topk == 2 for p in ddtree if p.runs)


def test_the_default_study_plans_its_distinct_configurations_and_the_smaller_estimate(study):
    document = plan_document(study)
    ddtree = [e for e in document["points"] if e["kind"] == "ddtree"]
    assert len(ddtree) == 60
    assert len({e["alias_group"] for e in ddtree}) == 26
    assert document["distinct_server_configurations"] == 29  # plus ar and the two dflash baselines
    running = sum(e["runs"] for e in document["points"])
    assert running == 29
    every, runs = document["estimate"]["all_points"], document["estimate"]["running_points"]
    assert every == estimate_minutes(study, 63) and runs == estimate_minutes(study, 29)
    assert runs["gpu_hours"] < every["gpu_hours"]
    group = {e["point_id"]: e["alias_group"] for e in document["points"]}
    assert group["bs8-b4-t1-w2048"] == group["bs8-b4-t2-w2048"]  # the spine chain of 4
    assert group["bs16-b8-t1-w2048"] == group["bs16-b8-t2-w2048"]  # the spine chain of 8
    assert group["bs8-b8-t1-w2048"] != group["bs8-b16-t1-w2048"]  # one chain of 7, verified at 9 and 17 slots
    text = format_plan(study)
    assert "63 points; 29 distinct server configurations; 29 jobs will run (34 recorded as aliases)" in text
    assert "ddtree: 60 point(s), 26 distinct server configuration(s)" in text
    assert f"what will run: {runs['total_min'] / 60:.1f} h of jobs = {runs['gpu_hours']:.0f} GPU-hours" in text
    assert "preset ddtree: no verify entry checks topk" in text


def test_plan_prints_each_points_effective_tree(study):
    lines = {line.split()[0]: line for line in format_plan(study).splitlines() if line.startswith(("bs", "dfl"))}
    assert "tree w3 d7 n16 v17" in lines["bs8-b16-t8-w2048"]
    assert lines["bs8-b16-t8-w2048"].endswith("bs8-b16-t4-w2048")
    assert "chain 4 v5" in lines["bs16-b4-t2-woff"]
    assert "tree w1 d7 n7 v17" in lines["bs8-b16-t1-w2048"]
    assert "chain 7 v8" in lines["dflash-bs8-w2048"]
    for line in lines.values():  # no tree holds more nodes than its shape allows
        tree = re.search(r"tree w(\d+) d(\d+) n(\d+)", line)
        if tree:
            width, depth, nodes = map(int, tree.groups())
            assert nodes <= sum(width ** i for i in range(1, depth + 1)), line


@pytest.mark.slow
def test_plan_command_writes_the_plan_document(tmp_path):
    out = tmp_path / "plan.json"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "ddsweep", "plan", "-c", "config/config.yaml",
                             ".test/config.yaml", "--write", str(out)], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    entry = next(e for e in document["points"] if e["point_id"] == "bs8-b8-t8-w2048")
    assert entry["alias_of"] == "bs8-b8-t4-w2048" and entry["runs"] is False
    assert entry["tree"] == {"rule": "ddtree-pr29907", "shape": "tree", "width": 2, "depth_limit": 7, "nodes": 8,
                             "verify_width": 9}
    assert "10 points; 8 distinct server configurations; 8 jobs will run" in result.stdout
    # the stand-in counts tokens its own way: each point checks its contexts through /tokenize at run time
    assert document["infeasible_cells"] == [] and "simulated study" in document["infeasible_cells_checked_with"]
    assert "Benchmark cells: benchmark contexts were not checked" in result.stdout


def test_plan_names_the_contexts_no_prompt_can_be_sized_to_with_the_model_directorys_tokenizer(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", fake_transformers())
    overlay = tmp_path / "real.yaml"
    overlay.write_text(yaml.safe_dump({"simulated": False, "target": {"model_path": str(tmp_path)},
                                       "benchmark": {"contexts": [8, 128, 2048]}}))
    monkeypatch.chdir(ROOT)
    assert main(["plan", "-c", "config/config.yaml", ".test/config.yaml", str(overlay),
                 "--write", str(tmp_path / "plan.json")]) == 0
    cells = json.loads((tmp_path / "plan.json").read_text())["infeasible_cells"]
    assert {(c["workload"], c["context"]) for c in cells} == {("coding", 8)}  # 128 and 2048 are measurable
    out = capsys.readouterr().out
    assert f"Benchmark cells no point can measure (checked with the tokenizer of {tmp_path})" in out
    assert "  coding ctx=8: workload coding: no prompt can be sized to context 8" in out
    # the estimate counts what the points will measure: the coding workload's context 8 at every concurrency is out
    bench = demo_config(benchmark={"contexts": [8, 128, 2048]})["benchmark"]
    estimate = json.loads((tmp_path / "plan.json").read_text())["estimate"]["running_points"]
    assert estimate["cells_per_point"] == (len(benchmark_cells(bench)) - len(bench["concurrency"])) * bench["repeats"]
    # and the end-of-study reference run (the primary workload, coding, at every context) leaves context 8 out too
    reference = json.loads((tmp_path / "plan.json").read_text())["reference"]
    cells = 2 * len(bench["concurrency"]) * bench["repeats"]  # contexts 128 and 2048
    startup = demo_config()["resources"]["estimate"]["startup_min"]
    assert reference["per_run_min"] == pytest.approx(startup + cells * estimate["cell_min"])


def _dry_run(workdir: Path, *configfiles: str) -> str:
    """`snakemake -n` in a working copy; returns its output."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile",
                             *configfiles], cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.full("runs Snakemake on a working copy of the workflow")
def test_the_workflow_schedules_only_representatives(tmp_path):
    workdir = copy_workflow(tmp_path)
    config = demo_config()
    config["sweep"]["grid"] = {"budget": [7, 8, 16], "topk": [1, 2, 4], "block_size": [8], "window": [2048]}
    config["sweep"]["constraints"] = []
    config["sweep"]["points"] = []
    (workdir / "grid.yaml").write_text(yaml.safe_dump(config))
    output = _dry_run(workdir, "grid.yaml")
    scheduled = set(re.findall(r"results/points/([\w-]+)/done.json", output))
    assert scheduled == {"ar", "dflash-bs8-w2048", "dflash-nooverlap-bs8-w2048", "bs8-b7-t1-w2048", "bs8-b8-t1-w2048",
                         "bs8-b8-t2-w2048",
                         "bs8-b16-t1-w2048", "bs8-b16-t2-w2048", "bs8-b16-t4-w2048"}
    assert "results/plan.json" in output
    config["sweep"]["run_aliases"] = True
    (workdir / "all.yaml").write_text(yaml.safe_dump(config))
    scheduled = set(re.findall(r"results/points/([\w-]+)/done.json", _dry_run(workdir, "all.yaml")))
    assert {"bs8-b7-t4-w2048", "bs8-b8-t4-w2048"} <= scheduled and len(scheduled) == 12  # 9 DDTree, 2 DFlash, ar


def test_a_cell_has_at_least_c_requests_and_its_time_counts_waves_of_c():
    assert cell_requests(1, None) == 8 and cell_requests(16, None) == 64  # 4·C, at least 8
    assert cell_requests(1, 8) == 8 and cell_requests(32, 8) == 32  # never fewer than C in flight at once
    assert cell_share(1, 8, 32) == 0.25  # 8 of 32 sequential requests
    assert cell_share(32, 8, 32) == 1.0  # one wave of 32 either way
    assert cell_share(16, 16, None) == 0.25  # one wave of the default four


def test_a_slurm_host_list_counts_its_hosts():
    assert count_hosts("gpu[01-04,07],big1") == 6
    assert count_hosts("node7") == 1
    assert count_hosts("a[1-2]-b[1-3]") == 6


@pytest.mark.slow
def test_the_plan_on_slurm_counts_the_reference_runs_and_every_start_up(study, tmp_path):
    out = tmp_path / "plan.json"
    result = subprocess.run([sys.executable, "-m", "ddsweep", "plan", "-c", "config/config.yaml", "--executor",
                             "slurm", "--write", str(out)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    # the reference (ar) runs the primary workload's 2 contexts x 4 concurrencies x 3 repeats once per host: 10 min
    # start-up + 24 cells x 1.5 min = 46 min, on at most one host per point launch (29 points x 2 launches), at 8 GPUs
    reference = json.loads(out.read_text())["reference"]
    assert (reference["enabled"], reference["point"], reference["runs"], reference["per_run_min"]) == (
        True, "ar", 58, 46.0)
    assert reference["gpu_hours"] == pytest.approx(58 * 46 * 8 / 60)
    assert "58 x 46 min = 44.5 h = 356 GPU-hours" in result.stdout
    launches = "launches (server start-ups): 58 point launch(es) of 29 point(s) + 58 reference run(s) = 116"
    assert launches in result.stdout
    runs = estimate_minutes(study, 29)["total_min"]
    assert f"total: {(runs + 58 * 46) / 60:.1f} h of jobs" in result.stdout
    local = format_plan(study)
    assert "reference runs: off here (sweep.reference.enabled: auto); on Slurm they would add 356 GPU-hours" in local
    spread = copy.deepcopy(study)
    spread["resources"]["nodelist"] = "gpu[01-04]"
    assert plan_document(spread, on_slurm=True)["reference"]["runs"] == 4


def test_auto_runs_adaptive_only_when_it_is_expected_to_cost_less_than_the_grid(study):
    big = copy.deepcopy(study)
    big["sweep"]["strategy"] = "auto"
    # few points that are all expected to survive, in one launch each: the screening saves nothing and cannot
    # stand for the one launch of the whole matrix, so each confirmed point costs its screening more than the grid
    small = small_grid(study)
    small["sweep"]["grid"] = {"budget": [8], "topk": [4], "block_size": [8, 16], "window": [2048]}
    small["sweep"]["strategy"] = "auto"
    small["sweep"]["screen"]["expected_survivors"] = 1.0
    small["sweep"]["launches"] = 1
    choices = [strategy_choice(validate_config(c)) for c in (big, small)]
    for choice in choices:
        assert choice["chosen"] == ("adaptive" if choice["adaptive_expected_min"] < choice["grid_expected_min"]
                                    else "grid")
    assert [c["chosen"] for c in choices] == ["adaptive", "grid"]
    assert is_adaptive(validate_config(big)) and not is_adaptive(validate_config(small))
    text = format_plan(validate_config(small), format_stage_plan(validate_config(small)))
    assert "WARNING: the adaptive study is not expected to be cheaper than the grid here" in text
    assert "sweep.strategy auto: runs grid" in text
    assert "WARNING" not in format_plan(validate_config(big), format_stage_plan(validate_config(big)))


def _cells_json(directory: Path, stable: list[bool]) -> None:
    """A job directory whose cells.json records windows that settled or not."""
    (directory / "bench").mkdir(parents=True)
    (directory / "bench" / "cells.json").write_text(json.dumps({"cells": [{"window": {"stable": s}} for s in stable]}))


def test_the_share_of_cells_that_do_not_settle_comes_from_the_setting_earlier_records_or_the_default(study, tmp_path):
    config = validate_config({**study, "sweep": {**study["sweep"], "strategy": "adaptive"}})
    assert unsettled_share(config, tmp_path)["share"] == DEFAULT_UNSETTLED_SHARE  # no records yet
    _cells_json(tmp_path / "screen" / "ar", [True, False, False, True])
    _cells_json(tmp_path / "confirm" / "ar" / "launch-0", [True, True, True, True])
    _cells_json(tmp_path / "points" / "ar", [False] * 8)  # merged from those launches: not counted again
    _cells_json(tmp_path / "points" / "bs8-b8-t4-w2048", [False, True])  # a point run in one launch
    found = unsettled_share(config, tmp_path)
    assert found["share"] == pytest.approx(3 / 10) and found["source"].startswith("3 of 10 cells recorded under")
    config["sweep"]["screen"]["unsettled_share"] = 0.9
    assert unsettled_share(config, tmp_path) == {"share": 0.9, "source": "sweep.screen.unsettled_share"}


def test_unsettled_cells_run_to_their_cap_in_both_strategies_and_keep_their_screened_points(study):
    # without the race's cap, every candidate the screening keeps runs the later launches
    sweep = {**study["sweep"], "strategy": "adaptive", "screen": {**study["sweep"]["screen"], "race_keep": None}}
    config = validate_config({**study, "sweep": sweep})
    settled, half = stage_estimates(config, 0.0), stage_estimates(config, 0.5)
    bench, est = config["benchmark"], config["resources"]["estimate"]
    cells = len(benchmark_cells(bench)) * bench["repeats"] * settled["grid"]["points"]
    cap_extra = bench["max_window_s"] / 60 - max(est["cell_min"], bench["min_window_s"] / 60)
    assert half["grid"]["expected_min"] == pytest.approx(settled["grid"]["expected_min"] + cells * 0.5 * cap_extra)
    assert half["screen"]["expected_min"] > settled["screen"]["expected_min"]
    # every screened point with an unsettled regime cell is expected to survive: more points enter the race
    assert half["confirm"]["expected_min"] > settled["confirm"]["expected_min"] * 1.2


def test_auto_counts_instability_and_keeps_the_strategy_it_chose_first(study, tmp_path):
    config = small_grid(study)
    config["sweep"]["strategy"] = "auto"
    config["sweep"]["launches"] = 1  # every confirmed point pays its screening besides its one launch
    config["sweep"]["screen"]["unsettled_share"] = 0.0
    choice = strategy_choice(validate_config(config))
    assert choice["chosen"] == "adaptive" and choice["unsettled_share"] == 0.0
    config["sweep"]["screen"]["unsettled_share"] = 0.7  # most cells unsettled: the screening drops less
    unstable = validate_config(config)
    choice = strategy_choice(unstable)
    assert choice["chosen"] == "grid" and choice["adaptive_expected_min"] > choice["grid_expected_min"]
    text = "\n".join(format_stage_plan(unstable))
    assert "cells not settling: 70% expected (sweep.screen.unsettled_share)" in text
    assert "WARNING: the adaptive study is not expected to be cheaper than the grid here" in text
    assert "with 70% of the cells not settling" in text and "sweep.strategy auto: runs grid" in text
    # the workflow's first invocation records the choice; later ones keep it whatever the records show since
    assert not is_adaptive(unstable, tmp_path, write=True)
    assert json.loads((tmp_path / "strategy.json").read_text())["chosen"] == "grid"
    config["sweep"]["screen"]["unsettled_share"] = 0.0
    settled = validate_config(config)
    assert strategy_choice(settled, tmp_path)["chosen"] == "adaptive"
    assert chosen_strategy(settled, tmp_path)["chosen"] == "grid" and not is_adaptive(settled, tmp_path)
    text = "\n".join(format_stage_plan(settled, tmp_path))
    assert (f"runs grid (adaptive only when its expected job time is below the grid's; as chosen before, "
            f"{tmp_path / 'strategy.json'}: delete it to choose again)") in text


@pytest.mark.slow
def test_the_full_humaneval_on_ar_reaches_its_record_and_the_plan(study):
    config = copy.deepcopy(study)
    config["coding_eval"].update(limit=20, full_on_ar=True)
    config = validate_config(config)
    points = {p.point_id: p for p in expand_points(config)}
    assert point_record(config, points["ar"])["coding_eval"]["limit"] is None
    assert point_record(config, points["bs8-b8-t4-w2048"])["coding_eval"]["limit"] == 20
    subset = copy.deepcopy(config)
    subset["coding_eval"]["full_on_ar"] = False  # turning it off or on changes only ar's record
    for point_id in ("ar", "bs8-b8-t4-w2048"):
        same = point_record(subset, points[point_id]) == point_record(config, points[point_id])
        assert same is (point_id != "ar")
    extra = 15 * (164 / 20 - 1)  # estimate.coding_min for 20 problems, scaled to 164
    assert plan_document(config)["full_ar_coding_min"] == pytest.approx(extra)
    assert f"full HumanEval on ar (coding_eval.full_on_ar): +{extra:.0f} min" in format_plan(config)
    assert plan_document(study)["full_ar_coding_min"] == 0.0  # limit null: every point answers everything
