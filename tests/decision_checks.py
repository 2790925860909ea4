"""Checks of the summary's first screen shared by the synthetic and the demo-study tests."""

from __future__ import annotations

import re
import shlex
from typing import Any

FIRST_SCREEN_LINES = 40


def first_section(markdown: str) -> list[str]:
    """The summary's lines up to the first section after `## Decision` (the first screen)."""
    lines = markdown.splitlines()
    start = lines.index("## Decision")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return lines[:end]


def knob_words(preset: dict[str, Any], knobs: dict[str, Any]) -> list[list[str]]:
    """The words the preset renders for each set knob: `[flag, value]` pairs and `VAR=value` words."""
    out = []
    args = [*preset["args"], *(w for knob, extra in preset.get("args_if_set", {}).items()
                               if knobs.get(knob) is not None for w in extra)]
    for i, word in enumerate(args):
        match = re.fullmatch(r"\{(\w+)\}", str(word))
        if match and match.group(1) in knobs and knobs[match.group(1)] is not None:
            out.append([args[i - 1], str(knobs[match.group(1)])])
    for name, value in preset.get("env", {}).items():
        match = re.fullmatch(r"\{(\w+)\}", str(value))
        if match and knobs.get(match.group(1)) is not None:
            out.append([f"{name}={knobs[match.group(1)]}"])
    return out


def check_first_screen(markdown: str, document: dict[str, Any], presets: dict[str, Any]) -> None:
    """The first section ends within FIRST_SCREEN_LINES lines and names, for each priority, the recommended
    point (and the tied set), its ratio over `ar` with an interval, and a launch command line holding the
    point's knob flags as its preset renders them, without the job's port."""
    screen = first_section(markdown)
    assert len(screen) <= FIRST_SCREEN_LINES, len(screen)
    for entry in document["decision"]["priorities"]:
        pid = entry["recommended"]
        row = next(line for line in screen if line.startswith(f"| {entry['priority']} |"))
        assert f"**`{pid}`**" in row
        if entry["kind"] != "ar":
            # an interval, or (from fewer than 3 launches or repeats) the samples' count and no interval
            assert re.search(r"\d\.\d\d× \((\d+% CI \d\.\d\d–\d\.\d\d|n = \d; more repeats or launches are "
                             r"needed for an interval)\)", row.split(" | ")[3]), row
        if entry["status"] == "tied":
            note = next(line for line in screen if line.startswith(f"- `{entry['priority']}`: a tie"))
            assert f"recommended `{pid}`" in note and "cheapest" in note
            assert all(f"`{t}`" in note for t in entry["tied_set"] if t != pid)
        line = next(line for line in screen if line == entry["launch"]["shell"])
        words = shlex.split(line)
        assert "--port" not in words
        expected = knob_words(presets[entry["preset"]], entry["knobs"])
        assert expected or entry["kind"] == "ar"
        for pair in expected:
            assert any(words[i:i + len(pair)] == pair for i in range(len(words))), (pair, line)
