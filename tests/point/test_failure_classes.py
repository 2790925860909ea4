"""Failure classes: a configuration result is recorded (done.json) and never rerun; an infrastructure failure is
retried and left without done.json; a busy GPU is an infrastructure failure found before the launch."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import demo_record

from ddsweep.point.failures import CONFIGURATION, INFRASTRUCTURE, classify, record_digest
from ddsweep.point.gpus import check_gpus

NO_CODING = {"coding_eval": {"enabled": False}}
PATTERNS = {"infrastructure": ["CUDA out of memory", "NCCL error"], "configuration": ["error: unrecognized arguments"]}


def _run_point(record: dict, out: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddsweep", "run-point", "--record", json.dumps(record), "--out",
                           str(out), "--done", str(out / "done.json")], capture_output=True, text=True, timeout=120,
                          env=env, check=False)


@pytest.mark.parametrize(("kind", "log", "previous", "expected"), [
    ("verify", "", None, CONFIGURATION),
    ("startup_timeout", "", None, INFRASTRUCTURE),
    ("startup_timeout", "", {"error_kind": "startup_timeout", "record_sha256": "D"}, INFRASTRUCTURE),
    ("gpus_busy", "", None, INFRASTRUCTURE),
    ("startup_exit", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", None, INFRASTRUCTURE),
    ("server_crash", "[rank3] NCCL error: unhandled system error", {"error_kind": "server_crash",
                                                                    "record_sha256": "D"}, INFRASTRUCTURE),
    ("startup_exit", "launch_server.py: error: unrecognized arguments: --x", None, CONFIGURATION),
    ("startup_exit", "RuntimeError: boom", None, INFRASTRUCTURE),
    ("startup_exit", "RuntimeError: boom", {"error_kind": "startup_exit", "record_sha256": "D"}, CONFIGURATION),
    ("startup_exit", "RuntimeError: boom", {"error_kind": "server_crash", "record_sha256": "D"}, INFRASTRUCTURE),
    ("startup_exit", "RuntimeError: boom", {"error_kind": "startup_exit", "record_sha256": "other"}, INFRASTRUCTURE),
])
def test_a_failure_is_classified_by_kind_log_patterns_and_the_previous_attempt(kind, log, previous, expected):
    assert classify(kind, log, PATTERNS, "D", previous).failure_class == expected


def test_the_record_digest_ignores_operational_settings_and_follows_measurement_ones():
    record = demo_record("ar")
    slower = {**record, "engine": {**record["engine"], "startup_timeout_s": 9999}}
    other = {**record, "benchmark": {**record["benchmark"], "contexts": [64]}}
    assert record_digest(slower) == record_digest(record) != record_digest(other)


@pytest.mark.slow
def test_a_crash_is_retried_once_and_becomes_a_configuration_result_when_it_happens_again(tmp_path):
    record = demo_record("ar", sim_args=["--sim-fault", "exit-during-startup"], **NO_CODING)
    out = tmp_path / "p"
    first = _run_point(record, out)
    assert first.returncode == 1, first.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["failure_class"] == INFRASTRUCTURE and failure["attempt"] == 1
    assert not (out / "done.json").exists() and "failed-infrastructure" in first.stderr
    second = _run_point(record, out)
    assert second.returncode == 0, second.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["failure_class"] == CONFIGURATION and failure["attempt"] == 2, failure
    assert "happened again on retry" in failure["classified_by"]
    done = json.loads((out / "done.json").read_text())
    assert done["status"] == "failed" and done["error_kind"] == "startup_exit"
    assert done["reason"].startswith("the server exited with code 1 during startup") and "\n" not in done["reason"]


def test_a_server_that_refuses_its_flags_is_a_configuration_result_at_once(tmp_path):
    record = demo_record("ar", sim_args=["--sim-fault", "refuse-flags:--no-such-flag"], **NO_CODING)
    out = tmp_path / "p"
    result = _run_point(record, out)
    assert result.returncode == 0, result.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["failure_class"] == CONFIGURATION and "unrecognized arguments" in failure["classified_by"]
    assert json.loads((out / "done.json").read_text())["error_kind"] == "startup_exit"


def _fake_tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


NVIDIA_SMI = """case "$*" in
  *query-gpu*) printf '0, GPU-aaa\\n1, GPU-bbb\\n' ;;
  *query-compute-apps*) printf 'GPU-bbb, 4242, python3, 70000 MiB\\n' ;;
esac
"""


def test_a_process_on_one_of_the_jobs_gpus_is_found_and_one_on_another_gpu_is_not(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "nvidia-smi", NVIDIA_SMI)
    monkeypatch.setenv("PATH", str(tmp_path))
    busy = check_gpus({"CUDA_VISIBLE_DEVICES": "0,1"})
    free = check_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aaa"})
    assert busy.busy and busy.processes[0]["pid"] == "4242" and busy.processes[0]["gpu"] == "1"
    assert not free.busy and free.gpus == ["0"] and free.tool == "nvidia-smi"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    skipped = check_gpus({})
    assert skipped.tool is None and not skipped.busy and "skipped" in skipped.note


def test_amd_smi_processes_are_found_on_the_visible_gpus(tmp_path, monkeypatch):
    document = [{"gpu": 0, "process_list": [{"process_info": "No running processes detected"}]},
                {"gpu": 1, "process_list": [{"process_info": {"name": "python", "pid": 77}}]}]
    _fake_tool(tmp_path, "amd-smi", f"echo '{json.dumps(document)}'\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert check_gpus({"ROCR_VISIBLE_DEVICES": "1"}).processes == [{"gpu": "1", "pid": "77", "name": "python"}]
    assert not check_gpus({"ROCR_VISIBLE_DEVICES": "0"}).busy


def test_busy_gpus_fail_a_real_point_as_infrastructure_before_the_server_starts(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    _fake_tool(tools, "nvidia-smi", NVIDIA_SMI)
    record = {**demo_record("ar", **NO_CODING), "simulated": False}
    out = tmp_path / "p"
    result = _run_point(record, out, env={**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
                                          "CUDA_VISIBLE_DEVICES": "1"})
    assert result.returncode == 1, result.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error_kind"] == "gpus_busy" and failure["failure_class"] == INFRASTRUCTURE
    assert "pid 4242" in failure["error"] and not (out / "done.json").exists()
    assert json.loads((out / "gpu_check.json").read_text())["busy"] is True
    assert not (out / "server.log").exists() or "Serving HTTP" not in (out / "server.log").read_text()
