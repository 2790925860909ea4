"""The knob registry and the effective draft tree of each preset's tree rule (PR #29907's rule for ddtree)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from configs import study_yaml

from ddsweep.config.defaults import schema_default
from ddsweep.config.knobs import (
    KIND_KNOBS,
    KNOBS,
    ExpressionError,
    effective_tree,
    knob_routes,
    server_preset,
    unverified_knobs,
)
from ddsweep.config.study import ConfigError, unverified_swept_knobs, validate_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study() -> dict:
    """The shipped study configuration, unvalidated."""
    return study_yaml()


@pytest.fixture(scope="module")
def presets(study) -> dict:
    """The shipped presets."""
    return study["engine"]["presets"]


def test_registry_names_the_four_knobs_and_the_kinds_they_apply_to():
    assert KNOBS == ("budget", "topk", "block_size", "window")
    assert KIND_KNOBS == {"ddtree": KNOBS, "dflash": ("block_size", "window"), "ar": ()}


# Hand-computed from PR #29907's rule: L = block_size - 1; budget <= L -> the spine chain of `budget` tokens;
# otherwise width = min(max(budget // L + 1, 2), topk), depth limit L, at most min(budget, the shape's capacity
# w + w^2 + ... + w^L) nodes; verify width budget + 1 either way.
TREES = [
    # budget, topk, block_size -> shape, width, depth_limit, nodes, verify_width
    ((7, 4, 8), ("chain", 1, 7, 7, 8)),        # budget == L: the spine path, topk ignored
    ((7, 1, 8), ("chain", 1, 7, 7, 8)),
    ((4, 4, 8), ("chain", 1, 4, 4, 5)),        # budget < L: a chain of budget tokens, not a width-2 tree
    ((3, 8, 8), ("chain", 1, 3, 3, 4)),
    ((8, 1, 16), ("chain", 1, 8, 8, 9)),
    ((15, 8, 16), ("chain", 1, 15, 15, 16)),
    ((8, 8, 8), ("tree", 2, 7, 8, 9)),         # 8 // 7 + 1 = 2
    ((12, 2, 8), ("tree", 2, 7, 12, 13)),
    ((16, 8, 8), ("tree", 3, 7, 16, 17)),      # 16 // 7 + 1 = 3
    ((16, 2, 8), ("tree", 2, 7, 16, 17)),      # capped by topk
    ((8, 1, 8), ("tree", 1, 7, 7, 9)),         # topk 1: a width-1 tree is a chain of at most L
    ((16, 1, 8), ("tree", 1, 7, 7, 17)),
    ((16, 8, 16), ("tree", 2, 15, 16, 17)),    # 16 // 15 + 1 = 2
    ((64, 8, 8), ("tree", 8, 7, 64, 65)),      # 64 // 7 + 1 = 10, capped by topk 8
    ((64, 16, 8), ("tree", 10, 7, 64, 65)),
    ((20, 2, 3), ("tree", 2, 2, 6, 21)),       # a width-2 tree of depth 2 holds 2 + 4 nodes
]


@pytest.mark.parametrize(("knobs", "expected"), TREES, ids=[f"b{k[0]}-t{k[1]}-bs{k[2]}" for k, _ in TREES])
def test_ddtree_rule_matches_hand_computed_trees(presets, knobs, expected):
    budget, topk, block_size = knobs
    tree = effective_tree(presets["ddtree"], {"budget": budget, "topk": topk, "block_size": block_size,
                                              "window": None})
    assert (tree.shape, tree.width, tree.depth_limit, tree.nodes, tree.verify_width) == expected
    assert tree.rule == "ddtree-pr29907"


def test_tree_capacity_is_the_sum_of_the_widths_powers():
    from ddsweep.config.knobs import tree_capacity

    assert tree_capacity(1, 7) == 7 and tree_capacity(2, 7) == 254 and tree_capacity(3, 2) == 12


def test_drafted_tree_leaves_out_the_verify_width(presets):
    def tree(budget, topk):
        return effective_tree(presets["ddtree"], {"budget": budget, "topk": topk, "block_size": 8, "window": None})
    assert tree(7, 1).drafted() == tree(8, 1).drafted() == tree(16, 4 - 3).drafted() == ("chain", 7)
    assert tree(7, 1) != tree(8, 1) and tree(8, 2).drafted() != tree(12, 2).drafted()


def test_a_tree_rule_is_confirmed_by_a_log_check_or_trusted(presets):
    from ddsweep.config.knobs import tree_rule_confirmed

    assert tree_rule_confirmed(presets["ddtree"])  # the DDTree worker's start-up line reads block_size, budget
    unchecked = copy.deepcopy(presets["ddtree"])
    unchecked["verify"]["log_patterns"] = []
    assert not tree_rule_confirmed(unchecked)
    unchecked["tree"]["trusted"] = True
    assert tree_rule_confirmed(unchecked)
    assert not tree_rule_confirmed({k: v for k, v in presets["ddtree"].items() if k != "tree"})


def test_dflash_is_a_chain_of_block_size_minus_one_and_ar_has_no_tree(presets):
    chain = effective_tree(presets["dflash"], {"block_size": 8, "window": 2048})
    assert (chain.shape, chain.depth_limit, chain.verify_width) == ("chain", 7, 8)
    assert effective_tree(presets["ar"], {}).shape == "none"
    assert effective_tree(presets["ar"], {}).describe() == "none"


def test_another_rule_is_a_change_of_the_preset_not_of_code(presets):
    """A build where topk is the width itself (no cap): only the preset's expressions change."""
    preset = copy.deepcopy(presets["ddtree"])
    preset["tree"] = {"rule": "width-is-topk", "shape": "tree", "width": "topk", "depth_limit": "block_size - 1",
                      "nodes": "budget", "verify_width": "budget + 1"}
    trees = {t: effective_tree(preset, {"budget": 8, "topk": t, "block_size": 8}) for t in (2, 4, 8)}
    assert [trees[t].width for t in (2, 4, 8)] == [2, 4, 8]


