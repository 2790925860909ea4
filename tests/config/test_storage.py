"""Atomic result writes: complete or absent, never half-written, readable by the team."""

from __future__ import annotations

import os
import stat

import pytest

from ddsweep.storage import default_file_mode, read_json, read_jsonl, write_json_atomic, write_jsonl_atomic


def test_written_file_is_complete_and_has_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_json_atomic(tmp_path / "a" / "status.json", {"status": "ok"})
    finally:
        os.umask(old)
    assert read_json(path) == {"status": "ok"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_default_mode_follows_the_umask():
    old = os.umask(0o077)
    try:
        assert default_file_mode() == 0o600
    finally:
        os.umask(old)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = write_json_atomic(tmp_path / "cells.json", {"v": 1})

    def disk_full(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_json_atomic(path, {"v": 2})
    assert read_json(path) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["cells.json"]


def test_jsonl_round_trip(tmp_path):
    records = [{"i": 1}, {"i": 2, "error": None}]
    assert read_jsonl(write_jsonl_atomic(tmp_path / "r.jsonl", records)) == records
