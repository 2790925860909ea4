"""Realistic model answers to HumanEval prompts for the stand-in server (`ddsweep sim-server`).

An answer has a thinking section holding a deliberately wrong draft (so an extractor that reads the thinking
fails), then prose and a ```python block with the full canonical function. Deterministically by seed and task
id, about 10% of problems get a wrong final solution and about 4% a very long thinking section, so a small
max_tokens truncates them.
"""

from __future__ import annotations

import functools
import hashlib

from ddsweep.coding.humaneval import Problem, load_problems

WRONG_SHARE = 10
LONG_THINKING_SHARE = 4
LONG_THINKING_PARAGRAPHS = 120


@functools.lru_cache(maxsize=1)
def _signatures() -> tuple[tuple[str, Problem], ...]:
    """(signature line, problem) pairs used to recognise a HumanEval prompt in a message."""
    pairs = []
    for problem in load_problems():
        marker = f"def {problem.entry_point}("
        start = problem.prompt.find(marker)
        end = problem.prompt.find("\n", start)
        pairs.append((problem.prompt[start:end].strip(), problem))
    return tuple(pairs)


def find_problem(text: str) -> Problem | None:
    """The HumanEval problem whose signature and prompt body appear in `text`, if any."""
    for signature, problem in _signatures():
        if signature in text and problem.prompt.strip()[-200:] in text:
            return problem
    return None


def _bucket(seed: int, task_id: str) -> int:
    """A stable number in 0..99 for (seed, task id)."""
    return int(hashlib.sha256(f"{seed}:{task_id}".encode()).hexdigest(), 16) % 100


def _wrong_function(problem: Problem, body: str) -> str:
    """The prompt's function with `body` instead of the canonical solution."""
    return problem.prompt + body


def simulated_answer(messages: list[dict], seed: int) -> str | None:
    """A model-like answer to the HumanEval prompt in the last user message, or None if there is none."""
    user = [m for m in messages if m.get("role") == "user"]
    content = user[-1].get("content") if user else None
    if not isinstance(content, str):
        return None
    problem = find_problem(content)
    if problem is None:
        return None
    bucket = _bucket(seed, problem.task_id)
    wrong = bucket < WRONG_SHARE
    long_thinking = WRONG_SHARE <= bucket < WRONG_SHARE + LONG_THINKING_SHARE
    draft = _wrong_function(problem, "    return None\n")
    thinking = [
        f"The task is to implement `{problem.entry_point}`. Let me read the docstring and the examples.",
        f"A first draft:\n\n```python\n{draft.strip()}\n```\n\nNo, that ignores the input; it cannot be right.",
    ]
    if long_thinking:
        thinking += [
            f"Let me check example {i} against the docstring again, carefully, step by step, before I write "
            f"the final version, because edge cases such as empty inputs and negative numbers matter."
            for i in range(LONG_THINKING_PARAGRAPHS)
        ]
    thinking.append("Now the final version handles every case in the examples.")
    final = _wrong_function(problem, "    return None\n") if wrong else problem.canonical_program()
    return (
        "<think>\n" + "\n\n".join(thinking) + "\n</think>\n\n"
        f"Here is the implementation of `{problem.entry_point}`:\n\n```python\n{final.strip()}\n```\n\n"
        "It follows the docstring and handles the edge cases shown in the examples."
    )
