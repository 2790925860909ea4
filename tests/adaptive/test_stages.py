"""The adaptive study's stages: job records per stage, refinement points, resolving ids, GPU-time plan."""

from __future__ import annotations

import pytest
from conftest import demo_config

from ddsweep.adaptive.refinement import refine_candidates, resolve_point
from ddsweep.adaptive.stages import (
    STAGES,
    confirm_record,
    format_stage_plan,
    job_minutes,
    race_bound,
    race_expected,
    screen_benchmark,
    screen_record,
    stage_estimates,
)
from ddsweep.config.plan import benchmark_cells, running_points
from ddsweep.config.study import ConfigError, find_point


def stage_plan(config: dict) -> str:
    """The stage lines `ddsweep plan` prints for `config`."""
    return "\n".join(format_stage_plan(config))


def test_screen_record_runs_only_regime_cells_briefly_without_coding():
    config = demo_config(sweep={"strategy": "adaptive", "screen": {"requests_per_cell": 3, "select_on": "regimes"}})
    record = screen_record(config, find_point(config, "bs8-b8-t4-w2048"))
    bench = record["benchmark"]
    assert bench["contexts"] == [128, 2048] and bench["concurrency"] == [1, 8]
    # the demo's regime cells only: (2048, 8) is in no regime
    assert sorted(benchmark_cells(bench)) == [(128, 1), (128, 8), (2048, 1)]
    assert {w["name"] for w in bench["workloads"]} == {config["benchmark"]["workloads"][0]["name"]}
    assert bench["requests_per_cell"] == 3 and bench["repeats"] == 1
    assert record["coding_eval"]["enabled"] is False


def test_by_default_the_screening_measures_only_the_regimes_a_priority_weighs():
    config = demo_config(sweep={"strategy": "adaptive"})
    bench = screen_record(config, find_point(config, "bs8-b8-t4-w2048"))["benchmark"]
    # latency (128, 1) and throughput (128, 8) are weighed; long_context (2048, 1) and max_acceptance are not
    assert sorted(benchmark_cells(bench)) == [(128, 1), (128, 8)]


def test_a_priority_with_service_level_limits_weighs_only_its_regimes():
    config = demo_config(sweep={"strategy": "adaptive"})
    config["analysis"]["priorities"]["interactive"] = {"throughput": 1.0, "slo": {"ttft_p99_s": 2.0},
                                                       "slo_cell": {"context": 128, "concurrency": 8}}
    bench = screen_record(config, find_point(config, "bs8-b8-t4-w2048"))["benchmark"]
    assert sorted(benchmark_cells(bench)) == [(128, 1), (128, 8)]
    assert job_minutes(config, 0.0)  # the plan's estimate reads the same priorities


def test_confirm_records_split_the_repeats_as_the_grid_and_a_baseline_runs_once():
    config = demo_config(sweep={"strategy": "adaptive"})
    assert config["benchmark"]["repeats"] == 3 and config["sweep"]["launches"] == 2
    point = find_point(config, "bs8-b8-t4-w2048")
    records = [confirm_record(config, point, k) for k in range(2)]
    # the race's first launch measures only what it compares (the priorities' regime cells, the configured
    # requests per cell) with the smaller share of the repeats, as in the grid; the last launch, which only the
    # points still in the race reach, the whole matrix with every repeat
    assert [r["benchmark"]["repeats"] for r in records] == [1, 3]
    assert sorted(benchmark_cells(records[0]["benchmark"])) == [(128, 1), (128, 8)]
    assert records[0]["benchmark"]["requests_per_cell"] == config["benchmark"]["requests_per_cell"]
    assert records[1]["benchmark"]["contexts"] == config["benchmark"]["contexts"]
    assert records[1]["benchmark"]["workloads"] == config["benchmark"]["workloads"]
    assert [r["coding_eval"]["enabled"] for r in records] == [False, True]
    # the plan's cost model counts the first launch as a job of those cells: a start-up and two cells, not a third
    # of the last launch
    first, last = job_minutes(config)["launches"]
    assert first < last / 3
    one = confirm_record(demo_config(sweep={"strategy": "adaptive", "launches": 1}), point, 0)
    assert one["benchmark"]["repeats"] == 3 and one["benchmark"]["contexts"] == config["benchmark"]["contexts"]
    baseline = confirm_record(config, find_point(config, "ar"), 0)
    assert baseline["benchmark"]["repeats"] == 3 and baseline["coding_eval"]["enabled"] is True
    assert baseline["benchmark"]["contexts"] == config["benchmark"]["contexts"] and baseline["stage"] == "baseline"
    settling = confirm_record(config, point, 2)
    assert settling["stage"] == "settle" and settling["coding_eval"]["enabled"] is False


