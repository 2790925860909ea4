"""Merge the server launches of one point into the ordinary per-point layout.

An adaptive study's confirmation runs one repeat per fresh server launch (results/confirm/<id>/launch-<k>/); a
grid study splits each point's repeats across `sweep.launches` launches (results/launches/<id>/launch-<k>/).
Merged, the repeats of launch k follow those of the earlier launches (repeat indices renumbered in order, so
that launch k of every point pairs with launch k of every other) in one point directory with the layout
run-point writes (docs/results-schema.md); launches.json lists each launch's repeats, which the summary uses to
treat the launch as the independent unit (ddsweep.analysis.launch_model).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ddsweep.bench.records import group_figures
from ddsweep.point.run import done_record
from ddsweep.storage import write_json_atomic, write_text_atomic

# Files copied from the first launch (the server and platform of every launch are listed in launches.json).
FIRST_LAUNCH_FILES = ("point.json", "server_info.json", "verification.json", "environment.json", "server.log")


class MergeError(RuntimeError):
    """A launch directory is incomplete or inconsistent with the others."""


def _read_json(path: Path) -> dict:
    """A JSON file, or MergeError naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MergeError(f"cannot read {path}: {exc}") from exc


def is_screening(directory: Path) -> bool:
    """Whether a directory given as a launch is not `launch-<k>`: an adaptive candidate's screening job
    (results/screen/<id>), which stands for its launch 0."""
    return not Path(directory).name.startswith("launch-")


def launch_number(directory: Path) -> int:
    """k of a launch directory `launch-<k>`; 0 for a screening job (`is_screening`)."""
    return 0 if is_screening(directory) else int(Path(directory).name.removeprefix("launch-"))


