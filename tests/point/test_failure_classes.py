"""Failure classes: a configuration result is recorded (done.json) and never rerun; an infrastructure failure is
retried and, after the last attempt, recorded as persisted (rerun by the next invocation); a busy GPU is an
infrastructure failure found before the launch."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import demo_record

from ddsweep.config.operational import record_digest
from ddsweep.point.failures import (
    CONFIGURATION,
    INFRASTRUCTURE,
    classify,
    drop_persisted_records,
    engine_exceptions,
)
from ddsweep.point.gpus import check_gpus

NO_CODING = {"coding_eval": {"enabled": False}}
PATTERNS = {"infrastructure": ["CUDA out of memory", "NCCL error"], "configuration": ["error: unrecognized arguments"]}


def _run_point(record: dict, out: Path, env: dict | None = None, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddsweep", "run-point", "--record", json.dumps(record), "--out",
                           str(out), "--done", str(out / "done.json"), *extra], capture_output=True, text=True,
                          timeout=120, env=env, check=False)


# What the real DDTree build logged when its worker raised on the first request (SGLang's scheduler process).
SCHEDULER_CRASH = """[2026-12-03 09:12:01] INFO:     127.0.0.1:51234 - "POST /generate HTTP/1.1" 200 OK
[2026-12-03 09:12:01] Scheduler hit an exception: Traceback (most recent call last):
  File "/opt/sglang/python/sglang/srt/managers/scheduler.py", line 2771, in run_scheduler_process
    scheduler.event_loop_normal()
  File "/opt/sglang/python/sglang/srt/speculative/ddtree_worker_v2.py", line 872, in forward_batch_generation
    tree_mask = parent_mask + depth_mask
RuntimeError: The size of tensor a (7) must match the size of tensor b (4) at non-singleton dimension 1

[2026-12-03 09:12:01] Received sigquit from a child process. It usually means the child failed.
"""
OOM_CRASH = """Traceback (most recent call last):
  File "/opt/sglang/python/sglang/srt/model_executor/model_runner.py", line 900, in init_memory_pool
    self.req_to_token_pool = ReqToTokenPool(size)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
"""
REFUSAL = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/sglang/srt/server_args.py", line 5123, in _handle_speculative_decoding
    raise ValueError(
ValueError: DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'.
"""


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


# SGLang 0.5.23's refusals of a request that does not fit the context length, as a point's error carries them
REFUSED_COMPLETION = ("2 of 2 coding requests to http://127.0.0.1:1 failed (allowed fraction 0.05); first error: "
                      "HTTPStatusError: HTTP 400 from http://127.0.0.1:1/v1/chat/completions: Requested token count "
                      "exceeds the model's maximum context length of 256 tokens. You requested a total of 1212 "
                      "tokens: 188 tokens from the input messages and 1024 tokens for the completion.")
REFUSED_PROMPT = ("cell coding ctx=2048 C=1: 35 of 35 requests failed: HTTP 400: The input (1996 tokens) is longer "
                  "than the model's context length (1024 tokens).")


@pytest.mark.parametrize(("kind", "error", "expected"), [
    ("coding", REFUSED_COMPLETION, CONFIGURATION),
    ("bench_failures", REFUSED_PROMPT, CONFIGURATION),
    # the same failure without the server's reason: retried, as any first occurrence
    ("coding", "2 of 2 coding requests to http://127.0.0.1:1 failed (allowed fraction 0.05); first error: "
               "ReadTimeout: timed out", INFRASTRUCTURE),
])
def test_requests_refused_as_longer_than_the_context_are_the_configurations_result_at_once(kind, error, expected):
    found = classify(kind, "", PATTERNS, "D", None, error)
    assert found.failure_class == expected, found
    if expected == CONFIGURATION:
        assert "longer than its context length" in found.why and "context length" in found.why


def test_a_log_matching_an_infrastructure_pattern_wins_over_a_context_refusal():
    found = classify("coding", "CUDA out of memory", PATTERNS, "D", None, REFUSED_COMPLETION)
    assert found.failure_class == INFRASTRUCTURE and "infrastructure pattern" in found.why


# What SGLang printed at every start when deep_gemm's compiled library did not load (sgl-deep-gemm 0.2.5 with
# torch 2.11): it imports deep_gemm at start-up, whatever the preset.
LIBRARY_NOT_LOADED = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/sglang/srt/layers/deep_gemm_wrapper/configurer.py", line 14, in <module>
    import deep_gemm
  File "/venv/lib/python3.11/site-packages/deep_gemm/__init__.py", line 20, in <module>
    from . import _C
