"""The adaptive study's funnel: how many points entered each stage, why each dropped one was dropped and by which
rule, the GPU time of each stage, and what the jobs that ran cost against the grid's estimate
(results/screen/funnel.json; the summary's section: report/funnel_section.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from ddsweep.adaptive.selection import RULES
from ddsweep.adaptive.stages import STAGES, first_confirm_launch, job_minutes, recorded_cells, stage_estimates
from ddsweep.analysis.text import first_line


def _status_minutes(paths: list[Path]) -> float:
    """Total job minutes recorded in status.json / failure.json files."""
    total = 0.0
    for path in paths:
        try:
            total += float(json.loads(path.read_text(encoding="utf-8")).get("duration_s") or 0) / 60
        except (OSError, ValueError, TypeError):
            continue
    return total


def _job_files(directories: list[Path]) -> list[Path]:
    """The job records (status.json or failure.json) in DIRECTORIES that exist."""
    return [d / name for d in directories for name in ("status.json", "failure.json") if (d / name).exists()]


def screen_failure(directory: Path) -> dict:
    """Why a screening job left no results: the error kind and one-line reason of its failure.json."""
    try:
        record = json.loads((directory / "failure.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"error_kind": "no_results", "reason": f"no status.json or failure.json in {directory}"}
    return {"error_kind": record.get("error_kind") or "unknown", "reason": first_line(record.get("error")) or ""}


def funnel(selection: dict, screen_dir: Path, confirm_dir: Path, gpus: int, launches: int,
           baselines: list[str] | None = None) -> dict:
    """How many points entered each stage, why each dropped one was dropped, and the GPU time of each stage.
    Only the jobs of this study count: the `baselines`' one launch each, the other confirmed points' `launches`
    configured launches, the launches of the points the race dropped (`race_launches`) and the listed settling
    launches, so launch directories left by another study in the same results directory do not."""
    screen_dir, confirm_dir = Path(screen_dir), Path(confirm_dir)
    refine = set(selection.get("refine", []))
    base = [p for p in baselines or [] if p in selection["screened"]]
    grid_screened = [p for p in selection["screened"] if p not in refine and p not in base]
    ran = {**{pid: launches for pid in selection["survivors"] if pid not in base},
           **selection.get("race_launches", {})}
    confirm = [confirm_dir / pid / f"launch-{k}" for pid, n in ran.items() for k in range(n)]
    settling = [confirm_dir / pid / f"launch-{k}" for pid, ks in selection.get("extra_launches", {}).items()
                for k in ks]
    races = [r for r in selection.get("rounds", []) if r["stage"].startswith("confirm")]
    entered_confirm = (races[0]["entered"] if races else len(selection["survivors"])) - len(base)
    minutes = {"baselines": _status_minutes(_job_files([confirm_dir / p / "launch-0" for p in base])),
               "screen": _status_minutes(_job_files([screen_dir / p for p in grid_screened])),
               "refine": _status_minutes(_job_files([screen_dir / p for p in refine])),
               "confirm": _status_minutes(_job_files(confirm)),
               "settle": _status_minutes(_job_files(settling))}
    return {
        "stages": {
            "baselines": {"points": len(base), "job_min": minutes["baselines"]},
            "screen": {"points": len(grid_screened), "job_min": minutes["screen"]},
            "refine": {"points": len(refine), "job_min": minutes["refine"]},
            "confirm": {"points": entered_confirm, "job_min": minutes["confirm"]},
            "settle": {"points": len(selection.get("extra_launches", {})), "job_min": minutes["settle"]},
        },
        "rounds": selection.get("rounds", []),
        "gpus_per_job": gpus,
        "gpu_hours": {k: v * gpus / 60 for k, v in minutes.items()},
        "dropped": selection["dropped"], "dropped_by_rule": dropped_by_rule(selection),
        "failed": selection.get("failed", []),
        "failures": {pid: screen_failure(confirm_dir / pid / "launch-0" if pid in (baselines or [])
                                         else screen_dir / pid) for pid in selection.get("failed", [])},
        "best_in_screening": selection.get("best", {}), "survivors": selection["survivors"],
        "unstable": selection.get("unstable", {}), "race_launches": selection.get("race_launches", {}),
        "extra_launches": selection.get("extra_launches", {}),
    }


def dropped_by_rule(selection: dict) -> dict[str, int]:
    """How many points each rule dropped (selection.RULES; a record without `dropped_by` predates the widened band
    and the race's cap is then read from its reason)."""
    rules = selection.get("dropped_by", {})
    counts = dict.fromkeys(RULES, 0)
    for pid, reason in selection["dropped"].items():
        rule = rules.get(pid) or ("race cap" if "the race keeps" in reason else "band")
        counts[rule] += 1
    return counts


def cost_against_grid(config: dict, doc: dict, launches: int, results_dir: Path) -> dict:
    """What the study's jobs cost in the plan's cost model (`resources.estimate`), against the full grid's estimate
    and the adaptive plan's expected cost, with the share of cells that did not settle in this study's own records
    (both strategies would have met it); and the measured job minutes."""
    flags = recorded_cells(results_dir)
    unsettled = flags.count(False) / len(flags) if flags else 0.0
    jobs, stages = job_minutes(config, unsettled), stage_estimates(config, unsettled)
    base = doc["stages"].get("baselines", {}).get("points", 0)
    confirmed = len(doc["survivors"]) - base
    launched = [confirmed] * launches
    for n in doc.get("race_launches", {}).values():
        launched[:n] = [k + 1 for k in launched[:n]]
    if first_confirm_launch(config):  # the screening, counted above, stood for every candidate's launch 0
        launched[0] = 0
    settled = sum(len(ks) for ks in doc.get("extra_launches", {}).values())
    screened = doc["stages"]["screen"]["points"] + doc["stages"]["refine"]["points"]
    ran = (base * jobs["baseline"] + screened * jobs["screen"] + confirmed * jobs["coding"]
           + sum(n * minutes for n, minutes in zip(launched, jobs["launches"], strict=True))
           + settled * jobs["settle"])
    grid = stages["grid"]["expected_min"]
    return {"unsettled_share": unsettled, "cells": len(flags), "jobs_estimate_min": ran, "grid_estimate_min": grid,
            "adaptive_expected_min": sum(stages[s]["expected_min"] for s in STAGES),
            "ratio_to_grid": ran / grid if grid else None,
            "measured_job_min": sum(stage["job_min"] for stage in doc["stages"].values())}
