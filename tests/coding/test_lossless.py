"""Exact-match comparison of a point's coding answers with the autoregressive reference."""

from __future__ import annotations

from ddsweep.coding.lossless import compare_outputs, first_difference, simple_tokens


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
