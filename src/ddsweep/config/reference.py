"""The reference point of a grid study (`sweep.reference`): which point it is, whether it runs, its job record
and the inventory of hosts it is measured on again at the end of the study (`ddsweep reference-hosts`).

The reference point's own job is the start of the study (the workflow gives it priority); after every point,
the same configuration runs once on every host that ran a completed point. `analysis/drift.py` compares them.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

from ddsweep.config.points import Point, expand_points
from ddsweep.config.records import coding_settings, point_record
from ddsweep.storage import write_json_atomic

HOST_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
UNKNOWN_HOST = "unknown"


def reference_point(config: dict) -> Point | None:
    """The point measured again at the end of the study, or None when `sweep.reference.enabled` is false or the
    study is adaptive (its confirmation launches are fresh and interleaved already)."""
    reference = config["sweep"]["reference"]
    if reference["enabled"] is False or config["sweep"]["strategy"] == "adaptive":
        return None
    points = expand_points(config)
    wanted = reference["point"]
    if wanted is None:
        return next((p for p in points if p.kind == "ar" and p.preset == config["baselines"]["ar_preset"]), None)
    return next((p for p in points if p.point_id == wanted), None)


def reference_enabled(config: dict, on_slurm: bool) -> bool:
    """Whether the reference runs: `true`, or `auto` on Slurm; never without a reference point."""
    enabled = config["sweep"]["reference"]["enabled"]
    if reference_point(config) is None:
        return False
    return enabled is True or (enabled == "auto" and on_slurm)


def reference_benchmark(config: dict) -> dict:
    """The end-of-study benchmark: the primary workload (the one the regimes are measured on) at every configured
    cell, with the configured requests and repeats. Independent of `analysis:`, so changing the regimes or any
    other analysis setting reruns no reference job."""
    bench = copy.deepcopy(config["benchmark"])
    bench["workloads"] = [{**bench["workloads"][0], "contexts": None, "concurrency": None}]
    return bench


def reference_record(config: dict, point: Point) -> dict:
    """The run-point record of an end-of-study reference job: the reference benchmark, no coding eval."""
    return {**point_record(config, point), "benchmark": reference_benchmark(config),
            "coding_eval": {**coding_settings(config, point), "enabled": False}, "stage": "reference"}


def _read(path: Path) -> Any:
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def point_host(point_dir: Path) -> str | None:
    """The host a completed point ran on: its Slurm node name (what `--nodelist` takes), else its hostname;
    None when the point did not complete."""
    status = _read(point_dir / "status.json")
    if not isinstance(status, dict) or status.get("status") != "ok":
        return None
    environment = _read(point_dir / "environment.json")
    environment = environment if isinstance(environment, dict) else {}
    slurm = environment.get("slurm") if isinstance(environment.get("slurm"), dict) else {}
    host = slurm.get("node") or environment.get("hostname") or status.get("host")
    return str(host) if host and HOST_PATTERN.match(str(host)) else UNKNOWN_HOST


def host_inventory(done_files: list[str | Path]) -> dict[str, Any]:
    """The hosts that ran completed points (from each point's environment.json next to its done.json), sorted,
    with the points each ran; points whose host is unknown are listed apart and get no reference run."""
    hosts: dict[str, list[str]] = {}
    for done in done_files:
        directory = Path(done).parent
        host = point_host(directory)
        if host is not None:
            hosts.setdefault(host, []).append(directory.name)
    unknown = sorted(hosts.pop(UNKNOWN_HOST, []))
    return {"hosts": [{"host": h, "points": sorted(p)} for h, p in sorted(hosts.items())],
            "unknown_host_points": unknown}


def _run(args: argparse.Namespace) -> int:
    """`ddsweep reference-hosts`: write the host inventory of the given points' done.json files."""
    inventory = host_inventory(args.done)
    write_json_atomic(args.write, inventory)
    names = ", ".join(h["host"] for h in inventory["hosts"]) or "none"
    print(f"{len(inventory['hosts'])} host(s) ran completed points: {names}")
    if inventory["unknown_host_points"]:
        print(f"ddsweep reference-hosts: no host recorded for {', '.join(inventory['unknown_host_points'])}",
              file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `reference-hosts` subcommand."""
    text = "list the hosts that ran completed points (for the end-of-study reference runs)"
    parser = subparsers.add_parser("reference-hosts", help=text, description=text)
    parser.add_argument("done", nargs="*", help="the points' done.json files (environment.json is read beside each)")
    parser.add_argument("--write", required=True, metavar="FILE", help="where the inventory (JSON) goes")
    parser.set_defaults(func=_run)
