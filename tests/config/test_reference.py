"""`sweep.reference`: its validation, defaults and resolution, the job record of an end-of-study run and the
inventory of hosts that ran points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import demo_config

from ddsweep.config.records import point_record
from ddsweep.config.reference import host_inventory, reference_enabled, reference_point, reference_record
from ddsweep.config.study import ConfigError


def test_the_default_is_auto_with_the_autoregressive_baseline():
    config = demo_config()
    assert config["sweep"]["reference"] == {"enabled": "auto", "point": None}
    assert reference_point(config).point_id == "ar"
    assert reference_enabled(config, on_slurm=True) and not reference_enabled(config, on_slurm=False)


@pytest.mark.parametrize(("enabled", "slurm", "expected"), [(True, False, True), (False, True, False),
                                                            ("auto", True, True), ("auto", False, False)])
def test_enabled_resolves_true_false_and_auto_by_the_executor(enabled, slurm, expected):
    config = demo_config(sweep={"reference": {"enabled": enabled}})
    assert reference_enabled(config, on_slurm=slurm) is expected


def test_a_named_point_is_the_reference():
    config = demo_config(sweep={"reference": {"enabled": True, "point": "bs8-b8-t4-w2048"}})
    assert reference_point(config).point_id == "bs8-b8-t4-w2048"


@pytest.mark.parametrize(("sections", "message"), [
    ({"sweep": {"reference": {"point": "bs99"}}}, r"sweep.reference.point: no configured point 'bs99'; known: ar,"),
    ({"sweep": {"reference": {"point": "bs8-b8-t8-w2048"}}},
     r"sweep.reference.point: 'bs8-b8-t8-w2048' does not run, it is an alias of 'bs8-b8-t4-w2048'"),
    ({"sweep": {"reference": {"enabled": True}}, "baselines": {"ar": False}},
     r"sweep.reference.point: no point given and no autoregressive baseline"),
    ({"sweep": {"strategy": "adaptive", "reference": {"enabled": True}}},
     r"sweep.reference.enabled: true needs sweep.strategy: grid"),
    ({"sweep": {"reference": {"enabled": "yes"}}}, r"sweep.reference.enabled: 'yes' is not one of"),
    ({"sweep": {"reference": {"node": "gpu01"}}}, r"sweep.reference: unknown key\(s\) 'node'"),
])
def test_a_bad_reference_is_rejected_naming_the_key(sections, message):
    with pytest.raises(ConfigError, match=message):
        demo_config(**sections)


def test_auto_means_no_reference_in_an_adaptive_study_or_without_a_baseline():
    assert reference_point(demo_config(sweep={"strategy": "adaptive"})) is None
    assert reference_point(demo_config(baselines={"ar": False})) is None
    assert reference_point(demo_config(sweep={"reference": {"enabled": False}})) is None


def test_the_end_record_runs_the_primary_workload_at_every_cell_without_coding_and_ignores_analysis():
    config = demo_config(sweep={"reference": {"enabled": True}})
    record = reference_record(config, reference_point(config))
    own = point_record(config, reference_point(config))
    assert record["stage"] == "reference" and record["coding_eval"]["enabled"] is False
    assert [w["name"] for w in record["benchmark"]["workloads"]] == ["coding"]
    assert {k: v for k, v in record["benchmark"].items() if k != "workloads"} == \
        {k: v for k, v in own["benchmark"].items() if k != "workloads"}
    assert {k: v for k, v in record.items() if k not in ("benchmark", "coding_eval", "stage")} == \
        {k: v for k, v in own.items() if k not in ("benchmark", "coding_eval")}
    regimes = [{**r, "context": 2048, "concurrency": 4} for r in config["analysis"]["regimes"]]
    changed = demo_config(sweep={"reference": {"enabled": True}},
                          analysis={"equivalence_margin": 0.1, "confidence": 0.9, "regimes": regimes})
    assert reference_record(changed, reference_point(changed)) == record


def write_point(points: Path, point_id: str, status: str = "ok", environment: dict | None = None) -> Path:
    """A point directory with status.json, environment.json and done.json; returns its done.json."""
    directory = points / point_id
    directory.mkdir(parents=True)
    name = "status.json" if status == "ok" else "failure.json"
    (directory / name).write_text(json.dumps({"status": status}))
    if environment is not None:
        (directory / "environment.json").write_text(json.dumps(environment))
    (directory / "done.json").write_text("{}")
    return directory / "done.json"


def test_the_host_inventory_lists_the_slurm_node_or_hostname_of_completed_points(tmp_path):
    done = [
        write_point(tmp_path, "ar", environment={"hostname": "gpu01.cluster", "slurm": {"node": "gpu01"}}),
        write_point(tmp_path, "b", environment={"hostname": "gpu02.cluster", "slurm": {"node": "gpu02"}}),
        write_point(tmp_path, "c", environment={"hostname": "gpu01.cluster", "slurm": {"node": "gpu01"}}),
        write_point(tmp_path, "local", environment={"hostname": "workstation", "slurm": None}),
        write_point(tmp_path, "failed", status="failed", environment={"hostname": "gpu09", "slurm": None}),
        write_point(tmp_path, "bad-host", environment={"hostname": "a host with spaces"}),
    ]
    inventory = host_inventory(done)
    assert inventory["hosts"] == [{"host": "gpu01", "points": ["ar", "c"]}, {"host": "gpu02", "points": ["b"]},
                                  {"host": "workstation", "points": ["local"]}]
    assert inventory["unknown_host_points"] == ["bad-host"]
