"""Which settings of a point's record define its measurement and which only say how the job runs.

The workflow passes a point job the measurement-defining part of its record as a Snakemake param (a change
reruns the point) and the operational part through the environment, which Snakemake never compares: raising a
timeout or switching the coding sandbox's isolation reruns no completed point."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

# Record section -> keys that change how a job runs but not what it measures. Everything else in a record (the
# knobs, the preset's arguments and environment, the launcher, model paths, the benchmark matrix and workloads,
# the coding problems and token limits) defines the measurement.
OPERATIONAL_KEYS: dict[str, tuple[str, ...]] = {
    "engine": ("host", "startup_timeout_s", "shutdown_timeout_s", "failure_patterns"),
    "benchmark": ("request_timeout_s", "stall_timeout_s"),
    "coding_eval": ("exec_timeout_s", "request_timeout_s", "isolation", "require_isolation"),
}
# Top-level record keys that are operational: the study's name labels the results, it measures nothing; the
# preset's server-log patterns classify a failure, they change no measurement.
OPERATIONAL_TOP = ("study", "failure_patterns")


def operational_settings(config: dict) -> dict[str, Any]:
    """The operational part of every point record of `config` (the same for every point of a study)."""
    settings: dict[str, Any] = {"study": config["study"], "failure_patterns": {
        name: preset.get("failure_patterns") or {} for name, preset in config["engine"]["presets"].items()}}
    for section, keys in OPERATIONAL_KEYS.items():
        settings[section] = {key: config[section][key] for key in keys if key in config.get(section, {})}
    return settings


def measurement_record(record: dict) -> dict:
    """`record` without its operational keys: what a point job's Snakemake param holds."""
    kept = {key: value for key, value in record.items() if key not in OPERATIONAL_TOP}
    for section, keys in OPERATIONAL_KEYS.items():
        if isinstance(kept.get(section), dict):
            kept[section] = {key: value for key, value in kept[section].items() if key not in keys}
    return kept


def record_digest(record: dict) -> str:
    """SHA-256 of a record's measurement-defining part: two attempts of one configuration share it, and a finished
    job whose point.json carries another was measured under another configuration."""
    text = json.dumps(measurement_record(dict(record)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def with_operations(record: dict, operations: dict) -> dict:
    """A measurement record completed with the study's operational settings (run-point's `--operations-json`)."""
    full = copy.deepcopy(record)
    if "study" in operations:
        full["study"] = operations["study"]
    full["failure_patterns"] = (operations.get("failure_patterns") or {}).get(full["point"]["preset"], {})
    for section in OPERATIONAL_KEYS:
        if isinstance(full.get(section), dict):
            full[section].update(operations.get(section, {}))
    return full
