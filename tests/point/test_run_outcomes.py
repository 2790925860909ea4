"""run-point's exit status and terminal marker: a signal from outside is an interruption (no done.json, exit 143)
even when it reached the server at the same moment (configuration results: tests/point/test_failure_classes.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import demo_config, demo_record
from faketransformers import fake_transformers
from test_lifecycle import NO_CODING, owned_processes_of_port

import ddsweep.point.marks as marks_module
import ddsweep.point.run as run_module
from ddsweep.analysis.results import failed_cells_text, load_results
from ddsweep.bench.cells import run_coroutine
from ddsweep.cli import main as cli_main
from ddsweep.config.operational import record_digest
from ddsweep.point.marks import AttemptMarks, live_attempts
from ddsweep.point.preflight import check_matrix
from ddsweep.point.run import PointFailed, run_point
from ddsweep.slurm import parse_slurm_duration


def _run_point(record: dict, out, done, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ddsweep", "run-point", "--record", json.dumps(record), "--out",
                             str(out), "--done", str(done), *extra], stderr=subprocess.PIPE, text=True)


def test_a_point_whose_preset_the_preflight_refused_is_a_result_and_starts_no_server(tmp_path):
    record = demo_record("bs8-b8-t4-w2048", **NO_CODING)
    refusal = {"level": "error", "message": "SGLang (python) does not accept the flag --speculative-ddtree-budget",
               "preset": "ddtree", "points": ["bs8-b4-t1-w2048", "bs8-b8-t4-w2048"]}
    preflight = tmp_path / "ddtree.json"
    preflight.write_text(json.dumps({"study": "demo", "scope": "preset(s) ddtree", "ok": False, "findings": [
        {"level": "notice", "message": "simulated study", "preset": None, "points": []}, refusal]}))
    proc = _run_point(record, tmp_path / "p", tmp_path / "p" / "done.json", "--preflight", str(preflight))
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    done = json.loads((tmp_path / "p" / "done.json").read_text())
    assert done["status"] == "failed" and done["error_kind"] == "preflight"
    assert done["reason"] == ("stopped by the preflight before any server start: [preset ddtree] SGLang "
                              "(python) does not accept the flag --speculative-ddtree-budget (points: "
                              "bs8-b4-t1-w2048, bs8-b8-t4-w2048)")
    failure = json.loads((tmp_path / "p" / "failure.json").read_text())
    assert failure["steps"] == {"preflight": "failed"} and failure["error_kind"] == "preflight"
    point = json.loads((tmp_path / "p" / "point.json").read_text())
    assert "--speculative-ddtree-budget" in point["command"] and point["preset"] == "ddtree"
    assert point["record_digest"] == record_digest(record)  # what a store's pull compares with the configuration
    assert not (tmp_path / "p" / "server.log").exists(), "no server may be started"


@pytest.mark.slow
def test_a_passed_preflight_lets_the_point_run(tmp_path):
    record = demo_record("ar", **NO_CODING)
    record["benchmark"].update(contexts=[128], concurrency=[1], repeats=1, requests_per_cell=1, warmup_requests=0,
                               workloads=[{"name": "coding", "kind": "coding"}])
    preflight = tmp_path / "ar.json"
    preflight.write_text(json.dumps({"study": "demo", "scope": "preset(s) ar", "ok": True, "findings": []}))
    proc = _run_point(record, tmp_path / "p", tmp_path / "p" / "done.json", "--preflight", str(preflight))
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert json.loads((tmp_path / "p" / "done.json").read_text())["status"] == "ok"


@pytest.mark.slow
def test_sigterm_to_run_point_and_server_at_once_mid_benchmark_is_an_interruption(tmp_path):
    out, done = tmp_path / "p", tmp_path / "p" / "done.json"
    # the first cell (8 requests) is over in seconds; the whole matrix outlasts the signal by tens of seconds
    record = demo_record("ar", sim_args=["--sim-step-ms", "20"], benchmark={"requests_per_cell": 8, "repeats": 1},
                         sweep={"launches": 1}, **NO_CODING)
    proc = _run_point(record, out, done)
    deadline = time.monotonic() + 60
    requests = out / "bench" / "requests.jsonl"
    while time.monotonic() < deadline and not (requests.exists() and len(requests.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    port = json.loads((out / "point.json").read_text())["port"]
    for pid in [*owned_processes_of_port(port), proc.pid]:  # what Slurm does: every process of the job step
        os.kill(pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)  # read as it comes: a full pipe would stop run-point's next log line
    assert proc.returncode == 143, stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error_kind"] == "interrupted" and "SIGTERM" in failure["error"], failure
    assert not done.exists()
    assert len(requests.read_text().splitlines()) >= 3  # the measurements taken before the signal are kept
    assert owned_processes_of_port(port) == []


@pytest.mark.slow
def test_a_signal_handled_inside_one_of_the_event_loops_callbacks_ends_the_point_as_interrupted(monkeypatch,
                                                                                                  tmp_path):
    # A signal is handled wherever the main thread is: here inside a callback of the benchmark's event loop, as when
    # a prompt built in a thread hands its result back. Raised there, the interruption was swallowed by the loop, the
    # future the callback was resolving never resolved, and the benchmark waited forever.
    def benchmark(*_args) -> None:
        async def signalled_in_a_callback() -> None:
            loop = asyncio.get_running_loop()
            resolved = loop.create_future()

            def callback() -> None:
                signal.raise_signal(signal.SIGTERM)
                if not resolved.done():
                    resolved.set_result(None)

            loop.call_soon(callback)
            await asyncio.wait_for(resolved, 5)
            await asyncio.sleep(30)  # the rest of the matrix

        run_coroutine(signalled_in_a_callback())

    monkeypatch.setattr(run_module, "_benchmark", benchmark)
    started = time.monotonic()
    with pytest.raises(PointFailed) as failed:
        run_point(demo_record("ar", **NO_CODING), tmp_path / "p", progress=lambda _: None)
    assert failed.value.kind == "interrupted" and "interrupted by SIGTERM" in str(failed.value)
    assert time.monotonic() - started < 20
    assert json.loads((tmp_path / "p" / "failure.json").read_text())["error_kind"] == "interrupted"


@pytest.mark.slow
def test_a_point_stops_itself_before_its_slurm_time_limit_and_its_last_attempt_is_recorded(tmp_path):
    # a Slurm job with 9 s left (squeue -o %L, faked) and a lead of 5 s: the point stops itself 4 s in
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text('#!/bin/sh\n[ "$3" = 4242 ] && [ "$5" = %L ] && echo 0:09\n')
    (bin_dir / "squeue").chmod(0o755)
    env = {**os.environ, "SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    record = demo_record("ar", sim_args=["--sim-step-ms", "20"], benchmark={"requests_per_cell": 8, "repeats": 1},
                         sweep={"launches": 1}, **NO_CODING)
    out, done = tmp_path / "p", tmp_path / "p" / "done.json"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ddsweep", "run-point", "--record", json.dumps(record), "--out",
                           str(out), "--done", str(done), "--attempt", "2", "--attempts", "2",
                           "--time-limit-lead-s", "5"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr  # the last attempt: recorded, so the aggregate rules run
    assert time.monotonic() - started < 30  # the matrix alone outlasts this by far
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error_kind"] == "interrupted" and "the Slurm job's time limit (stopped 5 s before it" in \
        failure["error"], failure
    assert failure["steps"]["stop"] == "ok" and failure["persisted"] is True
    record_done = json.loads(done.read_text())
    assert record_done["persisted"] is True and record_done["error_kind"] == "interrupted"


def test_slurm_durations_are_read_in_every_form_squeue_prints() -> None:
    assert [parse_slurm_duration(t) for t in ("45", "2:30", "1:02:03", "3-04:05:06", "1-02")] == [
        45, 150, 3723, 273906, 93600]
    assert parse_slurm_duration("UNLIMITED") is None and parse_slurm_duration("NOT_SET") is None


def _matrix(record: dict, **bench: object) -> dict:
    """The record with a small benchmark matrix of one workload."""
    record["benchmark"].update({"concurrency": [1], "repeats": 1, "requests_per_cell": 4, "warmup_requests": 0,
                                "workloads": [{"name": "coding", "kind": "coding"}], **bench})
    return record


@pytest.mark.slow
def test_a_context_no_prompt_can_be_sized_to_is_infeasible_and_the_other_cells_are_measured(tmp_path):
    record = _matrix(demo_record("ar", **NO_CODING), contexts=[8, 128])
    status = run_point(record, tmp_path / "points" / "ar")
    assert status["status"] == "ok"
    (cell,) = status["infeasible_cells"]
    assert (cell["workload"], cell["context"]) == ("coding", 8) and "no prompt can be sized to context 8" in \
        cell["reason"]
    cells = json.loads((tmp_path / "points" / "ar" / "bench" / "cells.json").read_text())["cells"]
    assert [c["context"] for c in cells] == [128] and cells[0]["completed"] == cells[0]["requests"] > 0
    results = load_results(tmp_path)
    (point,) = results.points
    assert point.shown_status == "partial"
    assert "coding ctx=8 (not measurable: workload coding: no prompt can be sized" in failed_cells_text(point)
    assert results.points_frame()["missing_cells"].tolist() == [failed_cells_text(point)]


@pytest.mark.slow
def test_a_context_past_the_servers_context_length_is_infeasible_and_the_other_cells_are_measured(tmp_path):
    # the server's context length (--context-length, read from its /v1/models) holds a 128-token prompt and its 24
    # new tokens, not a 2048-token one: that cell would be refused request by request, so it is left out
    record = _matrix(demo_record("ar", sim_args=["--context-length", "1024"], **NO_CODING), contexts=[128, 2048])
    status = run_point(record, tmp_path / "points" / "ar")
    assert status["status"] == "ok"
    (cell,) = status["infeasible_cells"]
    assert (cell["workload"], cell["context"]) == ("coding", 2048)
    assert "24 new tokens may exceed the context length of 1024 tokens (the server's /v1/models)" in cell["reason"]
    cells = json.loads((tmp_path / "points" / "ar" / "bench" / "cells.json").read_text())["cells"]
    assert [c["context"] for c in cells] == [128] and cells[0]["completed"] == cells[0]["requests"] > 0


@pytest.mark.slow
def test_a_point_whose_every_context_is_infeasible_is_a_configuration_result(tmp_path):
    record = _matrix(demo_record("ar", **NO_CODING), contexts=[4, 8])
    with pytest.raises(PointFailed) as error:
        run_point(record, tmp_path / "p")
    assert error.value.kind == "infeasible" and error.value.is_result
    assert "no cell of the benchmark matrix can be measured: coding ctx=4 (" in str(error.value)


@pytest.mark.slow
def test_a_point_whose_every_cell_failed_its_threshold_is_failed_not_partial(tmp_path):
    # half the requests fail: every cell keeps some answers but fails max_failure_fraction
    record = _matrix(demo_record("ar", sim_args=["--sim-fault", "error-rate:0.5"], **NO_CODING),
                     contexts=[128, 256], requests_per_cell=8, max_failure_fraction=0.05)
    with pytest.raises(PointFailed) as error:
        run_point(record, tmp_path / "p")
    assert error.value.kind == "bench_failures"
    assert str(error.value).startswith("no measured cell: all 2 cells failed their failure threshold")
    assert not (tmp_path / "p" / "status.json").exists()
    assert json.loads((tmp_path / "p" / "failure.json").read_text())["error_kind"] == "bench_failures"


def test_the_preflight_reports_a_context_no_prompt_can_be_sized_to_before_any_server_starts(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", fake_transformers())
    contexts = [8, *demo_config()["benchmark"]["contexts"]]
    config = demo_config(benchmark={"contexts": contexts}, target={"model_path": str(tmp_path)})
    config["simulated"] = False  # the model directory's tokenizer (one token per character here)
    (finding,) = check_matrix(config)
    assert finding.level == "notice" and "recorded as infeasible by every point: coding ctx=8 (workload coding: " \
        "no prompt can be sized to context 8" in finding.message
    config = demo_config(target={"model_path": str(tmp_path)})
    config["simulated"] = False
    assert check_matrix(config) == []  # the demo's own contexts are all measurable
    config["target"]["model_path"] = str(tmp_path / "absent")  # not on this host: said, not guessed
    (finding,) = check_matrix(config)
    assert finding.message.startswith("benchmark contexts were not checked against the prompts' sizes: "
                                      "target.model_path")
    (finding,) = check_matrix(demo_config(benchmark={"contexts": contexts}))  # the stand-in counts at run time
    assert "simulated study" in finding.message


def test_the_preflight_reports_a_context_past_a_configured_context_length_before_any_server_starts():
    # --context-length in target.server_args is the server's context length: a 2048-token prompt and its 24 new
    # tokens do not fit 2000, a 128-token one does (the stand-in counts the prompts' sizes at run time); the demo's
    # coding eval retries truncated answers with 2048 tokens, which 2000 cannot hold either (tests/config)
    config = demo_config(target={"server_args": ["--context-length", "2000"]},
                         coding_eval={"retry_truncated_max_tokens": None})
    (finding,) = check_matrix(config)
    assert finding.level == "notice" and finding.message.startswith(
        "benchmark cell not measurable (--context-length 2000 in target.server_args), recorded as infeasible")
    assert "coding ctx=2048 (prompts of about 2048 tokens (within 3%) and 24 new tokens may exceed the context " \
        "length of 2000 tokens" in finding.message
    (finding,) = check_matrix(demo_config(target={"server_args": ["--context-length=2200"]}))  # 2048·1.03 + 24 fits
    assert "simulated study" in finding.message


def test_a_point_killed_while_its_end_mark_goes_to_the_store_keeps_its_done_record(monkeypatch, tmp_path):
    # the end mark is a network write: a job killed during it (SIGKILL, a hung store at the time limit) has
    # already written done.json, so the next attempt does not measure the finished point again
    status = {"status": "ok", "simulated": True, "duration_s": 1.0, "failed_cells": []}
    monkeypatch.setattr(run_module, "run_point", lambda *_args, **_kwargs: status)

    class KilledAtTheEndMark(AttemptMarks):
        def ended(self, error_kind, error) -> None:
            raise KeyboardInterrupt

    args = argparse.Namespace(done=str(tmp_path / "done.json"), preflight=None, time_limit_lead_s=None, attempt=1,
                              attempts=1)
    with pytest.raises(KeyboardInterrupt):
        run_module._run_and_record(args, {"point_id": "p"}, tmp_path / "p", KilledAtTheEndMark(tmp_path / "p"))
    assert json.loads((tmp_path / "done.json").read_text())["status"] == "ok"



def _fake_squeue(tmp_path, running_while: Path) -> str:
    """A PATH whose squeue lists job 4242 as RUNNING on node1 while `running_while` exists, job 78 as COMPLETED,
    job 79 as RUNNING on node9."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "squeue").write_text(f'#!/bin/sh\n[ "$3" = 4242 ] && [ -e {running_while} ] && echo RUNNING node1\n'
                                    '[ "$3" = 78 ] && echo COMPLETED node1\n[ "$3" = 79 ] && echo RUNNING node9\n'
                                    'exit 0\n')
    (bin_dir / "squeue").chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def _start_mark(out: Path, attempt: str, **info: object) -> None:
    (out / "started").mkdir(parents=True, exist_ok=True)
    (out / "started" / f"{attempt}.start.json").write_text(json.dumps({"attempt": attempt, "phase": "start", **info}))