def test_refinement_adds_in_between_values_the_config_allows():
    config = demo_config(sweep={"strategy": "adaptive", "grid": {"budget": [4, 8, 16]}, "refine": {"budget": 2}})
    added = [p.point_id for p in refine_candidates(config, ["bs8-b8-t4-w2048", "bs8-b4-t1-w2048", "ar"])]
    # 8 -> 6 and 10; 4 -> 6 only (2 is outside the grid's range); budget 6 <= L is the spine chain whatever
    # topk, so bs8-b6-t1 (from budget 4) is the same server configuration as bs8-b6-t4 (from budget 8, found
    # first) and is not added again
    assert sorted(added) == ["bs8-b10-t4-w2048", "bs8-b6-t4-w2048"]
    assert resolve_point(config, "bs8-b10-t4-w2048").budget == 10


def test_refinement_respects_constraints_skips_aliases_and_is_off_by_default():
    config = demo_config(sweep={"strategy": "adaptive", "grid": {"budget": [4, 16], "topk": [1, 4, 8]},
                                "refine": {"topk": 2}, "constraints": ["topk <= budget"]})
    added = [p.point_id for p in refine_candidates(config, ["bs8-b4-t4-w2048", "bs8-b16-t4-w2048"])]
    # b4: topk 6 > budget 4 breaks the constraint; topk 2 builds the same width-2 tree as topk 4 (an alias).
    # b16: the rule caps the width at 3 = 16 // 7 + 1, so topk 6 is an alias of topk 4; topk 2 (width 2) is new.
    assert added == ["bs8-b16-t2-w2048"]
    assert refine_candidates(demo_config(sweep={"strategy": "adaptive"}), ["bs8-b8-t4-w2048"]) == []


def test_unknown_ids_are_refused_with_the_known_ones():
    config = demo_config(sweep={"strategy": "adaptive", "refine": {"budget": 2}})
    with pytest.raises(ConfigError, match="no point 'bs8-b100-t4-w2048'.*configured: ar"):
        resolve_point(config, "bs8-b100-t4-w2048")


def test_plan_shows_each_stage_next_to_the_grid():
    config = demo_config(sweep={"strategy": "adaptive", "refine": {"budget": 2}})
    stages = stage_estimates(config)
    assert stages["screen"]["points"] + stages["baselines"]["points"] == stages["grid"]["points"] == 8
    assert stages["baselines"]["points"] == 3  # measured once each, not screened
    assert stages["screen"]["worst_min"] < stages["grid"]["worst_min"]
    assert stages["confirm"]["expected_min"] < stages["confirm"]["worst_min"]
    text = stage_plan(config)
    for label in ("screen", "refine", "confirm", "full grid", "worst case", "expected"):
        assert label in text
    assert "worst case" not in stage_plan(demo_config())


def test_the_best_case_is_the_baselines_the_screening_and_one_candidate_through_the_race():
    config = demo_config(sweep={"strategy": "adaptive", "refine": {"budget": 2}})
    stages = stage_estimates(config)
    jobs = job_minutes(config)
    best = {name: stage["best_min"] for name, stage in stages.items()}
    # one candidate runs every confirmation launch but the first, which its screening stood for, and the coding
    # eval; no refinement point survives
    assert best["confirm"] == pytest.approx(sum(jobs["launches"][1:]) + jobs["coding"])
    assert best["refine"] == 0 < stages["refine"]["expected_min"]
    assert (best["baselines"], best["screen"]) == (stages["baselines"]["worst_min"], stages["screen"]["worst_min"])
    floor = sum(best[name] for name in STAGES)
    assert floor < sum(stages[name]["expected_min"] for name in STAGES)
    # the plan says what share of the grid even the best case costs, and what the baselines and screening take
    share = round(100 * floor / stages["grid"]["expected_min"])
    fixed = round(100 * (best["baselines"] + best["screen"]) / stages["grid"]["expected_min"])
    assert f"even then the adaptive study costs {share}% of the grid" in stage_plan(config)
    assert f"the baselines (one launch of every repeat each) and the screening {fixed}%" in stage_plan(config)


