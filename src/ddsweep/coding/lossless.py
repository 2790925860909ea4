"""Losslessness check: does a speculative point produce exactly the autoregressive point's greedy outputs?

The text compared per problem is the reasoning field (empty when absent), a separator line, then the
response. Tokens for `first_diff_token` are a simple split, not the model's tokenizer: maximal runs of word
characters (letters, digits, underscore) and every other non-space character on its own; whitespace only
separates tokens. Problems missing from either list, or whose request failed in either, are not compared.

Greedy decoding is not bit-reproducible at high concurrency or with tensor/expert parallelism, so the `ar`
point asks every problem twice (coding/problems_repeat.jsonl); `assess_lossless` reports each point's
exact-match rate next to that ar-vs-ar floor and flags only rates below it with confidence: Fisher's exact test,
one-sided, with the family-wise error over the points held at 1 − the study's confidence (Bonferroni).
"""

from __future__ import annotations

import math
import re
from statistics import NormalDist

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


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion at `level` (0, 1 when there are no trials), without continuity
    correction (Newcombe 1998), as SciPy's `binomtest(...).proportion_ci(method="wilson")` gives it; computed
    here with the standard library's normal quantile, because importing `scipy.stats` costs more CPU than the
    rest of a summary's coding figures."""
    if trials == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + 0.5 * level)
    p = successes / trials
    denominator = 2 * (trials + z * z)
    center = (2 * trials * p + z * z) / denominator
    half = z / denominator * math.sqrt(4 * trials * p * (1 - p) + z * z)
    return (0.0 if successes == 0 else center - half), (1.0 if successes == trials else center + half)


def p_below_floor(matched: int, compared: int, floor_matched: int, floor_compared: int) -> float:
    """One-sided p-value of Fisher's exact test that a point's rate of answers identical to ar's is below the
    floor's: the hypergeometric probability of `matched` or fewer identical answers among the point's
    `compared`, given both comparisons' identical answers in all (SciPy's `fisher_exact(..., "less")`)."""
    total, hits = compared + floor_compared, matched + floor_matched
    ways = sum(math.comb(hits, k) * math.comb(total - hits, compared - k)
               for k in range(max(0, compared - (total - hits)), matched + 1))
    return min(1.0, ways / math.comb(total, compared))


def assess_lossless(reference: list[dict], reference_repeat: list[dict] | None,
                    candidates: dict[str, list[dict]], level: float = 0.95) -> dict:
    """Every point's exact-match rate against `ar`, next to the ar-vs-ar floor (the rate at which two `ar`
    runs agree with each other). A point is flagged only when its rate is below the floor with confidence:
    Fisher's exact one-sided test rejects at (1 − level) / m, m the points compared (Bonferroni: at most a
    1 − level chance that any point is flagged when none differs from the floor). Without a repeat there is no
    floor and nothing is flagged (a mismatch rate alone means nothing when `ar` itself is not reproducible)."""
    floor = compare_outputs(reference, reference_repeat) if reference_repeat is not None else None
    floor_rate = floor["exact_match_rate"] if floor else None
    matches = {point_id: compare_outputs(reference, records) for point_id, records in candidates.items()}
    tested = max(1, sum(bool(m["compared"]) for m in matches.values()))
    points = {}
    for point_id, match in matches.items():
        low, high = wilson_interval(match["exact_match"], match["compared"], level)
        p_value = (None if floor_rate is None or not match["compared"] else
                   p_below_floor(match["exact_match"], match["compared"], floor["exact_match"], floor["compared"]))
        points[point_id] = {
            **match,
            "ci_low": low,
            "ci_high": high,
            "floor_rate": floor_rate,
            "p_below_floor": p_value,
            "below_floor": None if p_value is None else p_value <= (1 - level) / tested,
        }
    return {
        "floor": None if floor is None else {k: floor[k] for k in ("compared", "exact_match", "exact_match_rate")},
        "floor_mismatches": [] if floor is None else floor["mismatches"],
        "points": points,
    }
