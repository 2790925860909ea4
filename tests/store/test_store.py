"""The study store: finished units go whole with their manifest last, come back with their mtimes, and an attempt
that started and never ended is reported as interrupted; the same on a filesystem and on an S3-compatible bucket."""

from __future__ import annotations

import gc
import json
import uuid
from pathlib import Path

import pytest
from conftest import needs_rsync

from ddsweep.point.marks import STORE_ENV, AttemptMarks, unit_of
from ddsweep.point.preflight import store_result
from ddsweep.point.signals import Interrupted
from ddsweep.store import (
    LEGACY_PREFLIGHTS,
    MANIFEST,
    StoreError,
    StudyStore,
    describe_pull,
    interrupted_attempts,
    mark_attempt,
    parse_store,
    pull,
    push_file,
    push_unit,
    store_units,
)

UNIT = "results/points/bs8-b8-t4-woff"


def _unit(workdir: Path, unit: str = UNIT) -> Path:
    """A finished unit with a nested file, as a point job leaves it."""
    directory = workdir / unit
    (directory / "bench").mkdir(parents=True)
    (directory / "bench" / "cells.json").write_text(json.dumps({"cells": [1, 2, 3]}))
    (directory / "status.json").write_text(json.dumps({"status": "ok"}))
    (directory / "done.json").write_text(json.dumps({"status": "ok"}))
    return directory


@pytest.fixture(params=["fs", "s3"])
def store(request, tmp_path) -> StudyStore:
    """A fresh store of each kind: a directory, or a bucket of the moto server."""
    if request.param == "fs":
        needs_rsync()
        return StudyStore.open(str(tmp_path / "store"))
    request.getfixturevalue("s3_endpoint")
    return StudyStore.open(f"s3://ddsweep-test-{uuid.uuid4().hex[:12]}/study")


def test_a_pushed_unit_comes_back_whole_with_its_mtimes_in_a_fresh_directory(store, tmp_path):
    first = tmp_path / "machine-1"
    source = _unit(first)
    manifest = push_unit(store, first, UNIT, source / MANIFEST)
    assert sorted(manifest["files"]) == ["bench/cells.json", "done.json", "status.json"]

    second = tmp_path / "machine-2"
    report = pull(store, second, [UNIT, "results/points/never-ran"])
    assert report.restored == [UNIT] and report.interrupted == {}
    for name, meta in manifest["files"].items():
        restored = second / UNIT / name
        assert restored.read_bytes() == (source / name).read_bytes()
        assert restored.stat().st_mtime == pytest.approx(meta["mtime"], abs=1e-3)
    # the manifest no newer than the unit's newest file, so the jobs that used the unit stay up to date
    newest = max(meta["mtime"] for meta in manifest["files"].values())
    assert (second / UNIT / MANIFEST).stat().st_mtime == pytest.approx(newest, abs=1e-3)
    assert not (second / "results" / "points" / "never-ran").exists()
    # a unit already here is left alone
    assert pull(store, second, [UNIT]).restored == []


def test_a_unit_finished_here_after_its_stored_copy_is_not_replaced_by_it(store, tmp_path):
    # the store holds an earlier attempt (not started: the time budget); this directory ran the point again and
    # finished it, but its push did not happen: the next pull keeps the finished point
    earlier = tmp_path / "earlier"
    source = _unit(earlier)
    (source / "done.json").write_text(json.dumps({"status": "failed", "error_kind": "time_budget"}))
    push_unit(store, earlier, UNIT, source / MANIFEST)
    here = tmp_path / "here"
    finished = _unit(here)
    assert pull(store, here, [UNIT]).restored == []
    assert json.loads((finished / "done.json").read_text()) == {"status": "ok"} and not (finished / MANIFEST).exists()
    (finished / "done.json").write_text(json.dumps({"status": "failed", "error_kind": "time_budget"}))
    assert pull(store, here, [UNIT]).restored == [UNIT]  # an unfinished record here: the store's copy comes back