OSError: Could not load this library: /venv/lib/python3.11/site-packages/deep_gemm/_C.so
"""


@pytest.mark.parametrize(("log", "expected"), [
    (LIBRARY_NOT_LOADED, INFRASTRUCTURE),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nModuleNotFoundError: No module "
     "named 'sgl_kernel'\n", INFRASTRUCTURE),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nImportError: libcudart.so.13: "
     "cannot open shared object file: No such file or directory\n", INFRASTRUCTURE),
    # a machine exception that is not the software's (out of memory at this size) is deterministic on retry
    (OOM_CRASH, CONFIGURATION),
])
def test_software_that_does_not_load_is_the_environments_even_when_it_happens_again(log, expected):
    again = {"error_kind": "startup_exit", "record_sha256": "D"}
    found = classify("startup_exit", log, {}, "D", again)
    assert found.failure_class == expected, found
    if expected == INFRASTRUCTURE:
        assert "could not load its software" in found.why


@pytest.mark.parametrize(("kind", "log", "expected", "why"), [
    # the engine's own code raised: the configuration's, at once, whether the server exited or only its scheduler
    ("server_crash", SCHEDULER_CRASH, CONFIGURATION, "RuntimeError: The size of tensor a (7)"),
    ("bench_failures", SCHEDULER_CRASH, CONFIGURATION, "ddtree_worker_v2.py\", line 872"),
    ("startup_exit", REFUSAL, CONFIGURATION, "ValueError: DFLASH speculative decoding is not supported"),
    # out of memory is the machine's even with no pattern configured; a traceback of a server still running that
    # SGLang does not call fatal proves nothing
    ("server_crash", OOM_CRASH, INFRASTRUCTURE, "first occurrence"),  # (classified without PATTERNS below)
    ("bench_failures", REFUSAL, INFRASTRUCTURE, "first occurrence"),
    # a pattern of the point's failure_patterns decides before the traceback
    ("server_crash", SCHEDULER_CRASH + "[rank0] NCCL error: unhandled system error\n", INFRASTRUCTURE, "NCCL"),
])
def test_an_exception_from_the_engines_own_code_is_the_configurations_result(kind, log, expected, why):
    found = classify(kind, log, {} if log == OOM_CRASH else PATTERNS, "D", None)
    assert found.failure_class == expected and why in found.why, found


def test_the_tracebacks_of_a_log_are_read_with_their_innermost_frame():
    (raised,) = engine_exceptions(SCHEDULER_CRASH)
    assert raised.fatal and raised.line.startswith("RuntimeError: The size of tensor a (7) must match")
    assert raised.frame == 'File "/opt/sglang/python/sglang/srt/speculative/ddtree_worker_v2.py", line 872, ' \
                           "in forward_batch_generation"
    assert [e.fatal for e in engine_exceptions(OOM_CRASH + REFUSAL)] == [False, False]


def test_the_persisted_records_of_the_studys_points_are_dropped_and_no_other_record(tmp_path):
    def persisted(point: str) -> dict:
        return {"point_id": point, "status": "failed", "persisted": True, "attempts": 3,
                "failure_class": INFRASTRUCTURE}
    files = {"points/down/done.json": persisted("down"), "launches/x/launch-1/done.json": persisted("x"),
             "points/ok/done.json": {"point_id": "ok", "status": "ok"},
             "points/bad/done.json": {"point_id": "bad", "status": "failed"},
             "points/down/attempts/1/done.json": persisted("down"), "points/gone/done.json": persisted("gone"),
             "screen/x/done.json": persisted("x"), "points/x/done.json": {"point_id": "x", "status": "ok"},
             "launches/ok/launch-0/done.json": {"point_id": "ok", "status": "ok"}}
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(content))
    (tmp_path / "points/torn/done.json").parent.mkdir(parents=True)
    (tmp_path / "points/torn/done.json").write_text("{")
    dropped = drop_persisted_records(tmp_path, {"down", "x", "ok", "bad", "torn"}, ["points", "launches"])
    # a dropped launch takes its point's merged record with it (else Snakemake would not run the launch again)
    assert [Path(f).relative_to(tmp_path).as_posix() for f in dropped] == [
        "points/down/done.json", "launches/x/launch-1/done.json"]
    left = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("done.json")}
    gone = {"points/down/done.json", "launches/x/launch-1/done.json", "points/x/done.json"}
    assert left == set(files) - gone | {"points/torn/done.json"}


@pytest.mark.slow
def test_an_infrastructure_failure_on_the_last_attempt_is_recorded_as_persisted(tmp_path):
    record = demo_record("ar", sim_args=["--sim-fault", "never-healthy"], **NO_CODING)
    record["engine"]["startup_timeout_s"] = 1
    out = tmp_path / "p"
    first = _run_point(record, out, None, "--attempt", "1", "--attempts", "2")
    assert first.returncode == 1 and not (out / "done.json").exists(), first.stderr
    last = _run_point(record, out, None, "--attempt", "2", "--attempts", "2")
    assert last.returncode == 0, last.stderr
    done = json.loads((out / "done.json").read_text())
    assert done["status"] == "failed" and done["error_kind"] == "startup_timeout", done
    assert done["persisted"] is True and done["attempts"] == 2 and done["failure_class"] == INFRASTRUCTURE
    failure = json.loads((out / "failure.json").read_text())
    assert failure["persisted"] is True and failure["failure_class"] == INFRASTRUCTURE
    assert "the next invocation runs it again" in last.stderr


@pytest.mark.slow
def test_a_server_whose_engine_raises_on_the_first_request_is_a_configuration_result_at_once(tmp_path):
    record = demo_record("bs8-b8-t4-w2048", sim_args=["--sim-fault", "engine-exception"], **NO_CODING)
    out = tmp_path / "p"
    result = _run_point(record, out, None, "--attempt", "1", "--attempts", "3")
    assert result.returncode == 0, result.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error_kind"] == "server_crash" and failure["failure_class"] == CONFIGURATION, failure
    assert failure["attempt"] == 1 and "persisted" not in failure
    assert "the engine's own code raised an exception: RuntimeError: The size of tensor a (7)" in \
        failure["classified_by"]
    done = json.loads((out / "done.json").read_text())
    assert done["status"] == "failed" and "persisted" not in done
    assert "during the benchmark: RuntimeError: The size of tensor a (7)" in done["reason"]


@pytest.mark.slow
def test_a_coding_eval_the_context_cannot_hold_is_a_configuration_result_at_once(tmp_path):
    # HumanEval's prompts and coding_eval.max_tokens (1024) do not fit a context of 256 tokens: every request is
    # refused with SGLang's reason, the same on any machine, so no second start-up is spent on it
    record = demo_record("ar", sim_args=["--context-length", "256"], coding_eval={"limit": 2})
    record["benchmark"].update({"contexts": [128], "concurrency": [1], "repeats": 1, "requests_per_cell": 2,
                                "warmup_requests": 0, "min_window_s": 0,
                                "workloads": [{"name": "coding", "kind": "coding"}]})
    out = tmp_path / "p"
    result = _run_point(record, out, None, "--attempt", "1", "--attempts", "3")
    assert result.returncode == 0, result.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error_kind"] == "coding" and failure["failure_class"] == CONFIGURATION, failure
    assert failure["attempt"] == 1 and "maximum context length of 256 tokens" in failure["classified_by"]
    done = json.loads((out / "done.json").read_text())
    assert done["status"] == "failed" and "persisted" not in done


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


def test_a_dropped_screening_record_takes_the_selections_races_merged_points_and_summary_with_it(tmp_path):
    results = tmp_path / "results"
    derived = ["results/screen/round1.json", "results/screen/selection.json", "results/confirm/race-0.json",
               "results/confirm/race-1.json", "results/points/a/done.json", "reports/summary.json"]
    kept = ["results/screen/a/done.json", "results/confirm/a/launch-0/done.json", "reports/optimization_summary.md"]
    for name in derived + kept:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps({"point_id": "a", "status": "ok"}))
    assert drop_persisted_records(results, {"a", "f"}, ["screen", "confirm", "points"]) == []  # nothing persisted
    assert all((tmp_path / name).exists() for name in derived + kept)
    (results / "screen/f").mkdir()
    (results / "screen/f/done.json").write_text(json.dumps(
        {"point_id": "f", "status": "failed", "persisted": True, "failure_class": INFRASTRUCTURE}))
    dropped = drop_persisted_records(results, {"a", "f"}, ["screen", "confirm", "points"])
    assert [Path(f).relative_to(tmp_path).as_posix() for f in dropped] == ["results/screen/f/done.json"]
    assert not any((tmp_path / name).exists() for name in derived)  # derived again, in order, by this invocation
    assert all((tmp_path / name).exists() for name in kept)  # no launch or screening that ran is repeated
