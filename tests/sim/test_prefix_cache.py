"""The stand-in's prefix cache and tokenizer: the cached prefix found by bisection is the longest one seen."""

from __future__ import annotations

import random

from ddsweep.sim import tokenizer
from ddsweep.sim.cache import PrefixCache


def _longest_seen(seen: list[list[int]], ids: list[int]) -> int:
    """The longest common prefix of `ids` with a prompt seen before, by comparison."""
    best = 0
    for other in seen:
        n = 0
        while n < min(len(other), len(ids)) and other[n] == ids[n]:
            n += 1
        best = max(best, n)
    return best


def test_the_cached_prefix_is_the_longest_prefix_seen_before_less_one_token_to_compute() -> None:
    rng = random.Random(3)
    words = ["alpha", " beta", " gamma", " delta", "(", ")", "\n", " x"]
    stems = ["".join(rng.choices(words, k=rng.randint(0, 30))) for _ in range(6)]
    cache, seen = PrefixCache(), []
    for _ in range(200):
        prompt = rng.choice(stems) + "".join(rng.choices(words, k=rng.randint(0, 20)))
        ids = tokenizer.token_ids(prompt)
        expected = min(_longest_seen(seen, ids), max(0, len(ids) - 1))
        assert cache.lookup(prompt) == expected, prompt
        seen.append(ids)


def test_token_ids_are_a_fresh_list_each_time() -> None:
    ids = tokenizer.token_ids("def f(x): return x")
    ids.append(-1)
    assert tokenizer.token_ids("def f(x): return x") == ids[:-1]
