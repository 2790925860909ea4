"""A small deterministic tokenizer shared by the stand-in server and the prompt builder."""

from __future__ import annotations

import re
import zlib

# A token is optional leading whitespace plus either up to 6 word characters or one other character.
TOKEN_RE = re.compile(r"\s*(?:\w{1,6}|[^\w\s])")
VOCAB_SIZE = 151_000


def pieces(text: str) -> list[str]:
    """Split `text` into token pieces whose concatenation is `text` (trailing whitespace joins the last)."""
    found = TOKEN_RE.findall(text)
    joined = sum(len(p) for p in found)
    if joined != len(text):
        if found:
            found[-1] += text[joined:]
        else:
            found = [text] if text else []
    return found


def count(text: str) -> int:
    """Number of tokens in `text`."""
    return len(TOKEN_RE.findall(text))


def token_ids(text: str) -> list[int]:
    """Deterministic token ids for `text` (a stable hash of each piece)."""
    return [zlib.crc32(p.encode("utf-8")) % VOCAB_SIZE for p in TOKEN_RE.findall(text)]
