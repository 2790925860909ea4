"""Code extraction from real-world answer shapes: thinking sections, several blocks, bodies, odd fences."""

from __future__ import annotations

import pytest

from ddsweep.coding.extraction import extract_code, fenced_blocks, strip_thinking
from ddsweep.coding.humaneval import load_problems
from ddsweep.coding.sandbox import Sandbox

PROBLEM = next(p for p in load_problems() if p.task_id == "HumanEval/2")  # truncate_number
SIGNATURE = "def truncate_number(number: float) -> float:"
GOOD = f"{SIGNATURE}\n    return number % 1.0\n"
WRONG = f"{SIGNATURE}\n    return number\n"


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    """One sandbox for the module (the isolation probe runs once)."""
    return Sandbox(timeout_s=10.0)


def fence(code: str, tag: str = "python") -> str:
    """A fenced block with `tag`."""
    return f"```{tag}\n{code}```"


# (name, response, expected: "good" = the correct code is extracted, "wrong" = the wrong code, None = no code)
CASES = [
    ("plain fenced full function", f"Sure:\n\n{fence(GOOD)}\n", "good"),
    ("code only in thinking", f"<think>\n{fence(GOOD)}\n</think>\nThe answer is to take the fraction.", None),
    ("unclosed think: everything is thinking", f"<think>\nLet me try\n{fence(GOOD)}\nhmm", None),
    ("end tag only: text before it is thinking", f"draft:\n{fence(WRONG)}\n</think>\n\n{fence(GOOD)}", "good"),
    ("wrong draft in thinking, right answer", f"<think>{fence(WRONG)}</think>\nFinal:\n{fence(GOOD)}", "good"),
    (
        "several blocks: last defining wins",
        f"{fence(WRONG)}\nBetter:\n{fence(GOOD)}\nUsage:\n{fence('print(1)')}",
        "good",
    ),
    ("no fence at all", f"Here you go.\n\n{GOOD}\nThis returns the decimals.", "good"),
    ("no fence, prose right after the code", f"{GOOD}This works because % 1.0 keeps the fraction.", "good"),
    ("unclosed fence (cut off)", f"Answer:\n```python\n{GOOD}", "good"),
    ("prose after the code block", f"{fence(GOOD)}\n\nExplanation: modulo one keeps the fraction.\n", "good"),
    ("py tag", fence(GOOD, "py"), "good"),
    ("python3 tag", fence(GOOD, "python3"), "good"),
    ("Python tag with capital", fence(GOOD, "Python"), "good"),
    ("untagged fence", fence(GOOD, ""), "good"),
    ("tilde fence", f"~~~python\n{GOOD}~~~", "good"),
    ("CRLF line endings", f"<think>\r\nx\r\n</think>\r\n{fence(GOOD)}".replace("\n", "\r\n"), "good"),
    ("body only, indented", fence("    return number % 1.0\n"), "good"),
    ("body only, not indented", fence("return number % 1.0\n"), "good"),
    ("body only without a fence", "return number % 1.0", "good"),
    (
        "full function with imports and helper",
        fence(f"import math\n\ndef _frac(x):\n    return x - math.floor(x)\n\n{SIGNATURE}\n    return _frac(number)\n"),
        "good",
    ),
    ("closing fence glued to the last line", f"```python\n{GOOD.rstrip()}```\nDone.", "good"),
    ("python block before a bash block", f"{fence(GOOD)}\nRun it:\n{fence('python -m pytest', 'bash')}", "good"),
    ("thinking tag variant <thinking>", f"<thinking>{fence(WRONG)}</thinking>{fence(GOOD)}", "good"),
    ("empty answer", "", None),
    ("prose only", "I am not sure how to solve this problem.", None),
    ("only an unrelated block", fence("print('hello world') ) (", "python"), None),
]


@pytest.mark.parametrize(("name", "response", "expected"), CASES, ids=[c[0] for c in CASES])
def test_extraction_shapes(name: str, response: str, expected: str | None, sandbox: Sandbox) -> None:
    """Each shape yields the intended code (checked by running the tests) or no code at all."""
    extraction = extract_code(response, PROBLEM)
    if expected is None:
        assert extraction.code is None, extraction
        assert extraction.reason
        return
    assert extraction.code is not None, extraction.reason
    result = sandbox.run_problem(PROBLEM, extraction.code)
    assert result.passed is (expected == "good"), (extraction.code, result.error)


def test_thinking_code_is_never_taken_even_if_answer_is_prose() -> None:
    """A correct function inside the thinking section with a prose-only answer is no_code."""
    response = f"<think>\nI will write:\n{GOOD}\n</think>\nThe function takes the fractional part."
    assert extract_code(response, PROBLEM).code is None


@pytest.mark.parametrize(
    ("response", "finish", "separated", "runs"),
    [
        (f"I think the answer is\n{fence(GOOD)}\nbut let me check", "length", False, False),
        (f"<think>draft\n{fence(GOOD)}\nstill thinking", "length", True, False),
        (f"thought</think>\n{fence(GOOD)}\nAnd more", "length", False, True),
        (f"{fence(GOOD)}\nprose cut at the limit", "length", True, True),
        (f"I think the answer is\n{fence(GOOD)}", "stop", False, True),
    ],
    ids=["template-opened-think-cut", "unclosed-tag-cut", "closed-then-cut", "separated-reasoning-cut", "stop"],
)
def test_length_finish_inside_thinking_is_never_executed(response: str, finish: str, separated: bool,
                                                         runs: bool) -> None:
    """A `length` finish without a closed thinking block yields no code, even when a draft there would pass."""
    extraction = extract_code(response, PROBLEM, finish_reason=finish, reasoning_separated=separated)
    assert (extraction.code is not None) is runs, extraction
    if not runs:
        assert "never closed" in extraction.reason


def test_strip_thinking_variants() -> None:
    """Closed, unclosed and end-only thinking sections are all removed."""
    assert strip_thinking("<think>a</think>b<think>c</think>d") == "bd"
    assert strip_thinking("answer<think>never closed") == "answer"
    assert strip_thinking("thought</think>answer") == "answer"
    assert strip_thinking("a\r\nb") == "a\nb"


def test_fenced_blocks_reports_unclosed_and_tags() -> None:
    """Block parsing keeps tags and marks an unclosed final fence."""
    blocks = fenced_blocks("```py\nx = 1\n```\ntext\n```python3\ny = 2")
    assert [(b.tag, b.text, b.closed) for b in blocks] == [("py", "x = 1", True), ("python3", "y = 2", False)]


def test_preamble_is_prepended_for_missing_imports() -> None:
    """An answer that omits the prompt's `from typing import List` still gets it."""
    problem = load_problems()[0]
    code = "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n    return False\n"
    extraction = extract_code(fence(code), problem)
    assert extraction.code is not None
    assert extraction.code.startswith("from typing import List")


def test_prompt_helpers_are_available_to_a_body() -> None:
    """A body answer for a prompt with helper functions (HumanEval/10) keeps the helpers."""
    problem = next(p for p in load_problems() if p.task_id == "HumanEval/10")
    extraction = extract_code(fence(problem.canonical_solution), problem)
    assert extraction.code is not None and "def is_palindrome" in extraction.code
    assert extraction.source == "fenced-body"