def test_a_stored_unit_measured_under_another_configuration_is_not_restored(store, tmp_path):
    earlier = tmp_path / "earlier"
    source = _unit(earlier)
    (source / "point.json").write_text(json.dumps({"point_id": "bs8-b8-t4-woff", "record_digest": "before"}))
    push_unit(store, earlier, UNIT, source / MANIFEST)
    changed = pull(store, tmp_path / "changed", [UNIT], {UNIT: "after"})  # the benchmark matrix changed since
    assert changed.restored == [] and changed.stale == [UNIT] and not (tmp_path / "changed" / UNIT).exists()
    assert "1 finished job(s) in the store were measured under another configuration" in describe_pull(changed, "s")
    same = pull(store, tmp_path / "same", [UNIT], {UNIT: "before"})
    assert same.restored == [UNIT] and same.stale == []
    assert pull(store, tmp_path / "unchecked", [UNIT]).restored == [UNIT]  # no expectation: taken


def test_a_store_leaves_no_staging_directory_behind(tmp_path):
    needs_rsync()
    store = StudyStore.open(str(tmp_path / "store"))
    scratch = store.scratch
    _unit(tmp_path)
    push_unit(store, tmp_path, UNIT, tmp_path / "stored.json")
    assert scratch.is_dir() and not scratch.is_relative_to(tmp_path)
    del store
    gc.collect()
    assert not scratch.exists()


def test_a_preflight_result_is_a_unit_of_its_own_and_comes_back_with_its_mtime(store, tmp_path):
    first = tmp_path / "machine-1"
    result = first / "results/preflight/ar.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps({"ok": True}))
    push_file(store, first, "results/preflight/ar.json")
    second = tmp_path / "machine-2"
    units = store_units(["ar", "ddtree"], [], 1)
    assert pull(store, second, units).restored == ["results/preflight/ar.json"]  # ddtree's never ran
    restored = second / "results/preflight/ar.json"
    assert restored.read_bytes() == result.read_bytes()
    assert restored.stat().st_mtime == pytest.approx(result.stat().st_mtime, abs=1e-3)  # its points stay up to date
    assert pull(store, second, units).restored == []  # a result already here is left alone


def test_a_preflight_result_of_the_former_one_unit_layout_comes_back(store, tmp_path):
    first = tmp_path / "machine-1"
    (first / LEGACY_PREFLIGHTS).mkdir(parents=True)
    for preset in ("ar", "ddtree"):
        (first / LEGACY_PREFLIGHTS / f"{preset}.json").write_text(json.dumps({"preset": preset}))
    push_unit(store, first, LEGACY_PREFLIGHTS, first / LEGACY_PREFLIGHTS / MANIFEST)
    second = tmp_path / "machine-2"
    assert pull(store, second, store_units(["ddtree"], [], 1)).restored == ["results/preflight/ddtree.json"]
    assert json.loads((second / "results/preflight/ddtree.json").read_text()) == {"preset": "ddtree"}
    assert not (second / "results/preflight/ar.json").exists()


def test_the_preflight_job_copies_its_result_to_the_store_before_it_ends(tmp_path, monkeypatch, capsys):
    needs_rsync()
    monkeypatch.chdir(tmp_path)
    Path("results/preflight").mkdir(parents=True)
    Path("results/preflight/ar.json").write_text("{}")
    monkeypatch.delenv(STORE_ENV, raising=False)
    assert store_result("results/preflight/ar.json") and not (tmp_path / "store").exists()  # no store: nothing to do
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "store"))
    assert store_result("results/preflight/ar.json")
    assert (tmp_path / "store/results/preflight/ar.json").read_text() == "{}"
    assert json.loads((tmp_path / "store/results/preflight/ar.stored.json").read_text())["unit"] == (
        "results/preflight/ar.json")
    monkeypatch.setenv(STORE_ENV, "s3://")
    assert not store_result("results/preflight/ar.json")
    assert "cannot copy results/preflight/ar.json to the study store" in capsys.readouterr().err


def test_a_unit_without_its_manifest_is_never_taken_for_finished(tmp_path):
    needs_rsync()
    store = StudyStore.open(str(tmp_path / "store"))
    half = _unit(tmp_path / "machine-1")
    store.put(half, UNIT)  # the files arrived, the manifest (written last) did not
    report = pull(store, tmp_path / "machine-2", [UNIT])
    assert report.restored == []
    assert not (tmp_path / "machine-2" / UNIT / "done.json").exists()


