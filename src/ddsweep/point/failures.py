"""Is a failed point a result of its configuration, or of the machine it ran on?

A configuration result (the server refused the flags, verification found a knob not applied, a crash that
happened again on retry) is recorded with `done.json` and never rerun. An infrastructure failure (start-up
timeout, out of memory at load, GPUs busy, node or filesystem errors, lost connection, an interruption from
outside) is retried by Snakemake up to `resources.retries` and, if it persists, left without `done.json`, so
that the next invocation runs the point again. Server-log patterns from the preset's `failure_patterns` decide
first; a kind they do not settle counts as infrastructure on its first occurrence and as configuration once the
previous attempt of the same record failed with the same kind."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddsweep.config.operational import measurement_record

CONFIGURATION = "configuration"
INFRASTRUCTURE = "infrastructure"
# Kinds that are a configuration result whatever the log says: the server answered, and not as asked, or its
# argument parser refused the preset on the submit host (the preflight; no server started).
ALWAYS_CONFIGURATION = frozenset({"verify", "preflight"})
# Kinds that never depend on the configuration: the machine, the filesystem, a signal from outside, a start-up
# that did not finish in time (a slow shared filesystem under many concurrent loads), busy GPUs.
ALWAYS_INFRASTRUCTURE = frozenset({"config", "io", "interrupted", "startup_timeout", "gpus_busy"})


@dataclass(frozen=True)
class Classification:
    """A failure's class and the sentence saying how it was decided."""

    failure_class: str
    why: str

    @property
    def is_result(self) -> bool:
        """Whether the failure is a result of the study (done.json, not rerun)."""
        return self.failure_class == CONFIGURATION


def record_digest(record: Mapping) -> str:
    """SHA-256 of a record's measurement-defining part: two attempts of one configuration share it."""
    text = json.dumps(measurement_record(dict(record)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def matching_pattern(text: str, patterns: list[str]) -> str | None:
    """The first of `patterns` (regular expressions) found in `text`, if any."""
    return next((p for p in patterns if re.search(p, text, re.MULTILINE)), None)


def previous_failure(out_dir: Path) -> dict | None:
    """failure.json of the latest earlier attempt in OUT_DIR/attempts/, if that attempt failed."""
    attempts = sorted((Path(out_dir) / "attempts").glob("*/"), key=lambda p: p.name)
    if not attempts or not (attempts[-1] / "failure.json").exists():
        return None
    try:
        return json.loads((attempts[-1] / "failure.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def classify(kind: str, log_text: str, patterns: Mapping[str, list[str]], digest: str,
             previous: Mapping | None) -> Classification:
    """The class of a failure of `kind`, from the server log, the preset's patterns and the previous attempt."""
    if kind in ALWAYS_CONFIGURATION:
        return Classification(CONFIGURATION, "preflight: the installed server refused the preset's command"
                              if kind == "preflight" else f"{kind}: the server ran and did not apply the configuration")
    if kind in ALWAYS_INFRASTRUCTURE:
        return Classification(INFRASTRUCTURE, f"{kind} does not depend on the point's configuration")
    found = matching_pattern(log_text, list(patterns.get("infrastructure") or []))
    if found:
        return Classification(INFRASTRUCTURE, f"the server log matches the preset's infrastructure pattern {found!r}")
    found = matching_pattern(log_text, list(patterns.get("configuration") or []))
    if found:
        return Classification(CONFIGURATION, f"the server log matches the preset's configuration pattern {found!r}")
    if previous and previous.get("error_kind") == kind and previous.get("record_sha256") == digest:
        return Classification(CONFIGURATION, f"{kind} happened again on retry (attempt "
                              f"{int(previous.get('attempt') or 1) + 1}): deterministic")
    return Classification(INFRASTRUCTURE, f"{kind} on its first occurrence: retried to tell a deterministic failure "
                          "from the machine's")
