"""A grid point's repeats split across server launches (sweep.launches), the coding eval in the last launch."""

from __future__ import annotations

import copy

from conftest import demo_config

from ddsweep.config.launches import grid_launches, job_digests, launch_record, launch_repeats
from ddsweep.config.operational import record_digest
from ddsweep.config.plan import running_points
from ddsweep.config.study import find_point, validate_config


def test_repeats_are_split_across_the_launches_and_the_coding_eval_runs_once():
    config = demo_config()
    assert grid_launches(config) == 2 and config["benchmark"]["repeats"] == 3
    assert launch_repeats(config) == [2, 1]
    point = find_point(config, "bs8-b8-t4-w2048")
    records = [launch_record(config, point, k) for k in range(2)]
    assert [r["benchmark"]["repeats"] for r in records] == [2, 1]
    assert [r["coding_eval"]["enabled"] for r in records] == [False, True]
    assert [r["launch"] for r in records] == [0, 1]
    three = demo_config(sweep={"launches": 3})
    assert launch_repeats(three) == [1, 1, 1]


def test_a_point_runs_at_most_one_launch_per_repeat():
    config = copy.deepcopy(demo_config())
    config["sweep"]["launches"] = 4
    assert grid_launches(validate_config(config)) == 3 and launch_repeats(config) == [1, 1, 1]
    assert grid_launches(demo_config(benchmark={"repeats": 1})) == 1  # a one-repeat study (the smoke study)


def test_an_adaptive_study_has_its_own_launches():
    assert grid_launches(demo_config(sweep={"strategy": "adaptive"})) == 1


def test_each_grid_jobs_expected_digest_is_that_of_the_record_it_runs_with():
    config = demo_config()
    points = {p.point_id: p for p in running_points(config)}
    digests = job_digests(config, points)
    point = points["bs8-b8-t4-w2048"]
    assert digests["results/launches/bs8-b8-t4-w2048/launch-1"] == record_digest(launch_record(config, point, 1))
    assert len(digests) == 2 * len(points) and "results/points/bs8-b8-t4-w2048" not in digests  # merged: launches
    one = demo_config(sweep={"launches": 1})
    changed = demo_config(sweep={"launches": 1}, benchmark={"max_new_tokens": 32})
    assert job_digests(one, points)["results/points/ar"] != job_digests(changed, points)["results/points/ar"]

