"""Configuration: schema and semantic validation, sweep expansion, point ids, plan."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from configs import study_yaml

from ddsweep.config.plan import format_plan
from ddsweep.config.records import point_record
from ddsweep.config.study import (
    ConfigError,
    Point,
    empty_grid,
    expand_points,
    find_point,
    load_config,
    merge_config,
    validate_config,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study() -> dict:
    """The shipped study configuration, unvalidated."""
    return study_yaml()


@pytest.fixture(scope="module")
def demo() -> dict:
    """The demo configuration merged over the study configuration, as Snakemake merges them."""
    base = study_yaml()
    return merge_config(base, yaml.safe_load((ROOT / ".test" / "config.yaml").read_text()))


def test_shipped_study_config_is_valid_and_expands_the_grid(study):
    config = validate_config(study)
    points = expand_points(config)
    ids = [p.point_id for p in points]
    assert ids[:3] == ["ar", "dflash-bs8-w2048", "dflash-nooverlap-bs8-w2048"]
    assert "bs8-b8-t4-w2048" in ids and "bs16-b16-t8-woff" in ids
    # 4 budgets x 4 topk, less (budget 4, topk 8) removed by `topk <= budget`, x 2 block sizes x 2 windows,
    # plus ar and the DFlash chain with the overlap scheduler on and off.
    assert len(points) == (4 * 4 - 1) * 2 * 2 + 3
    assert len(set(ids)) == len(ids)


def test_demo_config_is_valid_and_simulated(demo):
    config = validate_config(demo)
    assert config["simulated"] is True
    ids = [p.point_id for p in expand_points(config)]
    assert ids == ["ar", "dflash-bs8-w2048", "dflash-nooverlap-bs8-w2048", "bs8-b4-t1-w2048", "bs8-b4-t4-w2048",
                   "bs8-b8-t1-w2048",
                   "bs8-b8-t4-w2048", "bs16-b8-t4-w2048", "bs8-b8-t4-woff", "bs8-b8-t8-w2048"]


def test_defaults_are_filled_in(study):
    config = validate_config(study)
    assert config["benchmark"]["request_rate"] is None
    assert config["engine"]["env"] == {}
    assert config["coding_eval"]["task_ids"] is None


def test_constraints_filter_the_grid(study):
    config = copy.deepcopy(study)
    config["sweep"]["grid"] = {"budget": [2, 4], "topk": [1, 4], "block_size": [8], "window": [None]}
    config["sweep"]["constraints"] = ["topk <= budget"]
    ids = [p.point_id for p in expand_points(validate_config(config)) if p.kind == "ddtree"]
    assert ids == ["bs8-b2-t1-woff", "bs8-b4-t1-woff", "bs8-b4-t4-woff"]


@pytest.mark.parametrize(("point", "expected"), [
    (Point("ddtree", "ddtree", 8, 4, 8, 2048), "bs8-b8-t4-w2048"),
    (Point("ddtree", "ddtree", 12, 2, 16, None), "bs16-b12-t2-woff"),
    (Point("ddtree_patched", "ddtree", 8, 4, 8, None), "ddtree_patched-bs8-b8-t4-woff"),
    (Point("dflash", "dflash", block_size=8), "dflash-bs8"),
    (Point("dflash", "dflash", block_size=16, window=2048), "dflash-bs16-w2048"),
    (Point("ar", "ar"), "ar"),
])
def test_point_ids_are_stable_and_readable(point, expected):
    assert point.point_id == expected


def test_point_record_carries_knobs_and_preset(study):
    config = validate_config(study)
    record = point_record(config, find_point(config, "bs8-b8-t4-w2048"))
    assert record["point"] == {"preset": "ddtree", "kind": "ddtree", "budget": 8, "topk": 4, "block_size": 8,
                               "window": 2048}
    assert record["preset"]["env"] == {"SGLANG_DDTREE_MAX_TOPK": "{topk}"}
    assert record["simulated"] is False


def test_find_point_names_known_points(study):
    config = validate_config(study)
    with pytest.raises(ConfigError, match="no point 'bs8-b99'.*known: ar"):
        find_point(config, "bs8-b99")


@pytest.mark.slow
def test_plan_lists_points_count_and_estimate(study):
    config = validate_config(study)
    text = format_plan(config)
    assert "63 points" in text
    assert "bs16-b16-t8-woff" in text
    # 2 launches x (10 min startup + 10 warm-ups of 10 s) + (coding: 2 contexts x 4 concurrency + prose: 1
    # context x 2 concurrency) x 3 repeats x 1.5 min + 15 min coding = 83.3 min per point.
    assert "30 benchmark cells per point" in text and "estimated 83 min per point" in text
    assert "3.3 min of warm-ups (benchmark.warmup_window_s = 10 s each" in text
    assert "launches (server start-ups): 58 point launch(es) of 29 point(s)" in text  # two launches per point
    one = validate_config({**study, "sweep": {**study["sweep"], "launches": 1}})
    assert "estimated 72 min per point" in format_plan(one) and "29 point launch(es) of 29 point(s)" in format_plan(one)


def test_load_config_merges_files_like_snakemake(tmp_path):
    override = tmp_path / "override.yaml"
    override.write_text("benchmark:\n  repeats: 5\n")
    config = load_config(ROOT / "config" / "config.yaml", override)
    assert config["benchmark"]["repeats"] == 5
    assert config["benchmark"]["contexts"] == [128, 4096]


def _set(config: dict, path: str, value) -> dict:
    """Set a dotted key path (list indices as integers) in a copy of the configuration."""
    config = copy.deepcopy(config)
    *parents, last = path.split(".")
    node = config
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return config


_DELETE = object()

# Each broken configuration: (key path, new value, text the error must contain — it names the key).
BROKEN = [
    ("benchmark.repeats", "three", "benchmark.repeats"),
    ("benchmark.contexts", [], "benchmark.contexts"),
    ("benchmark.concurrency", [0, 4], "benchmark.concurrency[0]"),
    ("benchmark.max_failure_fraction", 1.5, "benchmark.max_failure_fraction"),
    ("benchmark.typo_key", 3, "unknown key(s) 'typo_key'"),
    ("benchmark.stall_timeout_s", 0, "benchmark.stall_timeout_s"),
    ("benchmark.stall_timeout_s", 900, "benchmark.stall_timeout_s: 900 s is not shorter than "
     "benchmark.request_timeout_s (900 s)"),
    ("surprise", {"a": 1}, "unknown key(s) 'surprise'"),
    ("study", "has spaces", "study"),
    ("target", _DELETE, "missing required key: 'target'"),
    ("sweep.grid.budget", [0, 8], "sweep.grid.budget[0]"),
    ("sweep.grid.topk", [-1], "sweep.grid.topk[0]"),
    ("sweep.constraints", ["topk <= budget +"], "sweep.constraints[0]: not a valid expression"),
    ("sweep.constraints", ["__import__('os')"], "sweep.constraints[0]: Call is not allowed"),
    ("sweep.constraints", ["depth > 2"], "sweep.constraints[0]: unknown name 'depth'"),
    ("sweep.preset", "nosuch", "sweep.preset: unknown preset 'nosuch'"),
    ("baselines.ar_preset", "nosuch", "baselines.ar_preset: unknown preset 'nosuch'"),
    ("benchmark.contexts", [128, 128, 2048], "benchmark.contexts: [128, 128, 2048] has non-unique elements"),
    ("benchmark.workloads", [{"name": "c", "kind": "coding", "concurrency": [0]}],
     "benchmark.workloads[0].concurrency[0]: 0 is less than the minimum of 1"),
    ("benchmark.min_window_s", 500, "benchmark.min_window_s: 500 s is longer than benchmark.max_window_s"),
    ("analysis.priorities", {"fast": {"latency": 0}}, "analysis.priorities.fast: weighs no regime"),
    ("sweep.points", [{"preset": "ddtree", "budget": 8, "topk": 4, "block_size": 8, "window": 2048}],
     "sweep.points[0]: duplicate point 'bs8-b8-t4-w2048'"),
    ("sweep.points", [{"preset": "ddtree", "budget": 8, "block_size": 8}],
     "sweep.points[0].topk: a point of kind ddtree needs"),
    ("sweep.points", [{"preset": "ar", "budget": 8}], "sweep.points[0].budget: a point of kind ar has no budget"),
    ("sweep.points", [{"preset": "dflash", "block_size": 16, "window": 8}], "sweep.points[0].window: window 8"),
    ("engine.presets.ddtree.args", ["--port", "{port}", "--budget", "{budjet}"],
     "engine.presets.ddtree.args[3]: unknown placeholder {budjet}"),
    ("engine.presets.ar.args", ["--port", "{port}", "--x", "{budget}"],
     "engine.presets.ar.args[3]: unknown placeholder {budget}"),
    ("engine.presets.ddtree.args", ["--model-path", "{model_path}"], "must pass the port with {port}"),
    ("engine.presets.ddtree.env", {"SGLANG_DDTREE_MAX_TOPK": "{topk"}, "engine.presets.ddtree.env.SGLANG_DDTREE"),
    ("engine.presets.ddtree.kind", "eagle", "engine.presets.ddtree.kind"),
    ("engine.launcher", [], "engine.launcher"),
    ("engine.launcher", ["{interpreter}", "-m", "sglang.launch_server"], "engine.launcher[0]: unknown placeholder"),
    ("engine.startup_timeout_s", 20000, "engine.startup_timeout_s: 20000 s does not fit inside resources.runtime_min"),
    ("analysis.regimes", [{"name": "x", "metric": "decode_tok_s", "context": 128, "concurrency": 64}],
     "analysis.regimes[0].concurrency: 64 is not in benchmark.concurrency"),
    ("analysis.regimes", [{"name": "x", "metric": "speed", "context": 128, "concurrency": 1}],
     "analysis.regimes[0].metric"),
    ("analysis.priorities", {"fast": {"nosuch": 1.0}}, "analysis.priorities.fast.nosuch: no regime named"),
    ("coding_eval.limit", 500, "coding_eval.limit: 500 exceeds the 164"),
    ("coding_eval.retry_truncated_max_tokens", 100, "coding_eval.retry_truncated_max_tokens: 100 must be larger"),
    # the study's coding_eval.max_tokens (8192) against a context length the study sets
    ("target.server_args", ["--context-length", "8192"], "coding_eval.max_tokens: 8192 does not fit --context-length "
     "8192 in target.server_args with any prompt"),
    ("coding_eval.task_ids", ["MBPP/1"], "coding_eval.task_ids[0]"),
    ("coding_eval.task_ids", ["HumanEval/3", "HumanEval/164"], "coding_eval.task_ids: unknown HumanEval task id(s) "
     "'HumanEval/164'"),
    ("baselines.dflash.preset", "nosuch", "baselines.dflash.preset: unknown preset 'nosuch'"),
]


@pytest.mark.parametrize(("path", "value", "message"), BROKEN, ids=[b[0] + ":" + str(i) for i, b in enumerate(BROKEN)])
def test_broken_configs_are_rejected_with_the_key_named(study, path, value, message):
    broken = _set(study, path, value)
    with pytest.raises(ConfigError) as error:
        validate_config(broken)
    assert message in str(error.value)


def test_a_context_length_that_holds_the_coding_answers_or_no_coding_eval_is_accepted(study):
    # the study's max_tokens 8192 and retry 32768; room for the prompt is left to the point (the server counts it)
    assert validate_config(_set(study, "target.server_args", ["--context-length", "65536"]))
    no_coding = _set(_set(study, "target.server_args", ["--context-length", "1024"]), "coding_eval.enabled", False)
    assert validate_config(no_coding)
    short = _set(_set(study, "target.server_args", ["--context-length=16384"]), "coding_eval.max_tokens", 4096)
    with pytest.raises(ConfigError, match="coding_eval.retry_truncated_max_tokens: 32768 does not fit "
                                          "--context-length 16384"):
        validate_config(short)
    assert validate_config(_set(short, "coding_eval.retry_truncated_max_tokens", None))
    # where SGLang truncates instead of refusing, the answers are cut short but not refused
    assert validate_config(_set(study, "target.server_args", ["--context-length", "1024", "--allow-auto-truncate"]))


def test_broken_yaml_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="configuration file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_grid_window_smaller_than_block_size_is_rejected_when_no_constraint_removes_it(study):
    broken = _set(_set(study, "sweep.grid.window", [4]), "sweep.constraints", [])
    with pytest.raises(ConfigError, match="sweep.grid.window: window 4 is smaller than block_size 8"):
        validate_config(broken)


def test_constraints_that_remove_the_whole_grid_are_a_warning_and_the_other_points_run(study):
    config = validate_config(_set(study, "sweep.constraints", ["budget > 100"]))
    assert empty_grid(config) == ["sweep.constraints: budget > 100 removes every combination of sweep.grid; only "
                                  "the baselines and sweep.points run"]
    assert empty_grid(validate_config(study)) == []
    assert {p.preset for p in expand_points(config)} == {"ar", "dflash", "dflash-nooverlap"}


def test_empty_sweep_is_rejected(study):
    broken = _set(_set(study, "sweep.grid", _DELETE), "baselines", {"ar": False, "dflash": None})
    with pytest.raises(ConfigError, match="sweep expands to no points"):
        validate_config(broken)


def test_validate_warns_about_a_swept_knob_no_check_verifies():
    from conftest import demo_config

    from ddsweep.config.study import unverified_swept_knobs

    config = validate_config(demo_config())
    warnings = unverified_swept_knobs(config)
    assert len(warnings) == 1 and "knob topk" in warnings[0] and "presets.ddtree" in warnings[0]
    config["engine"]["presets"]["ddtree"]["verify"]["log_patterns"] = [r"max_topk={topk}\b"]
    assert unverified_swept_knobs(config) == []
    config["engine"]["presets"]["ddtree"]["verify"]["log_patterns"] = []
    config["engine"]["presets"]["ddtree"]["verify"]["launch_command"] = ["--max-topk {topk}"]
    assert unverified_swept_knobs(config) == []


@pytest.mark.parametrize("metric", ["ttft_p99_s", "tpot_p99_s"])
def test_an_adaptive_study_refuses_a_tail_percentile_regime_and_a_grid_study_takes_it(study, metric):
    config = _set(study, "analysis.regimes.0.metric", metric)
    validate_config(config)  # the grid ranks on per-repeat figures: any metric the schema accepts
    adaptive = _set(config, "sweep.strategy", "adaptive")
    median = metric.replace("_p99_", "_p50_")
    with pytest.raises(ConfigError, match=rf"analysis.regimes\[0\].metric: {metric} cannot rank an adaptive study's "
                                          rf"screening: .* use {median} or sweep.strategy: grid"):
        validate_config(adaptive)
    validate_config(_set(adaptive, "analysis.regimes.0.metric", median))


def _validate(cwd: Path, *files: str) -> tuple[int, str, str]:
    """`ddsweep validate --config FILES` run in `cwd`: (exit code, stdout, stderr)."""
    import contextlib
    import io
    import os

    from ddsweep.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", "--config", *files])
    finally:
        os.chdir(previous)
    return code, out.getvalue(), err.getvalue()


def test_validate_checks_a_study_file_merged_over_the_workflow_config_as_snakemake_runs_it(tmp_path):
    # A study file that renames the regimes: alone it is consistent, but Snakemake merges it over
    # config/config.yaml, whose priorities still name `latency` and `throughput`.
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    renamed = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())
    renamed["analysis"] = {"regimes": [
        {"name": "short", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
        {"name": "busy", "metric": "output_throughput_tok_s", "context": 128, "concurrency": 1}]}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(renamed))
    code, out, err = _validate(tmp_path, "study.yaml")
    assert code == 2 and not out, out
    assert "analysis.priorities.latency_first.latency: no regime named 'latency'; regimes: short, busy" in err, err
    assert "checked: config/config.yaml merged with study.yaml" in err, err

    assert "a key of config/config.yaml that a later file does not replace stays" in err
    # the merged priorities keep config/config.yaml's weights: with the regime names they use, the study passes
    renamed["analysis"]["regimes"][0]["name"], renamed["analysis"]["regimes"][1]["name"] = "latency", "throughput"
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(renamed))
    code, out, err = _validate(tmp_path, "study.yaml")
    assert code == 0, err
    assert "configuration OK" in out and "(config/config.yaml merged with study.yaml)" in out, out
    # naming the workflow's file first reads it once; without it in the directory, the file is checked alone
    assert _validate(tmp_path, "config/config.yaml", "study.yaml")[1] == out
    (tmp_path / "config" / "config.yaml").unlink()
    code, out, _ = _validate(tmp_path, "study.yaml")
    assert code == 0 and "merged" not in out, out


@pytest.mark.parametrize(("base", "update", "merged"), [
    ({"a": {"x": 1, "y": 2}}, {"a": {"y": 3}}, {"a": {"x": 1, "y": 3}}),  # nested mappings merge
    ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),  # lists are replaced
    ({"a": None}, {"a": {"x": 1}}, {"a": {"x": 1}}),  # a mapping replaces a non-mapping
    ({"a": {"x": 1}}, {"a": None}, {"a": None}),  # and any value replaces a mapping
    ({"a": None}, {"a": {}}, {"a": None}),  # an empty mapping leaves what is there
    ({}, {"a": {}}, {"a": {}}),
])
def test_merge_config_is_snakemakes_update_config(base, update, merged):
    from snakemake.utils import update_config

    from ddsweep.config.study import merge_config

    theirs = copy.deepcopy(base)
    update_config(theirs, copy.deepcopy(update))
    assert merge_config(copy.deepcopy(base), update) == theirs == merged
