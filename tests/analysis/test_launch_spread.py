"""The measured launch-to-launch spread: pooled over points with two or more launches, with an interval that
covers the true spread, and the adaptive study's warning when its assumed launch_cv was optimistic."""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path

from studies import REGIMES_CONFIG, TruePoint, build

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.findings.launch_spread import pooled_spread, spread_block


def test_the_pooled_spread_interval_covers_the_true_spread_at_its_level():
    rng = random.Random(1)
    covered, trials = 0, 2000
    for _ in range(trials):
        per_launch = {f"p{i}": {k: 100.0 * math.exp(rng.gauss(0, 0.03)) for k in range(3)} for i in range(6)}
        sd, low, high, df = pooled_spread(per_launch, 0.95)
        assert df == 12 and low < sd < high
        covered += low <= 0.03 <= high
    assert 0.93 <= covered / trials <= 0.97, covered / trials
    assert pooled_spread({"a": {0: 1.0}}, 0.95) is None


def test_with_one_point_in_two_launches_the_interval_still_covers_at_its_level():
    # one degree of freedom: where an approximate chi-square quantile breaks down (its lower quantile)
    rng = random.Random(2)
    covered, trials = 0, 4000
    for _ in range(trials):
        sd, low, high, df = pooled_spread({"p": {k: 100.0 * math.exp(rng.gauss(0, 0.03)) for k in range(2)}}, 0.95)
        assert df == 1
        covered += low <= 0.03 <= high
    assert 0.935 <= covered / trials <= 0.965, covered / trials


def _launched(tmp_path: Path, ids: list[str]) -> Path:
    for pid in ids:
        (tmp_path / "points" / pid).mkdir(parents=True)
        (tmp_path / "points" / pid / "launches.json").write_text(json.dumps({"launches": [{}, {}, {}]}))
    return tmp_path


def test_the_spread_counts_launches_not_the_repeats_that_share_one(tmp_path):
    # two launches per point, the first with two repeats (the grid's 3-repeat split): the repeats of one launch
    # share its launch effect, so they are one launch figure, not two
    points = [TruePoint(f"bs8-b{b}-t4-w2048", budget=b, decode=100.0 + b) for b in (4, 8, 12, 16)]
    rng = random.Random(3)
    effects = {(p.point_id, k): rng.gauss(0, 0.05) for p in points for k in (0, 1)}
    results = build(points, 0, noise=0.0, shared=0.0)
    launch = results.cells["repeat"].map({0: 0, 1: 0, 2: 1})
    results.cells["launch"] = launch
    factor = [math.exp(effects[(pid, k)]) for pid, k in zip(results.cells["point_id"], launch, strict=True)]
    for column in ("decode_tok_s_median", "output_throughput_tok_s"):
        results.cells[column] = results.cells[column] * factor
    decisions = analyse(results, Settings.from_config(copy.deepcopy(REGIMES_CONFIG)))
    latency = next(s for s in spread_block(decisions, _launched(tmp_path, [p.point_id for p in points]))["spreads"]
                   if s["regime"] == "latency")
    assert latency["df"] == 4 and latency["points"] == 4  # one per point: 2 launches, not 3 repeats
    expected = math.sqrt(sum((effects[(p.point_id, 0)] - effects[(p.point_id, 1)]) ** 2 / 2 for p in points) / 4)
    assert math.isclose(latency["sd"], expected, rel_tol=1e-6)


def test_an_adaptive_study_is_warned_when_its_assumed_launch_cv_was_optimistic(tmp_path):
    points = [TruePoint(f"bs8-b{b}-t4-w2048", budget=b, decode=100.0 + b) for b in (4, 8, 12, 16)]
    results = build(points, 0, noise=0.08, shared=0.0)  # 8% between launches, one repeat each
    results.cells["launch"] = results.cells["repeat"]
    config = copy.deepcopy(REGIMES_CONFIG)
    config["sweep"] = {"strategy": "adaptive", "screen": {"launch_cv": 0.01}}
    decisions = analyse(results, Settings.from_config(config))
    block = spread_block(decisions, _launched(tmp_path, [p.point_id for p in points]))
    latency = next(s for s in block["spreads"] if s["regime"] == "latency")
    assert latency["df"] == 8 and latency["points"] == 4 and latency["low"] > 0.01
    assert any("optimistic" in item and "launch_cv = 1.0%" in item for item in block["items"])
    config["sweep"]["screen"]["launch_cv"] = 0.5
    calm = spread_block(analyse(results, Settings.from_config(config)), tmp_path)
    assert not any("optimistic" in item for item in calm["items"])


def test_a_study_without_launches_says_the_spread_was_not_measured(tmp_path):
    decisions = analyse(build([TruePoint("bs8-b8-t4-w2048")], 0), Settings.from_config(copy.deepcopy(REGIMES_CONFIG)))
    block = spread_block(decisions, tmp_path)
    assert block["text"].startswith("Not measured") and "table" not in block
