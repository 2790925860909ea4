"""The time budget: a job starts only when its estimate fits the time left; the estimate follows the study's own
completed jobs once there are some; the Slurm allocation's end counts when it comes first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import demo_config

from ddsweep.budget import (
    TimeBudget,
    job_estimate_s,
    make_budget,
    not_started,
    observed_job_seconds,
    observed_like,
    resume_message,
)


def test_a_job_starts_only_when_its_estimate_fits_the_time_left():
    budget = TimeBudget(deadline=1000.0, job_estimate_s=100.0, source="the time budget (budget_s=600)")
    assert budget.refusal(now=900.0) is None
    refusal = budget.refusal(now=901.0)
    assert refusal is not None and "99 s left" in refusal and "estimate (100 s)" in refusal
    assert TimeBudget.from_env(budget.to_env()) == budget
    assert TimeBudget.from_env("") is None


def test_a_job_takes_the_median_of_the_jobs_finished_when_it_starts():
    # the configured estimate (204 s) fits the 250 s left; the jobs finished since the invocation began took 300-340 s
    budget = TimeBudget(deadline=1000.0, job_estimate_s=204.0, source="the time budget (budget_s=1490)")
    assert budget.refusal(now=750.0) is None
    refusal = budget.refusal(now=750.0, observed=[342.0, 298.0, 325.0])
    assert refusal is not None and "estimate (325 s, the median of the study's 3 finished job(s))" in refusal
    assert budget.refusal(now=750.0, observed=[120.0]) is None


def test_a_job_is_compared_with_finished_jobs_of_its_kind_and_a_merged_point_is_not_one_job(tmp_path):
    for unit, duration in (("launches/a/launch-0", 300.0), ("launches/a/launch-1", 340.0), ("points/a", 640.0),
                           ("points/b", 100.0), ("confirm/c/launch-0", 310.0), ("screen/d", 20.0),
                           ("screen/e", 30.0)):
        (tmp_path / unit).mkdir(parents=True)
        (tmp_path / unit / "status.json").write_text(json.dumps({"duration_s": duration}))
    (tmp_path / "points" / "a" / "launches.json").write_text("{}")  # merged from launches/a: their sum
    full = [100.0, 300.0, 310.0, 340.0]
    assert sorted(observed_job_seconds(tmp_path)) == full
    for unit in ("points/x", "launches/x/launch-1", "confirm/x/launch-0"):
        assert sorted(observed_like(tmp_path / unit)) == full
    assert sorted(observed_like(tmp_path / "screen" / "x")) == [20.0, 30.0]


def test_the_estimate_is_the_studys_median_job_once_it_has_some(tmp_path):
    config = demo_config(sweep={"launches": 1})
    configured = job_estimate_s(config)
    est = config["resources"]["estimate"]
    assert configured > est["startup_min"] * 60  # start-up, warm-ups, cells, coding
    for point, duration in (("a", 30.0), ("b", 50.0), ("c", 400.0)):
        (tmp_path / "points" / point).mkdir(parents=True)
        (tmp_path / "points" / point / "status.json").write_text(json.dumps({"duration_s": duration}))
    budget = make_budget({**config, "budget_s": 600}, tmp_path, started=0.0, slurm_left_s=None)
    assert budget.job_estimate_s == 50.0 and budget.deadline == 600.0


def test_the_slurm_allocations_end_counts_when_it_comes_first():
    config = demo_config()
    config_dir = Path("/nonexistent")
    assert make_budget(config, config_dir, 0.0, None) is None
    lead = config["resources"]["signal_lead_s"]  # the point stops itself that long before the allocation ends
    assert lead > 0
    budget = make_budget({**config, "budget_s": 3600}, config_dir, started=100.0, slurm_left_s=600.0)
    assert budget.deadline == 700.0 - lead and "Slurm allocation" in budget.source and "signal_lead_s" in budget.source
    budget = make_budget({**config, "budget_s": 300}, config_dir, started=100.0, slurm_left_s=600.0)
    assert budget.deadline == 400.0 and "budget_s=300" in budget.source


def test_the_end_of_run_names_the_jobs_not_started_and_the_command_that_resumes(tmp_path):
    for point, kind in (("a", None), ("b", "time_budget"), ("c", "time_budget")):
        (tmp_path / "points" / point).mkdir(parents=True)
        (tmp_path / "points" / point / "done.json").write_text(json.dumps({"error_kind": kind}))
    assert not_started(tmp_path) == ["points/b", "points/c"]
    message = resume_message(tmp_path, "snakemake --cores all --configfile study.yaml")
    assert "2 job(s) not started" in message and message.endswith("snakemake --cores all --configfile study.yaml")
    assert resume_message(tmp_path / "none", "x") is None


@pytest.mark.parametrize("value", [0, -5, "soon"])
def test_a_bad_budget_is_refused_by_the_configuration_check(value):
    from ddsweep.config.study import ConfigError
    with pytest.raises(ConfigError, match="budget_s"):
        demo_config(budget_s=value)
