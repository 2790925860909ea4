"""Which knobs a preset's `verify` checks can see, and which swept knobs no check verifies.

A check verifies a knob when its template names the knob's placeholder (`"{budget}"` in `verify.server_args`,
a `log_patterns` regex or a `launch_command` fragment). DDTree's topk travels in the environment variable
`SGLANG_DDTREE_MAX_TOPK` (PR #29907), which `/server_info` does not show: without a log pattern it is unverified.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

KNOB_NAMES = ("budget", "topk", "block_size", "window")


def verified_knobs(preset: Mapping[str, Any]) -> set[str]:
    """The knobs some check of the preset's `verify` reads."""
    verify = preset.get("verify") or {}
    templates = [*(verify.get("server_args") or {}).values(), *(verify.get("log_patterns") or []),
                 *(verify.get("launch_command") or [])]
    named = {m for t in templates if isinstance(t, str) for m in re.findall(r"\{(\w+)\}", t)}
    return named & set(KNOB_NAMES)


def unverified_knobs(preset: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs a point sets that no check of its preset verifies."""
    checked = verified_knobs(preset)
    return {k: knobs.get(k) for k in KNOB_NAMES if knobs.get(k) is not None and k not in checked}


def unverified_sweep_warnings(presets: Mapping[str, Mapping[str, Any]], points: Iterable[Any]) -> list[str]:
    """One warning per (preset, knob) that takes more than one value in the sweep but no check verifies."""
    values: dict[tuple[str, str], set[Any]] = {}
    for point in points:
        for knob, value in unverified_knobs(presets[point.preset], point.knobs).items():
            values.setdefault((point.preset, knob), set()).add(value)
    return [f"warning: engine.presets.{preset}: swept knob {knob!r} ({len(seen)} values) is not verified by any "
            f"check of verify (server_args, log_patterns, launch_command); its points will report it as "
            f"unverified" for (preset, knob), seen in sorted(values.items()) if len(seen) > 1]
