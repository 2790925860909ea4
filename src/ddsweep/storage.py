"""Atomic writes for result files: a file that exists is always complete."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def default_file_mode() -> int:
    """The mode a newly created file gets under the process umask (0666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` via a temporary file in the same directory and an atomic rename.

    The file gets the usual permissions (0666 less the umask), not mkstemp's private 0600, so results on a
    shared file system stay readable by the team."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """Serialise `data` as indented JSON and write it atomically."""
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read one JSON document."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_jsonl_atomic(path: str | os.PathLike, records: list[dict]) -> Path:
    """Write records as JSON Lines atomically."""
    return write_text_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in records))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read JSON Lines, skipping blank lines."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
