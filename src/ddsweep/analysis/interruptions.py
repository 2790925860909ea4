"""A point's interrupted attempts: the earlier attempts of its jobs that never finished (a lost machine, a signal,
a time limit), as the point's and its launches' done.json record them (`interrupted_attempts`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def interrupted_attempts(directory: Path) -> list[dict[str, Any]]:
    """The interrupted attempts recorded in the done.json of a point and of its launches (results/launches/<id>/)."""
    found: list[dict[str, Any]] = []
    launches = directory.parent.parent / "launches" / directory.name
    for path in [directory / "done.json", *sorted(launches.glob("launch-*/done.json"))]:
        try:
            done = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(done, dict) and isinstance(done.get("interrupted_attempts"), list):
            found += [a for a in done["interrupted_attempts"] if isinstance(a, dict)]
    return found