def test_an_earlier_attempt_is_running_while_its_slurm_job_or_its_process_runs(tmp_path, monkeypatch):
    flag = tmp_path / "running"
    flag.touch()
    monkeypatch.setenv("PATH", _fake_squeue(tmp_path, flag))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    out = tmp_path / "p"
    _start_mark(out, "a-slurm", host="node1", pid=1, slurm_job_id="4242", started_utc="2026-12-07T10:00:00+00:00")
    _start_mark(out, "b-gone", host="node2", pid=1, slurm_job_id="77", started_utc="2026-12-07T09:00:00+00:00")
    _start_mark(out, "b-completed", host="node2", pid=1, slurm_job_id="78", started_utc="2026-12-07T09:00:00+00:00")
    # a job id from another cluster (marks pulled from a study store): here it names a job on another node
    _start_mark(out, "b-other-cluster", host="gpu-a.example.org", pid=1, slurm_job_id="79",
                started_utc="2026-12-07T09:00:00+00:00")
    _start_mark(out, "c-ended", host="node1", pid=1, slurm_job_id="4242", started_utc="2026-12-07T08:00:00+00:00")
    (out / "started" / "c-ended.end.json").write_text(json.dumps({"attempt": "c-ended", "phase": "end"}))
    host = socket.gethostname()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "run-point"]) as live, \
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        time.sleep(0.2)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        _start_mark(out, "d-here", host=host, pid=live.pid, slurm_job_id=None, started_utc=now)
        _start_mark(out, "e-not-a-point-job", host=host, pid=other.pid, slurm_job_id=None, started_utc=now)
        # a pid the attempt cannot have had: that process started after the attempt's mark
        _start_mark(out, "f-reused-pid", host=host, pid=live.pid, slurm_job_id=None,
                    started_utc="2026-12-07T00:00:00+00:00")
        assert [a["attempt"] for a in live_attempts(out)] == ["a-slurm", "d-here"]
        flag.unlink()  # Slurm no longer lists job 4242
        live.kill()
        live.wait()
        assert live_attempts(out) == []
        other.kill()