def test_a_preset_without_tree_rule_has_an_unknown_tree(presets):
    preset = {k: v for k, v in presets["ddtree"].items() if k != "tree"}
    assert effective_tree(preset, {"budget": 8, "topk": 4, "block_size": 8}).shape == "unknown"


def test_tree_expressions_are_checked_at_validation(study):
    broken = copy.deepcopy(study)
    broken["engine"]["presets"]["ddtree"]["tree"]["width"] = "min(budget, vocab)"
    with pytest.raises(ConfigError, match=r"engine.presets.ddtree.tree.width: unknown name 'vocab'"):
        validate_config(broken)
    broken["engine"]["presets"]["ddtree"]["tree"]["width"] = "open('x')"
    with pytest.raises(ConfigError, match=r"tree.width: Call is not allowed"):
        validate_config(broken)
    del broken["engine"]["presets"]["ddtree"]["tree"]["width"]
    with pytest.raises(ConfigError, match=r"engine.presets.ddtree.tree.width: a tree rule needs width"):
        validate_config(broken)


def test_a_tree_rule_that_fails_for_a_point_names_the_point(study):
    broken = copy.deepcopy(study)
    broken["engine"]["presets"]["ddtree"]["tree"]["width"] = "budget - 8"
    with pytest.raises(ConfigError, match=r"point bs8-b8-t1-w2048: tree.width = 'budget - 8' gives 0"):
        validate_config(broken)
    with pytest.raises(ExpressionError, match="fails for"):
        effective_tree(study["engine"]["presets"]["ddtree"], {"budget": 8, "topk": 4, "block_size": 1})


def test_routes_say_how_each_knob_reaches_the_server_and_which_checks_see_it(presets):
    routes = knob_routes(presets["ddtree"])
    assert routes["topk"].env == ("SGLANG_DDTREE_MAX_TOPK",) and not routes["topk"].args
    assert routes["budget"].verify_server_args == ("speculative_ddtree_budget",)
    assert routes["window"].args == ("args_if_set.window[1]",)
    assert unverified_knobs(presets["ddtree"]) == ["topk"]
    assert unverified_knobs(presets["dflash"]) == [] and unverified_knobs(presets["ar"]) == []


def test_the_tree_description_never_reaches_the_server(presets):
    assert "tree" not in server_preset(presets["ddtree"])
    assert server_preset(presets["ddtree"])["env"] == presets["ddtree"]["env"]


def test_defaults_come_from_the_schema():
    from ddsweep.bench.cells import BenchSettings
    from ddsweep.coding.eval import CodingSettings

    assert BenchSettings.warmup_requests == schema_default("benchmark.warmup_requests")
    assert BenchSettings.max_failure_fraction == schema_default("benchmark.max_failure_fraction") == 0.05
    assert BenchSettings.request_timeout_s == schema_default("benchmark.request_timeout_s")
    assert CodingSettings.max_tokens == schema_default("coding_eval.max_tokens")
    with pytest.raises(KeyError, match="benchmark.nope: the schema .* has no key 'nope'"):
        schema_default("benchmark.nope")
    with pytest.raises(KeyError, match="gives no default"):
        schema_default("benchmark.contexts")


def test_validation_fills_nested_defaults_when_a_section_is_absent(study):
    config = copy.deepcopy(study)
    del config["resources"]
    del config["coding_eval"]
    validated = validate_config(config)
    assert validated["resources"]["estimate"]["startup_min"] == schema_default("resources.estimate.startup_min")
    assert validated["coding_eval"]["enabled"] is schema_default("coding_eval.enabled")
    assert validated["sweep"]["run_aliases"] is False


def test_validation_warns_when_a_swept_knob_has_no_verification(study):
    warnings = unverified_swept_knobs(validate_config(study))
    assert len(warnings) == 1 and warnings[0].startswith("engine.presets.ddtree: knob topk is swept (1, 2, 4, 8)")
    config = copy.deepcopy(study)
    config["engine"]["presets"]["ddtree"]["verify"]["log_patterns"] = ["max_topk={topk}"]
    assert unverified_swept_knobs(validate_config(config)) == []
    config = copy.deepcopy(study)
    config["sweep"]["grid"]["topk"] = [4]
    assert unverified_swept_knobs(validate_config(config)) == []
