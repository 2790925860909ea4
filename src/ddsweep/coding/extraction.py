"""Code extraction from a model's answer: strip the thinking section, then take the final answer's code.

Rules, in order:
1. Normalise line endings; remove every ``<think>…</think>`` section; an end tag without a start tag means
   everything before it was thinking; an unclosed ``<think>`` means everything after it is thinking.
   A server's separate reasoning field is never an input here. An answer cut at the token limit (finish
   reason ``length``) whose thinking was never closed is not an answer at all: when the server does not
   separate reasoning and the text has no ``</think>``, the chat template may have opened ``<think>`` itself,
   so the whole text may be unfinished thinking; it is never executed.
2. Fenced blocks (```` ``` ```` or ``~~~``, any tag; an unclosed fence runs to the end of the text). Python-tagged
   and untagged blocks are preferred over blocks tagged with another language.
3. The last block that defines the entry point at top level and parses; else the last block that defines it.
4. Else the last block that, indented under the prompt's signature, parses: an answer that gave only the body.
5. Without any fence: the ``def <entry point>(`` in the text with its imports and its indented body; else the
   whole text as a body when that parses.
The prompt's preamble (imports and helper functions before the entry point) is prepended to a full function
and the prompt itself to a body, so answers that omit ``from typing import List`` still run.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

from ddsweep.coding.humaneval import Problem

PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3", "pycon", "ipython", "python2"})
_FENCE_OPEN = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<tag>[^\s`]*)[^\n`]*$")
_CLOSED_THINK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.S | re.I)
_END_THINK = re.compile(r"</think(?:ing)?>", re.I)
_START_THINK = re.compile(r"<think(?:ing)?>", re.I)
_TOP_LEVEL_CODE = re.compile(r"^(?:import |from |def |async def |class |@|if __name__|[A-Za-z_]\w* *=)")


@dataclass
class Block:
    """A fenced block of the final answer: its language tag, its text and whether it was closed."""

    tag: str
    text: str
    closed: bool

    @property
    def is_python(self) -> bool:
        """True for Python-tagged and untagged blocks."""
        return self.tag.lower() in PYTHON_TAGS


@dataclass
class Extraction:
    """The code taken from an answer (None when none was found) and how it was found."""

    code: str | None
    source: str
    reason: str | None = None


def normalise_newlines(text: str) -> str:
    """Convert CRLF and lone CR line endings to LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_thinking(text: str) -> str:
    """Return the final answer: the text without any thinking section (closed, end-only or unclosed)."""
    text = _CLOSED_THINK.sub("", normalise_newlines(text))
    ends = list(_END_THINK.finditer(text))
    if ends:
        text = text[ends[-1].end() :]
    start = _START_THINK.search(text)
    if start:
        text = text[: start.start()]
    return text


def fenced_blocks(text: str) -> list[Block]:
    """Every fenced block in `text` in order; an unclosed fence runs to the end of the text."""
    blocks: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        fence, tag = match.group("fence"), match.group("tag")
        body: list[str] = []
        closed = False
        i += 1
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if stripped.startswith(fence[0] * 3) and stripped.strip(fence[0]) == "":
                closed = True
                break
            if line.rstrip().endswith(fence) and stripped != fence:
                body.append(line.rstrip()[: -len(fence)])
                closed = True
                break
            body.append(line)
            i += 1
        blocks.append(Block(tag=tag, text="\n".join(body), closed=closed))
        i += 1
    return blocks


def _parses(code: str) -> bool:
    """True when `code` is syntactically valid Python."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def defines_entry_point(code: str, entry_point: str) -> bool:
    """True when `code` defines `entry_point` at top level (by the AST, or by a regex if it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        pattern = rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\("
        return re.search(pattern, code, re.M) is not None
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point for node in tree.body
    )


def as_body(problem: Problem, text: str) -> str | None:
    """The prompt followed by `text` indented as the function body, or None if that does not parse."""
    body = textwrap.dedent(text).strip("\n")
    if not body.strip():
        return None
    program = problem.prompt.rstrip() + "\n" + textwrap.indent(body, "    ") + "\n"
    return program if _parses(program) else None


def _with_preamble(problem: Problem, code: str) -> str:
    """Prepend the prompt's preamble (imports, helpers) to a full function."""
    return problem.signature_prefix + textwrap.dedent(code).strip("\n") + "\n"


def _unfenced_function(text: str, entry_point: str) -> str | None:
    """Cut the entry point's definition (with the imports and code around it) out of unfenced text."""
    lines = text.split("\n")
    pattern = re.compile(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(")
    starts = [i for i, line in enumerate(lines) if pattern.match(line)]
    if not starts:
        return None
    first = last = starts[-1]
    while first > 0 and (not lines[first - 1].strip() or _TOP_LEVEL_CODE.match(lines[first - 1])):
        first -= 1
    while last + 1 < len(lines):
        line = lines[last + 1]
        if line.strip() and not line[0].isspace() and not _TOP_LEVEL_CODE.match(line):
            break
        last += 1
    chunk = lines[first : last + 1]
    while len(chunk) > 1 and not _parses("\n".join(chunk)):
        chunk.pop()
    return "\n".join(chunk).strip("\n")


def unclosed_thinking(response: str, finish_reason: str | None, reasoning_separated: bool) -> bool:
    """True when a `length` finish may have cut the answer inside a thinking block that was never closed."""
    if finish_reason != "length":
        return False
    text = normalise_newlines(response)
    opened = _START_THINK.search(_CLOSED_THINK.sub("", text)) is not None
    return opened or (not reasoning_separated and _END_THINK.search(text) is None)


def extract_code(
    response: str | None, problem: Problem, finish_reason: str | None = None, reasoning_separated: bool = False
) -> Extraction:
    """Extract the program to test from a model's final answer (see the module docstring for the rules)."""
    if unclosed_thinking(response or "", finish_reason, reasoning_separated):
        return Extraction(code=None, source="none", reason="the response hit the token limit inside a thinking "
                          "block that was never closed (no </think>); truncated thinking is never executed")
    answer = strip_thinking(response or "")
    if not answer.strip():
        return Extraction(code=None, source="none", reason="the answer is empty once thinking is removed")
    entry = problem.entry_point
    blocks = fenced_blocks(answer)
    ordered = [b for b in reversed(blocks) if b.is_python] + [b for b in reversed(blocks) if not b.is_python]
    defining = [b for b in ordered if defines_entry_point(textwrap.dedent(b.text), entry)]
    if defining:
        chosen = next((b for b in defining if _parses(textwrap.dedent(b.text))), defining[0])
        return Extraction(code=_with_preamble(problem, chosen.text), source="fenced")
    for block in ordered:
        program = as_body(problem, block.text)
        if program is not None:
            return Extraction(code=program, source="fenced-body")
    if blocks:
        return Extraction(code=None, source="none", reason=f"no fenced block defines {entry}() or parses")
    function = _unfenced_function(answer, entry)
    if function is not None:
        return Extraction(code=_with_preamble(problem, function), source="unfenced")
    program = as_body(problem, answer)
    if program is not None:
        return Extraction(code=program, source="unfenced-body")
    return Extraction(code=None, source="none", reason=f"the answer has no code defining {entry}()")