@pytest.fixture
def first_attempt_running(tmp_path, monkeypatch) -> tuple[Path, Path, Path]:
    """A point whose first attempt (Slurm job 4242, listed by squeue while the returned flag file exists) has
    measured some cells and is still running: (its directory, its done.json, the flag)."""
    flag = tmp_path / "running"
    flag.touch()
    monkeypatch.setenv("PATH", _fake_squeue(tmp_path, flag))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(marks_module, "LIVE_POLL_S", 0.05)
    out = tmp_path / "points" / "ar"
    _start_mark(out, "first", host="node1", pid=1, slurm_job_id="4242", started_utc="2026-12-07T10:00:00+00:00")
    (out / "bench").mkdir()  # what the first attempt has measured so far
    return out, out / "done.json", flag


def test_a_second_attempt_waits_for_the_running_one_and_keeps_its_record(first_attempt_running, capsys):
    # the Snakemake that submitted the first attempt was killed; a new invocation submits the point again while the
    # first attempt's Slurm job still measures it: the second waits, and takes the record the first one writes
    out, done, flag = first_attempt_running

    def first_attempt_finishes() -> None:
        time.sleep(0.5)
        done.write_text(json.dumps({"point_id": "ar", "status": "ok"}))
        flag.unlink()

    finisher = threading.Thread(target=first_attempt_finishes)
    finisher.start()
    record = demo_record("ar", **NO_CODING)
    assert cli_main(["run-point", "--record", json.dumps(record), "--out", str(out), "--done", str(done)]) == 0
    finisher.join()
    err = capsys.readouterr().err
    assert "an earlier attempt of this job is still running: attempt first (Slurm job 4242, host node1" in err
    assert "was finished by the attempt this one waited for; its record stands" in err
    assert json.loads(done.read_text())["status"] == "ok"
    assert sorted(p.name for p in out.iterdir()) == ["bench", "done.json", "started"]  # nothing moved or started
    assert sorted(p.name for p in (out / "started").iterdir()) == ["first.start.json"]


@pytest.mark.slow
def test_after_waiting_for_an_attempt_that_left_no_record_the_point_runs(first_attempt_running):
    out, done, flag = first_attempt_running
    threading.Timer(0.3, flag.unlink).start()  # the first attempt's job ends without a record (killed)
    record = _matrix(demo_record("ar", **NO_CODING), contexts=[128])
    assert cli_main(["run-point", "--record", json.dumps(record), "--out", str(out), "--done", str(done)]) == 0
    assert json.loads(done.read_text())["status"] == "ok"
    assert [a["attempt"] for a in json.loads(done.read_text())["interrupted_attempts"]] == ["first"]
    (archived,) = (out / "attempts").iterdir()  # the first attempt's files, kept apart
    assert (archived / "bench").is_dir()
