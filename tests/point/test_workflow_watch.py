"""A point job whose workflow is gone stops its server and records the point as interrupted: Snakemake ended by a
SIGTERM of its own leaves its jobs running (the signal does not reach the process group), reparented."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import demo_record

from ddsweep.point.workflow_watch import (
    is_point_job,
    is_snakemake,
    launching_workflow,
    stop_point_jobs_on_sigterm,
)

SHUTDOWN_S = 3


@pytest.mark.parametrize(("cmdline", "expected"), [
    (["/venv/bin/snakemake", "--cores", "all"], True),
    (["/usr/bin/python3.11", "/venv/bin/snakemake", "--cores", "1"], True),
    (["python3", "-m", "snakemake", "--executor", "slurm-jobstep"], True),
    (["python", "-u", "-m", "snakemake"], True),
    (["python3", "-m", "pytest", "-k", "snakemake"], False),
    (["bash", "-c", "snakemake --cores 1"], False),
    (["/venv/bin/ddsweep", "run-point"], False),
    ([], False),
])
def test_a_snakemake_process_is_told_by_its_command_line(cmdline, expected):
    assert is_snakemake(cmdline) is expected


@pytest.mark.parametrize(("cmdline", "expected"), [
    (["/venv/bin/python3", "/venv/bin/ddsweep", "run-point", "--record", "{}"], True),
    (["python", "-m", "ddsweep", "run-point", "--point", "ar"], True),
    (["/venv/bin/python3", "/venv/bin/ddsweep", "sim-server", "--port", "1"], False),
    (["bash", "-c", "ddsweep run-point --record x"], False),
])
def test_a_point_job_is_told_by_its_command_line(cmdline, expected):
    assert is_point_job(cmdline) is expected


def test_snakemakes_sigterm_is_passed_to_its_point_jobs_once_however_often_the_workflow_is_read(monkeypatch):
    from snakemake.scheduling.job_scheduler import JobScheduler

    calls = []
    monkeypatch.setattr(JobScheduler, "exit_gracefully", lambda self, *args: calls.append(args))
    sent = []
    monkeypatch.setattr("ddsweep.point.workflow_watch.point_jobs",
                        lambda: [type("Job", (), {"send_signal": lambda self, sig: sent.append(sig)})()])
    assert stop_point_jobs_on_sigterm() and stop_point_jobs_on_sigterm()  # a second reading wraps nothing more
    JobScheduler.exit_gracefully(object(), signal.SIGTERM, None)
    assert sent == [signal.SIGTERM] and calls == [(signal.SIGTERM, None)]


def fake_snakemake(tmp_path: Path, command: str) -> subprocess.Popen:
    """A process whose command line is Snakemake's (`python .../snakemake`) that runs `command` as Snakemake runs a
    job, through `bash -c` with a tail after it (so the shell stays the job's parent), then waits."""
    script = tmp_path / "snakemake"
    script.write_text(f"#!{sys.executable}\nimport subprocess, sys, time\n"
                      f"subprocess.Popen(['bash', '-c', {command + ' || true'!r}])\ntime.sleep(600)\n")
    script.chmod(0o755)
    return subprocess.Popen([str(script)], cwd=tmp_path)


def test_a_job_finds_the_snakemake_that_launched_it_through_its_shell(tmp_path):
    found = tmp_path / "found.txt"
    job = tmp_path / "job.py"
    job.write_text("from ddsweep.point.workflow_watch import launching_workflow\n"
                   f"open({str(found)!r}, 'w').write(str(launching_workflow().pid))\n")
    workflow = fake_snakemake(tmp_path, f"{shlex.quote(sys.executable)} {job}")
    try:
        deadline = time.monotonic() + 20
        while not (found.exists() and found.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found.read_text() == str(workflow.pid)
    finally:
        workflow.kill()
        workflow.wait()
    assert launching_workflow() is None  # pytest is no workflow


def run_point_processes(out: Path) -> list[psutil.Process]:
    """Live `ddsweep run-point` processes writing to `out`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if "run-point" in cmdline and str(out) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


@pytest.mark.slow
def test_a_point_whose_workflow_is_terminated_alone_stops_its_server_and_records_the_interruption(tmp_path):
    marker = f"DDSWEEP_WATCH_TEST={tmp_path.name}"
    # a benchmark that outlasts the test: 200 ms a token, 256 tokens a request
    record = demo_record("ar", sim_args=["--sim-step-ms", "200", "--sim-startup-delay", "0.2"],
                         coding_eval={"enabled": False}, engine={"shutdown_timeout_s": SHUTDOWN_S,
                                                                 "env": dict([marker.split("=")])})
    out = tmp_path / "p"
    workflow = fake_snakemake(tmp_path, f"{shlex.quote(sys.executable)} -m ddsweep run-point --record "
                                        f"{shlex.quote(json.dumps(record))} --out {out} 2> {tmp_path / 'job.log'}")
    try:
        deadline = time.monotonic() + 60
        while not (out / "bench" / "requests.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (out / "bench" / "requests.jsonl").exists(), (tmp_path / "job.log").read_text()
        time.sleep(0.5)  # the benchmark's event loop is running
        workflow.send_signal(signal.SIGTERM)  # the workflow alone, not its process group
        workflow.wait(timeout=10)
        stopped = time.monotonic()
        while (run_point_processes(out) or _marked(marker)) and time.monotonic() < stopped + SHUTDOWN_S + 10:
            time.sleep(0.1)
        assert not run_point_processes(out) and not _marked(marker), (tmp_path / "job.log").read_text()
    finally:
        workflow.kill()
        for proc in run_point_processes(out):
            proc.kill()
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error_kind"] == "interrupted", failure
    assert failure["error"].startswith(f"interrupted by the end of the workflow that launched this job (snakemake "
                                       f"(pid {workflow.pid}) is gone)"), failure["error"]
    assert failure["steps"]["bench"] == "started" and not (out / "status.json").exists()
    assert "watching the workflow that launched this job" in (tmp_path / "job.log").read_text()


def _marked(marker: str) -> list[int]:
    from standin import marked_processes

    return marked_processes(marker)