def test_the_race_cap_bounds_the_worst_case_confirmation():
    def worst(keep: int | None) -> tuple[float, int | None, dict]:
        config = demo_config(sweep={"strategy": "adaptive", "refine": {"budget": 2}, "screen": {"race_keep": keep},
                                    "grid": {"budget": [4, 8, 12, 16]}})
        return stage_estimates(config)["confirm"]["worst_min"], race_bound(config), config

    uncapped, no_bound, config = worst(None)
    capped, bound, capped_config = worst(1)
    entering = stage_estimates(config)["confirm"]["points"]
    assert no_bound is None and bound < entering
    assert f"at most {bound} run the later confirmation launches" in stage_plan(capped_config)
    assert "every point entering the confirmation may run every confirmation launch" in stage_plan(config)
    # the screening stands for the entering points' first launch; only `bound` of them run the second and the
    # coding eval
    assert capped == pytest.approx(uncapped * bound / entering)


def test_every_refinement_point_a_selection_can_list_resolves_to_itself():
    # Which refinement points a selection lists depends on the points it refines around: a candidate listed
    # around one point (bs8-b7-t2-w2048 here) can be an alias of one listed earlier around all of them.
    config = demo_config(sweep={"strategy": "adaptive", "refine": {"budget": 1},
                                "grid": {"budget": [4, 6, 8, 10, 12, 14, 16], "topk": [1, 2, 4, 8]},
                                "points": []})
    listed = 0
    for point in running_points(config):
        for candidate in refine_candidates(config, [point.point_id]):
            assert resolve_point(config, candidate.point_id) == candidate
            listed += 1
    assert listed > len(refine_candidates(config, [p.point_id for p in running_points(config)]))


def test_the_plan_bounds_settling_by_race_keep_per_priority_and_settle_launches():
    def settle(**screen) -> dict:
        config = demo_config(sweep={"strategy": "adaptive", "screen": screen})
        return stage_estimates(config)["settle"]

    default, one, three = settle(), settle(settle_launches=1), settle(settle_launches=3)
    assert one["points"] == 2 * 3  # race_keep 2 for each of the demo's 3 priorities
    assert default["worst_min"] == default["points"] == 0 < one["worst_min"]  # default: no settling
    plan = stage_plan(demo_config(sweep={"strategy": "adaptive"}))
    assert "settling: none (sweep.screen.settle_launches: 0)" in plan
    assert three["worst_min"] == pytest.approx(3 * one["worst_min"])
    assert settle(race_keep=None, settle_launches=1)["points"] == stage_estimates(demo_config(
        sweep={"strategy": "adaptive"}))["grid"]["points"]  # without the cap, every point may settle
    assert "settling: at most 1 launch(es) of the regime cells for at most 6 points" in stage_plan(
        demo_config(sweep={"strategy": "adaptive", "screen": {"settle_launches": 1}}))


def test_the_expected_confirmation_counts_race_keep_per_priority_running_the_later_launches():
    def expected(keep: int | None, **study) -> tuple[float, int | None, dict]:
        config = demo_config(sweep={"strategy": "adaptive", "screen": {"race_keep": keep, "expected_survivors": 1.0}},
                             **study)
        return stage_estimates(config)["confirm"]["expected_min"], race_expected(config), config

    uncapped, none, config = expected(None)
    capped, cap, _ = expected(1)
    priorities = len(config["analysis"]["priorities"])
    assert none is None and cap == priorities  # one candidate per priority (the baselines run once)
    entering = stage_estimates(config)["grid"]["points"]  # every point survives the screening here
    assert cap < entering and capped < uncapped
    assert f"expected {cap} (race_keep per priority" in stage_plan(expected(1)[2])


def test_the_stage_estimates_count_every_screening_cell_and_warmup_as_at_least_its_window():
    def screen_min(window_s: float, warmup_s: float = 0.0) -> float:
        config = demo_config(sweep={"strategy": "adaptive"},
                             benchmark={"min_window_s": window_s, "max_window_s": max(window_s, 0.5),
                                        "warmup_window_s": warmup_s},
                             resources={"estimate": {"startup_min": 1.0, "cell_min": 0.01, "coding_min": 0.0}})
        return stage_estimates(config)["screen"]["worst_min"] / stage_estimates(config)["screen"]["points"]

    cells = len(benchmark_cells(screen_benchmark(demo_config(sweep={"strategy": "adaptive"}))))
    assert screen_min(0) == pytest.approx(1.0 + cells * 0.01, rel=0.5)  # counted cells: their configured time
    assert screen_min(120) == pytest.approx(1.0 + cells * 2.0)  # two minutes a cell, however few its requests
    assert screen_min(120, 30) == pytest.approx(1.0 + cells * 2.5)  # and a settling warm-up before each
