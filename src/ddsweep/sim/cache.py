"""The stand-in's prefix cache: which prompt tokens SGLang's radix cache would serve from memory."""

from __future__ import annotations

from ddsweep.sim import tokenizer

PREFIX_CACHE_ENTRIES = 4_000_000


class PrefixCache:
    """Every token prefix of the prompts seen, by a hash chained over their tokens; forgotten all at once past
    a size, as an eviction would."""

    def __init__(self) -> None:
        """Start empty."""
        self._prefixes: set[int] = set()

    def lookup(self, prompt: str) -> int:
        """Tokens of `prompt` found in the cache (its longest prefix seen before, leaving at least one token to
        compute, as SGLang does), remembering every prefix of it."""
        hashes, h = [], 0
        for token in tokenizer.token_ids(prompt):
            h = hash((h, token))
            hashes.append(h)
        # Every prefix of a prompt is remembered with it, so the cached prefixes of this one are its first `hit`.
        low, high = 0, len(hashes)
        while low < high:
            middle = (low + high + 1) // 2
            if hashes[middle - 1] in self._prefixes:
                low = middle
            else:
                high = middle - 1
        hit = low
        if len(self._prefixes) > PREFIX_CACHE_ENTRIES:
            self._prefixes.clear()
        self._prefixes.update(hashes)
        return min(hit, max(0, len(hashes) - 1))
