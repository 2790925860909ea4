"""The cluster keys of `resources`: the pre-timeout signal must leave room for the shutdown, and multi-node points
get their group in the record (single-node records stay unchanged, so no point reruns)."""

from __future__ import annotations

import pytest
from configs import study_yaml
from conftest import demo_config

from ddsweep.config.records import point_record
from ddsweep.config.study import ConfigError, find_point


def test_the_shutdown_timeout_must_fit_in_the_signal_lead_time():
    with pytest.raises(ConfigError, match=r"engine.shutdown_timeout_s: 60 s .* resources.signal_lead_s \(65 s\)"):
        demo_config(engine={"shutdown_timeout_s": 60}, resources={"signal_lead_s": 65})
    demo_config(engine={"shutdown_timeout_s": 60}, resources={"signal_lead_s": 70})
    demo_config(engine={"shutdown_timeout_s": 600}, resources={"signal_lead_s": 0})  # no signal: no check


def test_the_signal_lead_time_must_be_shorter_than_the_runtime():
    with pytest.raises(ConfigError, match=r"resources.signal_lead_s: 600 s is not shorter than .*10 min"):
        demo_config(resources={"signal_lead_s": 600, "runtime_min": 10})


def test_defaults_turn_exclusive_on_by_gpu_count_and_keep_single_node_records_unchanged():
    config = demo_config()
    assert config["resources"]["exclusive"] is None and config["resources"]["nodes"] == 1
    assert config["resources"]["signal_lead_s"] == 120 and config["resources"]["retries"] == 2
    assert "group" not in point_record(config, find_point(config, "ar"))


def test_multi_node_presets_may_use_the_group_placeholders():
    ar = study_yaml()["engine"]["presets"]["ar"]
    args = [*ar["args"], "--nnodes", "{nnodes}", "--node-rank", "{node_rank}", "--dist-init-addr", "{dist_init_addr}"]
    config = demo_config(engine={"presets": {"ar": {**ar, "args": args}}},
                         resources={"nodes": 2, "gpus": 4, "cpus_per_task": 16})
    assert point_record(config, find_point(config, "ar"))["group"] == {"nnodes": 2, "gpus_per_node": 4,
                                                                      "cpus_per_task": 16}
