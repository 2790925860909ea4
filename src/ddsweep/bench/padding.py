"""The text benchmark prompts are grown with, and the offsets a prompt's padding may start at.

Coding prompts are grown with Python source that ships with the interpreter (the standard library's top-level
modules, in name order), never with benchmark solutions: a block of code (the text between two blank lines) that
contains any excluded text verbatim, or that appeared before, is left out, so the padding holds no answer and no
text twice. A prompt's padding is one window of this text, never wrapped around its end.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import sysconfig
from collections.abc import Sequence
from pathlib import Path

BLOCK_SEPARATOR = "\n\n\n"
_TOP_LEVEL_LINE = re.compile(r"^(?=[A-Za-z_@#])", re.MULTILINE)
_SENTENCE_START = re.compile(r"(?<=[.!?\n])[ \n]+(?=[A-Z])")


def stdlib_sources() -> list[Path]:
    """The standard library's top-level modules (the running interpreter's), in name order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if p.is_file())


@functools.lru_cache(maxsize=4)
def code_padding(exclude: tuple[str, ...]) -> str:
    """Standard-library source without any block that contains one of `exclude` (stripped, non-empty texts) or that
    appeared before; blocks are joined by two blank lines."""
    seen: set[str] = set()
    blocks: list[str] = []
    for path in stdlib_sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        for block in text.split(BLOCK_SEPARATOR):
            block = block.strip("\n")
            if block.strip() and block not in seen:
                seen.add(block)
                blocks.append(block)
    return without_blocks_containing(blocks, sorted({e.strip() for e in exclude if e.strip()}))


def without_blocks_containing(blocks: Sequence[str], needles: Sequence[str]) -> str:
    """`blocks` joined by BLOCK_SEPARATOR, less every block where a needle (no leading or trailing whitespace)
    starts or ends, until none occurs.

    Dropping blocks makes neighbours of blocks that were not: only text across such a new junction can hold a new
    occurrence (any other text was there before), so the passes after the first search only around those.
    """
    longest = max((len(n) for n in needles), default=0)
    new_neighbours: list[int] | None = None  # blocks whose left neighbour is new; None: search the whole text
    while True:
        joined = BLOCK_SEPARATOR.join(blocks)
        starts = list(itertools.accumulate((len(b) + len(BLOCK_SEPARATOR) for b in blocks[:-1]), initial=0))
        regions = [(0, len(joined))] if new_neighbours is None else [
            (max(0, starts[n] - len(BLOCK_SEPARATOR) - longest), starts[n] + longest) for n in new_neighbours]
        drop = _blocks_containing(joined, starts, needles, regions)
        if not drop:
            return joined
        kept = [i for i in range(len(blocks)) if i not in drop]
        blocks = [blocks[i] for i in kept]
        new_neighbours = [n for n in range(1, len(kept)) if kept[n] != kept[n - 1] + 1]


def _blocks_containing(joined: str, starts: Sequence[int], needles: Sequence[str],
                       regions: Sequence[tuple[int, int]]) -> set[int]:
    """Indices of the blocks (starting at `starts` in `joined`) where a needle occurring within one of `regions`
    starts or ends (a needle across a block boundary marks the blocks it starts and ends in)."""
    drop: set[int] = set()
    for low, high in regions:
        for needle in needles:
            at = joined.find(needle, low, high)
            while at >= 0:
                drop.add(bisect.bisect_right(starts, at) - 1)
                drop.add(bisect.bisect_right(starts, at + len(needle) - 1) - 1)
                at = joined.find(needle, at + 1, high)
    return drop


@functools.lru_cache(maxsize=4)
def start_offsets(text: str, kind: str) -> tuple[int, ...]:
    """Where a padding window may start: top-level statements for code, sentence beginnings for prose."""
    if kind == "coding":
        return tuple(m.start() for m in _TOP_LEVEL_LINE.finditer(text))
    return (0, *(m.end() for m in _SENTENCE_START.finditer(text)))
