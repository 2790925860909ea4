"""The study configuration as a user's file reads it, with the preset library merged in (config/presets/)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ddsweep.config.presets import with_library

ROOT = Path(__file__).resolve().parents[1]


def study_yaml() -> dict:
    """config/config.yaml as parsed YAML, its engine.presets completed from the library (not yet validated)."""
    return with_library(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
