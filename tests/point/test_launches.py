"""Merging an adaptive study's confirmation launches into one point directory that summarize reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddsweep.point.launches import MergeError, merge_launches


def _launch(root: Path, k: int, speed: float, point_id: str = "bs8-b8-t4-w2048", repeats: int = 1) -> Path:
    directory = root / point_id / f"launch-{k}"
    (directory / "bench").mkdir(parents=True)
    cells = [{"context": 128, "concurrency": 1, "repeat": r, "requests": 2, "completed": 2, "failed": 0,
              "output_throughput_tok_s": speed + r, "decode_tok_s": {"median": speed + r}, "acceptance_length": 4.0,
              "ttft_s": {"p50": 0.01}, "tpot_s": {"p50": 1 / speed},
              "steady_state": {"output_throughput_tok_s": speed + r}} for r in range(repeats)]
    warmups = [{"context": 128, "concurrency": 1, "requests": 5,
                "window": {"stopped_by": "cap" if k == 1 else "stable", "stable": k != 1}}]
    (directory / "bench" / "cells.json").write_text(json.dumps(
        {"simulated": True, "config": {"repeats": repeats}, "warmups": warmups, "cells": cells, "groups": []}))
    (directory / "bench" / "requests.jsonl").write_text(
        "".join(json.dumps({"context": 128, "concurrency": 1, "repeat": r, "index": i}) + "\n"
                for r in range(repeats) for i in range(2)))
    (directory / "point.json").write_text(json.dumps({"point_id": point_id, "launch": k}))
    (directory / "status.json").write_text(json.dumps({"point_id": point_id, "status": "ok", "duration_s": 10.0,
                                                       "simulated": True}))
    return directory


def test_launch_k_becomes_repeat_k_with_groups_across_launches(tmp_path):
    launches = [_launch(tmp_path / "confirm", k, speed) for k, speed in enumerate((100.0, 110.0, 90.0))]
    out = tmp_path / "points" / "bs8-b8-t4-w2048"
    status = merge_launches(list(reversed(launches)), out)
    cells = json.loads((out / "bench" / "cells.json").read_text())
    assert [c["repeat"] for c in cells["cells"]] == [0, 1, 2]
    assert [c["output_throughput_tok_s"] for c in cells["cells"]] == [100.0, 110.0, 90.0]
    # every launch's warm-up is kept, with its launch: launch 1's had not settled
    assert [(w["launch"], w["window"]["stable"]) for w in cells["warmups"]] == [(0, True), (1, False), (2, True)]
    from ddsweep.analysis.results import load_directories

    rows = load_directories(tmp_path, [out]).cells.sort_values("repeat")
    assert rows["warmup_settled"].tolist() == [True, False, True]  # each cell beside its own launch's warm-up
    group = cells["groups"][0]
    assert group["repeats"] == 3 and group["decode_tok_s"]["median"] == 100.0
    records = [json.loads(line) for line in (out / "bench" / "requests.jsonl").read_text().splitlines()]
    assert sorted({(r["repeat"], r["launch"]) for r in records}) == [(0, 0), (1, 1), (2, 2)]
    assert json.loads((out / "point.json").read_text())["launch"] == 0
    assert status["launches"] == 3 and status["duration_s"] == 30.0
    assert json.loads((out / "status.json").read_text()) == status
    assert len(json.loads((out / "launches.json").read_text())["launches"]) == 3


def test_a_grid_points_launches_keep_their_repeats_in_order_and_list_them(tmp_path):
    """Launch 0 ran repeats 0 and 1, launch 1 one repeat: merged, the repeats are 0, 1 | 2, each with its launch."""
    launches = [_launch(tmp_path / "launches", 0, 100.0, repeats=2), _launch(tmp_path / "launches", 1, 120.0)]
    out = tmp_path / "points" / "bs8-b8-t4-w2048"
    merge_launches(launches, out)
    cells = json.loads((out / "bench" / "cells.json").read_text())
    assert [(c["repeat"], c["launch"], c["output_throughput_tok_s"]) for c in cells["cells"]] == [
        (0, 0, 100.0), (1, 0, 101.0), (2, 1, 120.0)]
    assert cells["config"]["repeats"] == 3
    records = [json.loads(line) for line in (out / "bench" / "requests.jsonl").read_text().splitlines()]
    assert sorted({(r["repeat"], r["launch"]) for r in records}) == [(0, 0), (1, 0), (2, 1)]
    listed = json.loads((out / "launches.json").read_text())["launches"]
    assert [entry["repeats"] for entry in listed] == [[0, 1], [2]]
    from ddsweep.analysis.launch_model import read_launch_map

    assert read_launch_map(out) == {0: 0, 1: 0, 2: 1}


def test_an_adaptive_candidates_screening_is_its_launch_0_before_its_confirmation_launch(tmp_path):
    """results/screen/<id> stands for launch 0 (one repeat), results/confirm/<id>/launch-1 ran three."""
    screening = tmp_path / "screen" / "bs8-b8-t4-w2048"
    _launch(tmp_path / "staging", 0, 90.0).rename(screening.parent.mkdir(parents=True) or screening)
    last = _launch(tmp_path / "confirm", 1, 100.0, repeats=3)
    out = tmp_path / "points" / "bs8-b8-t4-w2048"
    merge_launches([last, screening], out)
    cells = json.loads((out / "bench" / "cells.json").read_text())
    assert [(c["repeat"], c["launch"], c["output_throughput_tok_s"]) for c in cells["cells"]] == [
        (0, 0, 90.0), (3, 1, 100.0), (4, 1, 101.0), (5, 1, 102.0)]
    assert [entry["dir"] for entry in json.loads((out / "launches.json").read_text())["launches"]] == [
        str(screening), str(last)]


def test_a_candidate_whose_confirmation_launch_failed_is_failed_though_its_screening_measured(tmp_path):
    screening = tmp_path / "screen" / "bs8-b8-t4-w2048"
    _launch(tmp_path / "staging", 0, 90.0).rename(screening.parent.mkdir(parents=True) or screening)
    last = _launch(tmp_path / "confirm", 1, 100.0, repeats=3)
    _fail(last)
    status = merge_launches([screening, last], tmp_path / "points" / "bs8-b8-t4-w2048")
    assert status["status"] == "failed" and status["error_kind"] == "server_crash", status
    with pytest.raises(MergeError, match="makes no point alone"):
        merge_launches([screening], tmp_path / "alone")


def test_the_coding_eval_comes_from_the_launch_that_ran_it(tmp_path):
    launches = [_launch(tmp_path / "confirm", k, 100.0) for k in range(3)]
    (launches[2] / "coding").mkdir()
    (launches[2] / "coding" / "results.jsonl").write_text('{"task_id": "HumanEval/0", "passed": true}\n')
    out = tmp_path / "points" / "bs8-b8-t4-w2048"
    merge_launches(launches, out)
    assert (out / "coding" / "results.jsonl").read_text() == '{"task_id": "HumanEval/0", "passed": true}\n'


def test_launches_of_different_points_are_refused(tmp_path):
    launches = [_launch(tmp_path, 0, 100.0), _launch(tmp_path, 1, 100.0, point_id="ar")]
    with pytest.raises(MergeError, match="launches of different points"):
        merge_launches(launches, tmp_path / "out")


def _fail(directory: Path, kind: str = "server_crash") -> None:
    (directory / "status.json").unlink()
    (directory / "failure.json").write_text(json.dumps({"point_id": "bs8-b8-t4-w2048", "error_kind": kind,
                                                        "error": f"{kind}: the server exited\nmore detail"}))


def test_failed_launches_are_left_out_and_listed(tmp_path):
    launches = [_launch(tmp_path / "confirm", k, speed) for k, speed in enumerate((100.0, 110.0, 90.0))]
    _fail(launches[1])
    out = tmp_path / "points" / "bs8-b8-t4-w2048"
    status = merge_launches(launches, out)
    cells = json.loads((out / "bench" / "cells.json").read_text())
    assert [c["output_throughput_tok_s"] for c in cells["cells"]] == [100.0, 90.0]
    # launch 2 stays repeat 2 (paired with launch 2 of the other points), not renumbered to 1
    assert [c["repeat"] for c in cells["cells"]] == [0, 2]
    records = [json.loads(line) for line in (out / "bench" / "requests.jsonl").read_text().splitlines()]
    assert sorted({(r["repeat"], r["launch"]) for r in records}) == [(0, 0), (2, 2)]
    assert [e["launch"] for e in json.loads((out / "launches.json").read_text())["launches"]] == [0, 2]
    assert status["launches"] == 2 and (out / "status.json").exists()
    failed = json.loads((out / "launches.json").read_text())["failed_launches"]
    assert [f["failure"]["error_kind"] for f in failed] == ["server_crash"]


def test_a_point_whose_every_launch_failed_is_a_failed_result(tmp_path):
    from ddsweep.cli import main

    launches = [_launch(tmp_path / "confirm", k, 100.0) for k in range(2)]
    for directory in launches:
        _fail(directory, "startup_exit")
    out, done = tmp_path / "points" / "bs8-b8-t4-w2048", tmp_path / "done.json"
    assert main(["merge-launches", *map(str, launches), "--out", str(out), "--done", str(done)]) == 0
    assert not (out / "status.json").exists()
    assert json.loads((out / "failure.json").read_text())["error_kind"] == "startup_exit"
    marker = json.loads(done.read_text())
    assert (marker["status"], marker["error_kind"], marker["reason"]) == ("failed", "startup_exit",
                                                                          "startup_exit: the server exited")
