"""Defaults come from one place, the JSON schema: `schema_default("benchmark.warmup_requests")` reads one.

Dataclasses and command-line options of later stages take their defaults from here, so a default changed in
workflow/schemas/config.schema.yaml changes everywhere."""

from __future__ import annotations

import copy
import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml


def schema_path() -> Path:
    """The JSON schema the configuration is validated against (also linked from workflow/schemas/)."""
    return Path(str(resources.files("ddsweep.config") / "schemas" / "config.schema.yaml"))


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    """The parsed schema, read once per process (every command reads it: with libyaml where PyYAML has it, 3 ms
    instead of 30)."""
    return yaml.load(schema_path().read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema() -> dict:
    """A fresh copy of the parsed schema (callers may not change the cached one)."""
    return copy.deepcopy(_schema())


def schema_default(path: str) -> Any:
    """The schema's default for a dotted key path such as `coding_eval.max_tokens`; KeyError names the path."""
    node = _schema()
    for part in path.split("."):
        properties = node.get("properties", {})
        if part not in properties:
            raise KeyError(f"{path}: the schema ({schema_path()}) has no key {part!r}")
        node = properties[part]
    if "default" not in node:
        raise KeyError(f"{path}: the schema ({schema_path()}) gives no default")
    return copy.deepcopy(node["default"])
