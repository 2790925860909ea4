"""Which point directories a summary reads: exactly this study's points, with everything else named as ignored.

A grid study's points are its configured points; an adaptive study's are the points its selection and
confirmation produced (the workflow passes their done.json files). Any other directory under results/points/
(an older grid, an earlier adaptive setting) is left out and listed in a caveat, so that it cannot enter a
decision unnoticed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddsweep.config.study import configured_point_ids

MAX_NAMED = 20


def study_point_ids(config: Mapping[str, Any] | None, done_files: Sequence[Path] | None) -> list[str] | None:
    """The ids of this study's points: the directories of the given done.json files when the workflow names them,
    else the configured points of a full grid configuration, else None (every point found)."""
    if done_files:
        return [Path(f).parent.name for f in done_files]
    return configured_point_ids(config)


def ignored_caveat(ignored: Sequence[str]) -> dict[str, Any] | None:
    """The caveat block naming point directories the summary left out (None when there are none)."""
    if not ignored:
        return None
    named = ", ".join(f"`{name}`" for name in ignored[:MAX_NAMED])
    more = f" and {len(ignored) - MAX_NAMED} more" if len(ignored) > MAX_NAMED else ""
    return {"kind": "ignored_points", "title": "Results in results/points/ that are not this study's", "text": (
        f"{len(ignored)} point director{'y' if len(ignored) == 1 else 'ies'} under results/points/ "
        f"{'is' if len(ignored) == 1 else 'are'} not among this study's points (its configured grid, or the points "
        f"an adaptive study's selection and confirmation produced) and {'was' if len(ignored) == 1 else 'were'} "
        f"ignored: {named}{more}. They come from earlier runs with other settings; delete them or run that "
        "configuration to use them.")}
