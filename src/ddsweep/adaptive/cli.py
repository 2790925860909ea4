"""The adaptive study's subcommands: `ddsweep select` (a selection round or a race round) and `ddsweep funnel`;
and `ddsweep plan`, which prints the sweep's plan (config/plan.py) with an adaptive study's stage plan."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from ddsweep.adaptive.funnel import cost_against_grid, funnel
from ddsweep.adaptive.race import race_round
from ddsweep.adaptive.selection import select_round
from ddsweep.adaptive.stages import (
    chosen_strategy,
    confirm_launches,
    format_stage_plan,
    running_baselines,
    screen_ids,
)
from ddsweep.bench.feasibility import feasible_workloads, matrix_check, matrix_report
from ddsweep.config.families import canaries_line
from ddsweep.config.plan import format_plan, plan_document
from ddsweep.config.study import ConfigError, add_config_arguments, config_from_args
from ddsweep.findings.funnel_section import render_funnel
from ddsweep.storage import write_json_atomic, write_text_atomic


def _read_config(path: str) -> dict:
    """The validated study configuration written by the workflow (results/study_config.yaml)."""
    return yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}


def _run_select(args: argparse.Namespace) -> int:
    """`ddsweep select`: one selection round over the screening results."""
    try:
        config = _read_config(args.config)
        previous = json.loads(Path(args.previous).read_text(encoding="utf-8")) if args.previous else None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"ddsweep select: cannot read {args.previous or args.config}: {exc}", file=sys.stderr)
        return 2
    if args.launch is not None:
        if previous is None:
            print("ddsweep select: --launch needs --previous (the selection before that launch)", file=sys.stderr)
            return 2
        selection = race_round(config, Path(args.screen), Path(args.confirm), previous, args.launch)
    else:
        selection = select_round(config, Path(args.screen), screen_ids(config), previous, Path(args.confirm))
    write_json_atomic(args.out, {"simulated": bool(config.get("simulated")), **selection.to_json()})
    last = selection.rounds[-1] if selection.rounds else {"stage": "selection", "entered": len(selection.screened)}
    print(f"{last['stage']}: {len(selection.survivors)} of {last['entered']} point(s) kept; "
          f"{len(selection.refine)} refinement point(s): {args.out}")
    return 0


def _run_funnel(args: argparse.Namespace) -> int:
    """`ddsweep funnel`: write the funnel record and its Markdown section."""
    try:
        config = _read_config(args.config)
        selection = json.loads(Path(args.selection).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"ddsweep funnel: cannot read {args.selection} or {args.config}: {exc}", file=sys.stderr)
        return 2
    doc = funnel(selection, Path(args.screen), Path(args.confirm), config.get("resources", {}).get("gpus", 8),
                 confirm_launches(config), running_baselines(config))
    doc["cost"] = cost_against_grid(config, doc, confirm_launches(config), Path(args.screen).parent)
    doc["simulated"] = bool(config.get("simulated"))
    write_json_atomic(args.out, doc)
    write_text_atomic(args.markdown, render_funnel(doc, doc["simulated"]))
    print(args.markdown)
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    """`ddsweep plan`: print the plan, and write it as JSON with --write."""
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"ddsweep plan: {exc}", file=sys.stderr)
        return 2
    on_slurm = args.executor == "slurm"
    cells, source = matrix_check(config)
    results = Path(args.results)
    try:
        strategy = chosen_strategy(config, results)
    except ValueError as exc:
        print(f"ddsweep plan: {exc}", file=sys.stderr)
        return 2
    # the GPU time of what the points will measure: every point leaves the infeasible cells out
    bench = config["benchmark"]
    workloads = feasible_workloads(bench["workloads"], bench["contexts"], cells)
    measured = {**config, "benchmark": {**bench, "workloads": workloads}} if workloads else config
    if args.write:
        write_json_atomic(args.write, {**plan_document(measured, on_slurm, cells), "strategy": strategy,
                                       "infeasible_cells": cells, "infeasible_cells_checked_with": source})
    print(format_plan(measured, format_stage_plan(measured, results), on_slurm, cells))
    print(canaries_line(config))
    print(matrix_report(cells, source))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan`, `select` and `funnel` subcommands."""
    text = ("print the expanded sweep, effective trees, alias groups, a GPU-time estimate and the benchmark cells "
            "no point can measure (from the model's tokenizer)")
    parser = subparsers.add_parser("plan", help=text, description=text)
    add_config_arguments(parser)
    parser.add_argument("--write", metavar="FILE", help="also write the plan as JSON (results/plan.json)")
    parser.add_argument("--executor", choices=["local", "slurm"], default="local",
                        help="where the study runs: on slurm, sweep.reference.enabled auto schedules the reference "
                             "runs, which the plan then counts (default local)")
    parser.add_argument("--results", default="results",
                        help="the study's results directory: its earlier records give the share of cells that do "
                             "not settle (sweep.strategy auto and the adaptive estimates; default results)")
    parser.set_defaults(func=_run_plan)
    parser = subparsers.add_parser("select", help="adaptive study: keep the screened points that could be best",
                                   description=_run_select.__doc__)
    parser.add_argument("--config", required=True, help="the validated study config (results/study_config.yaml)")
    parser.add_argument("--screen", default="results/screen", help="the screening results directory")
    parser.add_argument("--previous", help="the previous selection: round 1 (for the selection after refinement), "
                        "or the selection before confirmation launch --launch")
    parser.add_argument("--confirm", default="results/confirm", help="the confirmation results directory")
    parser.add_argument("--launch", type=int, help="select after this confirmation launch (0-based) of the points "
                        "still in the race")
    parser.add_argument("--out", required=True, help="the selection JSON to write")
    parser.set_defaults(func=_run_select)
    parser = subparsers.add_parser("funnel", help="adaptive study: points and GPU time of each stage",
                                   description=_run_funnel.__doc__)
    parser.add_argument("--config", required=True, help="the validated study config")
    parser.add_argument("--selection", required=True, help="the final selection (results/screen/selection.json)")
    parser.add_argument("--screen", default="results/screen")
    parser.add_argument("--confirm", default="results/confirm")
    parser.add_argument("--out", required=True, help="the funnel JSON to write")
    parser.add_argument("--markdown", required=True, help="the Markdown section to write")
    parser.set_defaults(func=_run_funnel)
