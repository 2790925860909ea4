"""Benchmark prompts: length on target, distinct across requests, no long repeated passages."""

from __future__ import annotations

from ddsweep.bench import padding, prompts
from ddsweep.sim import tokenizer


def test_lengths_within_tolerance() -> None:
    for target in (64, 128, 1024, 4096):
        text = prompts.build_prompt(target, sequence=target, count=tokenizer.count)
        assert abs(tokenizer.count(text) - target) <= max(2, 0.03 * target), target


def test_prompts_differ_and_are_deterministic() -> None:
    texts = [prompts.build_prompt(128, sequence=i, count=tokenizer.count) for i in range(50)]
    assert len(set(texts)) == 50
    assert len({t[:60] for t in texts}) == 50  # different starts: no shared prefix for a prefix cache
    assert prompts.build_prompt(128, sequence=3, count=tokenizer.count) == texts[3]
    assert prompts.build_prompt(128, sequence=3, count=tokenizer.count, seed=1) != texts[3]


def test_no_long_repeated_substrings() -> None:
    text = prompts.build_prompt(4096, sequence=7, count=tokenizer.count)
    window = 200
    seen: set[str] = set()
    for i in range(0, len(text) - window, 7):
        piece = text[i:i + window]
        assert piece not in seen
        seen.add(piece)


def test_corpus_is_prose_of_useful_size() -> None:
    corpus = prompts.load_corpus()
    assert 200_000 < len(corpus) < 500_000
    words = corpus.split()
    assert len(set(words)) > 10_000


def test_padding_drops_blocks_with_an_excluded_text_until_none_occurs_even_across_new_neighbours() -> None:
    blocks = ["import os", "def a():\n    return 1", "x = 'SECRET'", "y = 2", "z = 3"]
    # Dropping the block with SECRET makes `return 1` and `y = 2` neighbours: the second needle appears only then.
    needles = ["SECRET", "return 1\n\n\ny = 2"]
    assert padding.without_blocks_containing(blocks, needles) == "import os\n\n\nz = 3"
    assert padding.without_blocks_containing(blocks, []) == "\n\n\n".join(blocks)
    assert padding.without_blocks_containing(["a SECRET", "b"], ["SECRET"]) == "b"
