"""The preset library (config/presets/): one file per engine build, merged under a study's presets, builds told
apart by their parsers' options, derived placeholders rendered like knobs."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT, demo_config

from ddsweep.config.knobs import effective_tree
from ddsweep.config.presets import library_builds, library_presets
from ddsweep.config.records import point_record
from ddsweep.config.study import ConfigError, expand_points, merge_config, validate_config
from ddsweep.point.lifecycle import render_server
from ddsweep.point.preflight import check_build

# What the two DDTree builds' parsers have (a subset of each real parser's options is enough to tell them apart).
V2_OPTIONS = ["--model-path", "--speculative-algorithm", "--speculative-ddtree-budget",
              "--speculative-ddtree-block-size", "--speculative-dflash-block-size"]
PR_OPTIONS = ["--model-path", "--speculative-algorithm", "--speculative-ddtree-budget",
              "--speculative-dflash-block-size"]
UPSTREAM_OPTIONS = ["--model-path", "--speculative-algorithm", "--speculative-dflash-block-size"]


def test_every_library_file_names_its_build_and_every_preset_carries_it():
    builds, presets = library_builds(), library_presets()
    assert {"sglang", "sglang-pr29907", "sglang-ddtree-v2"} <= set(builds)
    assert {"ar", "dflash", "dflash-nooverlap", "standalone", "ngram", "ddtree", "ddtree-v2"} <= set(presets)
    assert presets["ddtree-v2"]["build"] == "sglang-ddtree-v2" and presets["ddtree"]["build"] == "sglang-pr29907"


def test_builds_are_told_apart_by_their_parsers_options():
    builds = library_builds()
    assert builds["sglang-ddtree-v2"].matches(V2_OPTIONS) and not builds["sglang-pr29907"].matches(V2_OPTIONS)
    assert builds["sglang-pr29907"].matches(PR_OPTIONS) and not builds["sglang-ddtree-v2"].matches(PR_OPTIONS)
    assert not any(b.matches(UPSTREAM_OPTIONS) for b in builds.values() if b.detectable)


def test_the_preflight_names_the_preset_that_fits_the_installed_ddtree_build():
    config = demo_config()
    points = [p for p in expand_points(config) if p.preset == "ddtree"]
    findings = check_build(config, points, V2_OPTIONS)
    assert len(findings) == 1 and findings[0].level == "error" and findings[0].preset == "ddtree"
    assert "use preset ddtree-v2" in findings[0].message and "SGLang 0.5.16 with the DDTREE" in findings[0].message
    assert set(findings[0].points) == {p.point_id for p in points}
    assert check_build(config, points, PR_OPTIONS) == []
    upstream = check_build(config, points, UPSTREAM_OPTIONS)
    assert "matches no build of the preset library" in upstream[0].message and "use preset" not in upstream[0].message


def test_a_study_preset_replaces_the_library_preset_and_default_failure_patterns_reach_every_preset():
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())  # as Snakemake merges the files
    merge_config(raw, yaml.safe_load((ROOT / ".test" / "config.yaml").read_text()))
    raw["engine"]["presets"] = {"ar": {"kind": "ar", "args": ["--port", "{port}", "--x"],
                                       "failure_patterns": {"configuration": ["MyEngineError"]}}}
    config = validate_config(raw)
    presets = config["engine"]["presets"]
    assert presets["ar"]["args"][-1] == "--x" and "build" not in presets["ar"]
    assert "MyEngineError" in presets["ar"]["failure_patterns"]["configuration"]
    for preset in presets.values():  # the defaults of engine.failure_patterns apply to every preset
        assert any("CUDA out of memory" in p for p in preset["failure_patterns"]["infrastructure"])
    again = validate_config(config)  # validating twice repeats no pattern
    assert again["engine"]["presets"]["dflash"]["failure_patterns"] == presets["dflash"]["failure_patterns"]


def test_derived_placeholders_render_standalone_flags_from_the_knobs():
    config = demo_config(sweep={"points": [{"preset": "standalone", "budget": 4, "topk": 1, "block_size": 5}]})
    point = next(p for p in expand_points(config) if p.preset == "standalone")
    spec = render_server(point_record(config, point), 30000)
    flags = dict(zip(spec.command, spec.command[1:], strict=False))
    assert flags["--speculative-num-steps"] == "4" and flags["--speculative-num-draft-tokens"] == "5"
    assert flags["--speculative-eagle-topk"] == "1"
    assert flags["--speculative-draft-model-path"] == config["target"]["model_path"]  # the target drafts itself
    assert spec.expected_server_args["speculative_num_draft_tokens"] == 5


@pytest.mark.parametrize(("budget", "topk", "steps", "tokens"), [(2, 1, 2, 3), (8, 1, 4, 5), (8, 2, 4, 9)])
def test_standalone_flags_at_topk_1_are_a_chain_of_the_budget_as_sglang_verifies_it(budget, topk, steps, tokens):
    # SGLang verifies num_steps + 1 tokens at top-k 1 whatever --speculative-num-draft-tokens asks: the budget
    # sets the chain's length there, up to block_size - 1
    config = demo_config(sweep={"points": [{"preset": "standalone", "budget": budget, "topk": topk,
                                            "block_size": 5}]})
    point = next(p for p in expand_points(config) if p.preset == "standalone")
    spec = render_server(point_record(config, point), 30000)
    flags = dict(zip(spec.command, spec.command[1:], strict=False))
    assert (flags["--speculative-num-steps"], flags["--speculative-num-draft-tokens"]) == (str(steps), str(tokens))
    assert spec.expected_server_args["speculative_num_draft_tokens"] == tokens
    tree = effective_tree(config["engine"]["presets"]["standalone"], point.knobs)
    assert tree.verify_width == tokens and tree.nodes == (steps if topk == 1 else budget)


def test_a_derived_placeholder_may_not_shadow_a_knob():
    bad = {"kind": "ddtree", "args": ["--port", "{port}"], "derived": {"budget": "topk + 1"}}
    with pytest.raises(ConfigError, match="derived: budget already name"):
        demo_config(engine={"presets": {"bad": bad}})
