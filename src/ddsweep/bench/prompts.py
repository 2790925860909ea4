"""Benchmark prompts: realistic, varied text of a requested token length, built from a shipped corpus.

Filler or repeated text inflates speculative acceptance, so every prompt is a distinct window of real prose
(Python standard-library docstrings, see data/CORPUS-LICENSE.txt), trimmed to the target length as counted
by the server's tokenizer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from importlib import resources

CountFn = Callable[[str], int]
MAX_ROUNDS = 6


@functools.lru_cache(maxsize=1)
def load_corpus() -> str:
    """The shipped corpus, paragraphs separated by blank lines."""
    return resources.files("ddsweep.bench").joinpath("data/corpus.txt").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _sentence_starts() -> tuple[int, ...]:
    """Offsets of sentence beginnings in the corpus: the possible prompt starts."""
    text = load_corpus()
    starts = [0]
    for i in range(1, len(text) - 1):
        if text[i - 1] in ".!?\n" and text[i] in " \n" and text[i + 1].isupper():
            starts.append(i + 1)
    return tuple(starts)


def start_offset(sequence: int, seed: int = 0) -> int:
    """Corpus offset of prompt number `sequence`: distinct sentence starts for distinct sequence numbers."""
    starts = _sentence_starts()
    n = len(starts)
    stride = _coprime_stride(n)
    return starts[(seed * 7919 + sequence * stride) % n]


def _coprime_stride(n: int) -> int:
    stride = max(1, int(n * 0.6180339887))
    while math.gcd(stride, n) != 1:
        stride += 1
    return stride


def _window(offset: int, chars: int) -> str:
    text = load_corpus()
    out = text[offset:offset + chars]
    while len(out) < chars:
        out += "\n\n" + text[: chars - len(out)]
    return out.strip()


def _trim_to_word(text: str) -> str:
    cut = text.rfind(" ")
    return text[:cut] if cut > len(text) // 2 else text


def build_prompt(target_tokens: int, sequence: int, count: CountFn, seed: int = 0, tolerance: float = 0.02) -> str:
    """Prompt number `sequence` with about `target_tokens` tokens as `count` (the server's tokenizer) counts them."""
    if target_tokens <= 0:
        raise ValueError(f"target_tokens must be positive, got {target_tokens}")
    offset = start_offset(sequence, seed)
    chars = max(16, target_tokens * 4)
    best, best_err = "", math.inf
    for _ in range(MAX_ROUNDS):
        text = _trim_to_word(_window(offset, chars))
        n = max(1, count(text))
        err = abs(n - target_tokens) / target_tokens
        if err < best_err:
            best, best_err = text, err
        if err <= tolerance:
            break
        chars = max(16, int(len(text) * target_tokens / n) + 1)
    return best
