"""The record a point's job gets: everything `ddsweep run-point` needs, as plain data (the workflow passes it)."""

from __future__ import annotations

from dataclasses import asdict

from ddsweep.config.knobs import server_preset
from ddsweep.config.points import Point


def coding_settings(config: dict, point: Point) -> dict:
    """The coding eval of one point: the configured subset, or every problem for `ar` with
    `coding_eval.full_on_ar`."""
    # full_on_ar is resolved here (turning it on reruns only ar); full_on_picks adds jobs of their own
    # (coding_full_record) and changes no point's record
    coding = {k: v for k, v in config["coding_eval"].items() if k not in ("full_on_ar", "full_on_picks")}
    if config["coding_eval"].get("full_on_ar") and point.kind == "ar":
        coding.update(limit=None, task_ids=None)
    return coding


def point_record(config: dict, point: Point) -> dict:
    """Everything one point's job needs, as plain data (the workflow passes it to `ddsweep run-point`)."""
    preset = config["engine"]["presets"][point.preset]
    return {
        "study": config["study"],
        "point_id": point.point_id,
        "simulated": bool(config.get("simulated", False)),
        "point": asdict(point),
        "target": config["target"],
        "drafter": config["drafter"],
        "engine": {k: v for k, v in config["engine"].items() if k != "presets"},
        "preset": server_preset(preset),
        "failure_patterns": preset.get("failure_patterns") or {},
        "benchmark": config["benchmark"],
        "coding_eval": coding_settings(config, point),
        # only for multi-node points, so that single-node records (and their Snakemake params) stay as they were
        **({"group": {"nnodes": nodes, "gpus_per_node": config["resources"]["gpus"],
                      "cpus_per_task": config["resources"]["cpus_per_task"]}}
           if (nodes := config["resources"]["nodes"]) > 1 else {}),
    }


def coding_full_record(config: dict, point: Point) -> dict:
    """The record of a recommended point's full HumanEval job (coding_eval.full_on_picks): the point's server
    with every problem, no repeat of the answers and no benchmark."""
    record = point_record(config, point)
    return {**record, "benchmark": None, "stage": "coding_full",
            "coding_eval": {**record["coding_eval"], "enabled": True, "limit": None, "task_ids": None,
                            "ar_repeat": False}}