def test_a_unit_that_does_not_match_its_manifest_is_refused_with_its_name(tmp_path):
    needs_rsync()
    store = StudyStore.open(str(tmp_path / "store"))
    source = _unit(tmp_path / "machine-1")
    push_unit(store, tmp_path / "machine-1", UNIT, source / MANIFEST)
    (tmp_path / "store" / UNIT / "status.json").write_text("{}")  # truncated behind the manifest's back
    with pytest.raises(StoreError, match="does not match its manifest"):
        pull(store, tmp_path / "machine-2", [UNIT])


def test_an_attempt_that_started_and_never_ended_is_reported_interrupted_on_the_next_machine(store, tmp_path):
    lost = tmp_path / "machine-1" / UNIT
    mark_attempt(lost, "a1", "start", {"host": "node-a", "started_utc": "2026-12-05T10:00:00+00:00"}, store, UNIT)
    report = pull(store, tmp_path / "machine-2", [UNIT])
    assert report.restored == []
    [attempt] = report.interrupted[UNIT]
    assert attempt["host"] == "node-a" and attempt["ended_utc"] is None


def test_the_attempts_of_a_unit_name_only_those_that_did_not_finish(tmp_path):
    unit = tmp_path / UNIT
    for attempt, end in (("a1", None), ("a2", {"error_kind": "interrupted", "reason": "SIGTERM"}),
                         ("a3", {"error_kind": "server_crash"}), ("a4", {"error_kind": None})):
        mark_attempt(unit, attempt, "start", {"host": "h"}, None, None)
        if end is not None:
            mark_attempt(unit, attempt, "end", end, None, None)
    lost = interrupted_attempts(unit)
    assert [a["attempt"] for a in lost] == ["a1", "a2"]
    assert lost[1]["how"] == "SIGTERM"
    assert [a["attempt"] for a in interrupted_attempts(unit, current="a1")] == ["a2"]


def test_a_point_jobs_marks_reach_the_store_at_start_and_end(tmp_path, monkeypatch):
    needs_rsync()
    store_dir = tmp_path / "store"
    monkeypatch.setenv("DDSWEEP_STORE", str(store_dir))
    out = tmp_path / "work" / UNIT
    with AttemptMarks(out) as marks:
        [start] = (store_dir / UNIT / "started").glob("*.start.json")
        assert not list((store_dir / UNIT / "started").glob("*.end.json"))
        marks.ended(None, None)
    [end] = (store_dir / UNIT / "started").glob("*.end.json")
    assert json.loads(end.read_text())["attempt"] == json.loads(start.read_text())["attempt"]


def test_an_attempt_left_by_an_exception_is_marked_ended_with_it(tmp_path):
    out = tmp_path / UNIT
    with pytest.raises(KeyboardInterrupt), AttemptMarks(out):
        raise KeyboardInterrupt
    assert [a["how"] for a in interrupted_attempts(out)] == ["KeyboardInterrupt()"]


def test_an_attempt_left_by_run_points_interruption_is_marked_interrupted(tmp_path):
    out = tmp_path / UNIT
    with pytest.raises(Interrupted), AttemptMarks(out):
        raise Interrupted("SIGTERM")
    assert [a["how"] for a in interrupted_attempts(out)] == ["Interrupted('SIGTERM')"]


@pytest.mark.parametrize("url, message", [
    ("relative/path", "absolute path"),
    ("gs://bucket/x", "only a filesystem path or s3://"),
    ("s3://", "s3://BUCKET/PREFIX"),
])
def test_a_bad_store_is_refused_with_what_is_expected(url, message):
    with pytest.raises(StoreError, match=message):
        parse_store(url)


def test_store_locations_and_units():
    assert parse_store("/shared/study/").root == "/shared/study"
    assert parse_store("file:///shared/study").provider == "fs"
    assert parse_store("s3://bucket/a/b").provider == "s3"
    assert unit_of(Path("/x/results/points/p1")) == "results/points/p1"
    assert unit_of(Path("/x/elsewhere/p1")) is None
    assert store_units(["ar", "ddtree"], ["ar", "p1"], 2) == [
        "results/preflight/ar.json", "results/preflight/ddtree.json", "results/points/ar",
        "results/launches/ar/launch-0", "results/launches/ar/launch-1", "results/points/p1",
        "results/launches/p1/launch-0", "results/launches/p1/launch-1"]
