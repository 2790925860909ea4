"""Exact-match comparison of a point's coding answers with the autoregressive reference."""

from __future__ import annotations

import random

import pytest

from ddsweep.coding.lossless import (
    assess_lossless,
    compare_outputs,
    first_difference,
    p_below_floor,
    simple_tokens,
    wilson_interval,
)


def record(task_id: str, response: str, reasoning: str | None = None, error_kind: str | None = None) -> dict:
    """A minimal problems.jsonl record."""
    return {"task_id": task_id, "response": response, "reasoning": reasoning, "error_kind": error_kind}


def test_identical_outputs_match_exactly() -> None:
    """Equal responses and reasoning are exact matches."""
    ref = [record("HumanEval/0", "def f():\n    return 1", "think"), record("HumanEval/1", "x")]
    result = compare_outputs(ref, [dict(r) for r in ref])
    assert result == {"compared": 2, "exact_match": 2, "exact_match_rate": 1.0, "mismatches": []}


def test_mismatch_positions_in_chars_and_tokens() -> None:
    """The first differing character and simple token are reported."""
    ref = [record("HumanEval/0", "return a + b")]
    cand = [record("HumanEval/0", "return a - b")]
    result = compare_outputs(ref, cand)
    assert result["compared"] == 1 and result["exact_match"] == 0 and result["exact_match_rate"] == 0.0
    mismatch = result["mismatches"][0]
    assert mismatch["task_id"] == "HumanEval/0"
    offset = len("\n<<<response>>>\n")
    assert mismatch["first_diff_char"] == offset + len("return a ")
    assert mismatch["first_diff_token"] == len(simple_tokens("\n<<<response>>>\nreturn a"))


def test_reasoning_differences_count() -> None:
    """A different reasoning field with the same response is not an exact match."""
    result = compare_outputs([record("A", "same", "one way")], [record("A", "same", "another way")])
    assert result["exact_match"] == 0 and result["mismatches"][0]["first_diff_char"] == 0


def test_missing_and_failed_requests_are_not_compared() -> None:
    """Problems absent from either side, or whose request failed, are left out of the rate."""
    ref = [record("A", "x"), record("B", "y"), record("C", "", error_kind="request")]
    cand = [record("A", "x"), record("C", "z")]
    result = compare_outputs(ref, cand)
    assert result["compared"] == 1 and result["exact_match_rate"] == 1.0


def test_empty_comparison_rate_is_none() -> None:
    """Nothing to compare gives a null rate rather than a division by zero."""
    assert compare_outputs([], [])["exact_match_rate"] is None


def test_prefix_difference_and_tokens() -> None:
    """A prefix differs at the shorter length; tokens split words and punctuation."""
    assert first_difference("abc", "abcd") == 3
    assert first_difference("abc", "abc") is None
    assert simple_tokens("x=f(a, b)  # ok") == ["x", "=", "f", "(", "a", ",", "b", ")", "#", "ok"]


def _run(task_count: int, differ: set[int], tag: str = "x") -> list[dict]:
    """Records for `task_count` problems whose response differs from the reference at the indices `differ`."""
    return [record(f"HumanEval/{i}", f"answer {i}" + (f" {tag}" if i in differ else "")) for i in range(task_count)]


def test_floor_from_a_repeated_ar_and_only_clear_drops_are_flagged() -> None:
    """With ar agreeing with itself on 90 of 100, a point at 88 is not flagged and a point at 40 is."""
    reference = _run(100, set())
    repeat = _run(100, set(range(10)), "ar-noise")
    result = assess_lossless(reference, repeat, {
        "near": _run(100, set(range(12))),
        "far": _run(100, set(range(60))),
    })
    assert result["floor"] == {"compared": 100, "exact_match": 90, "exact_match_rate": 0.9}
    assert len(result["floor_mismatches"]) == 10
    near, far = result["points"]["near"], result["points"]["far"]
    assert near["exact_match_rate"] == 0.88 and near["floor_rate"] == 0.9 and near["below_floor"] is False
    assert far["exact_match_rate"] == 0.4 and far["below_floor"] is True
    assert far["ci_low"] < 0.4 < far["ci_high"] < 0.9


@pytest.mark.slow
def test_the_floor_test_is_fishers_exact_one_sided_test() -> None:
    from scipy.stats import fisher_exact

    for matched, compared, floor_matched, floor_compared in [(138, 164, 150, 164), (40, 100, 90, 100),
                                                             (5, 8, 8, 8), (88, 100, 90, 100), (0, 3, 0, 3)]:
        table = [[matched, compared - matched], [floor_matched, floor_compared - floor_matched]]
        expected = fisher_exact(table, alternative="less").pvalue
        assert p_below_floor(matched, compared, floor_matched, floor_compared) == pytest.approx(expected, rel=1e-9)


def test_a_point_is_flagged_at_the_level_held_over_every_point_compared() -> None:
    # ar agrees with itself on 150 of 164; a point at 138 has p = 0.031: flagged alone, not among three points
    reference, repeat = _run(164, set()), _run(164, set(range(14)), "ar-noise")
    point, same = _run(164, set(range(26))), _run(164, set(range(14)))
    assert assess_lossless(reference, repeat, {"p": point})["points"]["p"]["below_floor"] is True
    three = assess_lossless(reference, repeat, {"p": point, "q": same, "r": same})["points"]
    assert three["p"]["below_floor"] is False and three["p"]["p_below_floor"] == pytest.approx(0.0312, abs=1e-3)


@pytest.mark.slow
def test_points_as_reproducible_as_ar_are_rarely_flagged_together() -> None:
    # 20 points whose answers match ar as often as ar matches itself (90%): in at most about 5% of studies is
    # any of them flagged (the family-wise error); a test against the floor's point estimate flagged 8-10% of
    # the points, so most studies had a false flag
    rng = random.Random(4)
    studies, flagged = 300, 0
    for _ in range(studies):
        reference = _run(100, set())
        repeat = _run(100, {i for i in range(100) if rng.random() < 0.1}, "ar-noise")
        points = {f"p{k}": _run(100, {i for i in range(100) if rng.random() < 0.1}) for k in range(20)}
        result = assess_lossless(reference, repeat, points)["points"]
        flagged += any(m["below_floor"] for m in result.values())
    assert flagged / studies <= 0.08, flagged / studies


def test_without_a_repeat_nothing_is_flagged() -> None:
    """No ar-vs-ar measurement: rates are reported, the floor is unknown and no point is flagged."""
    result = assess_lossless(_run(20, set()), None, {"p": _run(20, set(range(20)))})
    assert result["floor"] is None
    assert result["points"]["p"]["exact_match_rate"] == 0.0
    assert result["points"]["p"]["below_floor"] is None


def test_the_wilson_interval_is_scipys_wilson_interval() -> None:
    from scipy import stats

    for trials in (1, 2, 7, 40, 164, 1000):
        for successes in sorted({0, 1, trials // 3, trials // 2, trials - 1, trials}):
            for level in (0.8, 0.95, 0.99):
                expected = stats.binomtest(successes, trials).proportion_ci(confidence_level=level, method="wilson")
                low, high = wilson_interval(successes, trials, level)
                assert abs(low - expected.low) < 1e-12 and abs(high - expected.high) < 1e-12, (successes, trials)
    assert wilson_interval(0, 0) == (0.0, 1.0)
