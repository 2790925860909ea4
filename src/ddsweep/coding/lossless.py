"""Losslessness check: does a speculative point produce exactly the autoregressive point's greedy outputs?

The text compared per problem is the reasoning field (empty when absent), a separator line, then the
response. Tokens for `first_diff_token` are a simple split, not the model's tokenizer: maximal runs of word
characters (letters, digits, underscore) and every other non-space character on its own; whitespace only
separates tokens. Problems missing from either list, or whose request failed in either, are not compared.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\w+|[^\w\s]")
_SEPARATOR = "\n<<<response>>>\n"


def comparable_text(record: dict) -> str:
    """The reasoning and the response of a problems.jsonl record as one string."""
    return (record.get("reasoning") or "") + _SEPARATOR + (record.get("response") or "")


def simple_tokens(text: str) -> list[str]:
    """Split text into word runs and single punctuation characters (whitespace dropped)."""
    return _TOKEN.findall(text)


def first_difference(a: list | str, b: list | str) -> int | None:
    """Index of the first position where the sequences differ (the shorter length if one is a prefix)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(reference: list[dict], candidate: list[dict]) -> dict:
    """Compare the candidate point's answers with the reference (autoregressive) point's, task by task."""
    candidates = {r["task_id"]: r for r in candidate}
    compared = 0
    exact = 0
    mismatches = []
    for ref in reference:
        cand = candidates.get(ref["task_id"])
        if cand is None or "request" in (ref.get("error_kind"), cand.get("error_kind")):
            continue
        compared += 1
        ref_text, cand_text = comparable_text(ref), comparable_text(cand)
        if ref_text == cand_text:
            exact += 1
            continue
        mismatches.append(
            {
                "task_id": ref["task_id"],
                "first_diff_char": first_difference(ref_text, cand_text),
                "first_diff_token": first_difference(simple_tokens(ref_text), simple_tokens(cand_text)),
            }
        )
    return {
        "compared": compared,
        "exact_match": exact,
        "exact_match_rate": exact / compared if compared else None,
        "mismatches": mismatches,
    }