def merge_launches(launch_dirs: list[Path], out_dir: Path) -> dict:
    """Write OUT_DIR as one point whose repeats are its completed launches; returns its status record (written
    last). Launches that failed are listed in launches.json; when none completed, or none but a screening job (it
    measured the regime cells briefly: it stands for a launch but never makes a point alone), the point failed:
    OUT_DIR gets the first failed launch's failure.json and the status record says so (`status: failed`)."""
    launch_dirs = sorted((Path(d) for d in launch_dirs), key=launch_number)
    if all(is_screening(d) for d in launch_dirs):
        raise MergeError("no launch directory given (a screening job stands for a launch but makes no point alone)")
    failed = [d for d in launch_dirs if not (d / "status.json").exists()]
    if all(d in failed or is_screening(d) for d in launch_dirs):
        return _merge_failed(failed or launch_dirs, Path(out_dir))
    failures = {str(d): (_read_json(d / "failure.json") if (d / "failure.json").exists() else None) for d in failed}
    launch_dirs = [d for d in launch_dirs if d not in failed]
    statuses = [_read_json(d / "status.json") for d in launch_dirs]
    point_ids = {s["point_id"] for s in statuses}
    if len(point_ids) != 1:
        raise MergeError(f"launches of different points cannot be merged: {', '.join(sorted(point_ids))}")
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    (out_dir / "bench").mkdir(parents=True)
    first = launch_dirs[0]
    for name in FIRST_LAUNCH_FILES:
        if (first / name).exists():
            shutil.copy2(first / name, out_dir / name)
    coding = next((d / "coding" for d in launch_dirs if (d / "coding").is_dir()), None)
    if coding is not None:  # the launch that ran the coding eval (the last one in an adaptive study)
        shutil.copytree(coding, out_dir / "coding")
    cells_doc: dict | None = None
    lines: list[str] = []
    # Launch k keeps its own number whatever launches failed, and its repeats follow those of the launches
    # before it (stride: the most repeats one launch ran): repeats are paired across points by their index (the
    # same prompts in launch k of every point), the launch model by the launch number.
    local_repeats = {d: sorted({int(c.get("repeat") or 0) for c in _read_json(d / "bench" / "cells.json")["cells"]})
                     or [0] for d in launch_dirs}
    stride = max(len(reps) for reps in local_repeats.values())
    repeats_of: dict[int, list[int]] = {}
    for directory in launch_dirs:
        k = launch_number(directory)
        offset = k * stride
        local = local_repeats[directory]
        doc = _read_json(directory / "bench" / "cells.json")
        index = {rep: offset + i for i, rep in enumerate(local)}
        for cell in doc["cells"]:
            cell["repeat"] = index[int(cell.get("repeat") or 0)]
            cell["launch"] = k
        if cells_doc is None:
            cells_doc = {**doc, "cells": [], "warmups": []}
        cells_doc["cells"].extend(doc["cells"])
        cells_doc["warmups"].extend({**w, "launch": k} for w in doc.get("warmups") or [])
        for line in (directory / "bench" / "requests.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                record["repeat"] = index.get(int(record.get("repeat") or 0), offset)
                record["launch"] = k
                lines.append(json.dumps(record))
        repeats_of[k] = sorted(index.values())
    assert cells_doc is not None
    cells_doc["config"] = {**cells_doc.get("config", {}), "repeats": sum(len(r) for r in repeats_of.values())}
    cells_doc["groups"] = group_figures(cells_doc["cells"])
    write_text_atomic(out_dir / "bench" / "requests.jsonl", "".join(line + "\n" for line in lines))
    write_json_atomic(out_dir / "bench" / "cells.json", cells_doc)
    write_json_atomic(out_dir / "launches.json", {
        "point_id": statuses[0]["point_id"], "simulated": any(s.get("simulated") for s in statuses),
        "launches": [{"launch": launch_number(d), "dir": str(d), "status": s,
                      "repeats": repeats_of[launch_number(d)],
                      "environment": _read_json(d / "environment.json") if (d / "environment.json").exists() else None}
                     for d, s in zip(launch_dirs, statuses, strict=True)],
        "failed_launches": [{"dir": d, "failure": f} for d, f in failures.items()]})
    finished = [s["finished_utc"] for s in statuses if isinstance(s.get("finished_utc"), str)]
    status = {**statuses[0], **({"finished_utc": max(finished)} if finished else {}),
              "duration_s": round(sum(s.get("duration_s") or 0 for s in statuses), 3),
              "launches": len(launch_dirs), "simulated": any(s.get("simulated") for s in statuses)}
    write_json_atomic(out_dir / "status.json", status)
    return status


def _merge_failed(launch_dirs: list[Path], out_dir: Path) -> dict:
    """Every launch failed (or all but a screening): the point is a failed result, recorded with the first failure."""
    first = next((d for d in launch_dirs if (d / "failure.json").exists()), None)
    if first is None:
        raise MergeError(f"{launch_dirs[0]}: neither status.json nor failure.json (the launch did not finish)")
    failure = _read_json(first / "failure.json")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for name in (*FIRST_LAUNCH_FILES, "failure.json", "server.log"):
        if (first / name).exists():
            shutil.copy2(first / name, out_dir / name)
    write_json_atomic(out_dir / "launches.json", {
        "point_id": failure.get("point_id"), "launches": [],
        "failed_launches": [{"dir": str(d), "failure": _read_json(d / "failure.json")
                             if (d / "failure.json").exists() else None} for d in launch_dirs]})
    return {"point_id": failure.get("point_id"), "status": "failed", "error_kind": failure.get("error_kind"),
            "error": failure.get("error"), "persisted_after": failure.get("attempts") if failure.get("persisted")
            else None}


def _run(args: argparse.Namespace) -> int:
    """`ddsweep merge-launches`: merge confirmation launches into one point directory."""
    try:
        status = merge_launches([Path(d) for d in args.launch_dirs], Path(args.out))
    except (MergeError, KeyError, ValueError) as exc:
        print(f"ddsweep merge-launches: {exc}", file=sys.stderr)
        return 1
    if args.done:
        failed = status.get("status") == "failed"
        write_json_atomic(Path(args.done), done_record(str(status.get("point_id")), "failed" if failed else "ok",
                                                       status.get("error_kind") if failed else None,
                                                       status.get("error") if failed else None,
                                                       status.get("persisted_after") if failed else None))
    print(args.out)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `merge-launches` subcommand."""
    parser = subparsers.add_parser("merge-launches", help="adaptive study: merge a point's confirmation launches",
                                   description=__doc__)
    parser.add_argument("launch_dirs", nargs="+", metavar="LAUNCH_DIR", help="results/confirm/<id>/launch-<k>")
    parser.add_argument("--out", required=True, help="the merged point directory (results/points/<id>)")
    parser.add_argument("--done", metavar="FILE",
                        help="write the point's terminal marker here (ok, or failed when every launch failed)")
    parser.set_defaults(func=_run)
