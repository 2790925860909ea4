"""Fault injection: each way a server, its port or the disk can fail, and what the point then records.

Every run checks the common contract: the point fails with failure.json and no status.json (or completes, where
the fault only costs tolerated requests), the message names the fault, the time to detect it is bounded,
what was measured stays on disk and no process of the server survives. Run with `-s` to print the measured
times (`[fault-matrix]` lines); docs/faults.md tabulates them."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from configs import study_yaml
from conftest import copy_workflow, demo_record
from standin import marked_processes

from ddsweep import storage
from ddsweep.analysis.results import load_results
from ddsweep.findings.operations import failed_points_caveat
from ddsweep.point import run as runpoint
from ddsweep.point.lifecycle import ManagedServer, find_free_port, owned_processes
from ddsweep.point.run import PointFailed, run_point

NO_CODING = {"coding_eval": {"enabled": False}}
FAST_START = ["--sim-startup-delay", "0.2"]
QUICK_STOP = {"engine": {"shutdown_timeout_s": 3}}


@dataclass
class Outcome:
    """How one faulty point ended: error kind (None if it completed), message, wall time, output directory."""

    kind: str | None
    message: str
    elapsed_s: float
    out: Path
    servers: list[ManagedServer]

    def lines(self, name: str = "bench/requests.jsonl") -> list[dict]:
        """The JSON Lines of a result file of the point."""
        return storage.read_jsonl(self.out / name)


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> list[ManagedServer]:
    """Every ManagedServer that run_point creates during the test, so their owner tokens can be checked."""
    created: list[ManagedServer] = []

    class Recording(ManagedServer):
        """A ManagedServer that registers itself."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            created.append(self)

    monkeypatch.setattr(runpoint, "ManagedServer", Recording)
    return created


def bench(**overrides: object) -> dict:
    """A benchmark section small enough for one fault (one context, few short requests)."""
    return {"contexts": [128], "concurrency": [1], "max_new_tokens": 8, "requests_per_cell": 4, "repeats": 1,
            "warmup_requests": 1, "max_failure_fraction": 0.05, "request_timeout_s": 10, "seed": 0,
            "request_rate": None, "cell_order": "fixed",
            "workloads": [{"name": "prose", "kind": "prose", "ignore_eos": True}], **overrides}


def faulty(point_id: str, sim_args: list[str], benchmark: dict | None = None, **sections: dict) -> dict:
    """A demo point record whose stand-in gets `sim_args`, with a small benchmark and no coding eval by default."""
    sections = {**NO_CODING, **QUICK_STOP, **sections}
    record = demo_record(point_id, sim_args=FAST_START + sim_args, **sections)
    record["benchmark"] = benchmark or bench()
    return record


def run_faulty(record: dict, out: Path, servers: list[ManagedServer], label: str) -> Outcome:
    """Run the point, check the common contract and print the measured detection time."""
    started = time.monotonic()
    try:
        status = run_point(record, out, progress=lambda _line: None)
        kind, message = None, f"completed; stop: {status['steps']['stop']}"
    except PointFailed as exc:
        kind, message = exc.kind, str(exc)
    elapsed = time.monotonic() - started
    assert servers, "run_point started no server"
    for server in servers:
        assert owned_processes(server.owner_token) == [], f"{label}: a server process survived"
    if kind is None:
        assert (out / "status.json").exists() and not (out / "failure.json").exists()
    else:
        failure = json.loads((out / "failure.json").read_text())
        assert (failure["status"], failure["error_kind"], failure["error"]) == ("failed", kind, message)
        assert not (out / "status.json").exists()
    assert (out / "point.json").exists() and (out / "server.log").exists()
    excerpt = message.splitlines()[0][:150]
    print(f"\n[fault-matrix] {label} | {kind or 'completed'} | {elapsed:.2f} s | {excerpt}")
    return Outcome(kind, message, elapsed, out, servers)


def alive(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def script(path: Path, text: str) -> Path:
    """Write an executable shell script."""
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# --------------------------------------------------------------------------- startup
@pytest.mark.parametrize(("fault", "engine", "kind", "pattern", "bound_s"), [
    ("exit-during-startup", {}, "startup_exit",
     r"exited with code 1 during startup.*simulated failure while loading the model", 10),
    ("never-healthy", {"startup_timeout_s": 2}, "startup_timeout", r"did not become healthy within 2 s", 10),
])
def test_startup_fault_kills_the_orphaned_helper_and_keeps_the_log(tmp_path, servers, fault, engine, kind, pattern,
                                                                  bound_s):
    record = faulty("ar", ["--sim-fault", "spawn-child", "--sim-fault", fault],
                    engine={"shutdown_timeout_s": 3, **engine})
    outcome = run_faulty(record, tmp_path / "ar", servers, fault)
    assert outcome.kind == kind
    assert re.search(pattern, outcome.message, re.DOTALL), outcome.message
    assert outcome.elapsed_s < bound_s
    log = (outcome.out / "server.log").read_text()
    child = int(re.search(r"helper child process pid=(\d+)", log).group(1))
    assert not alive(child), "the helper the server left behind must be killed with it"


def test_launcher_that_cannot_be_executed_fails_the_point_with_startup_exit(tmp_path, servers):
    launcher = tmp_path / "launcher"
    launcher.write_text("not a program\n")
    record = faulty("ar", [])
    record["engine"]["launcher"] = [str(launcher)]
    outcome = run_faulty(record, tmp_path / "ar", servers, "launcher not executable")
    assert outcome.kind == "startup_exit"
    assert "could not start the server command" in outcome.message and "Permission denied" in outcome.message


# --------------------------------------------------------------------------- port taken
def _pre_bound_port() -> socket.socket:
    """A listening socket on a free port, so a server started on it fails with 'address already in use'."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.slow
def test_port_taken_before_the_server_binds_it_is_retried_on_another_port(tmp_path, servers, monkeypatch):
    with _pre_bound_port() as taken:
        port = taken.getsockname()[1]
        ports = iter([port])
        monkeypatch.setattr(runpoint, "find_free_port", lambda host: next(ports, None) or find_free_port(host))
        outcome = run_faulty(faulty("ar", []), tmp_path / "ar", servers, "port taken once")
    assert outcome.kind is None
    assert [s.spec.port for s in servers][0] == port and len(servers) == 2
    assert json.loads((outcome.out / "point.json").read_text())["port"] == servers[1].spec.port != port
    assert "address already in use" in (outcome.out / "server.log").read_text()


class _ForeignHealth(BaseHTTPRequestHandler):
    """A foreign server that answers 200 to every GET."""

    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        """Stay quiet."""


def test_foreign_server_answering_on_the_taken_port_is_not_measured(tmp_path, servers, monkeypatch):
    foreign = ThreadingHTTPServer(("127.0.0.1", 0), _ForeignHealth)
    thread = threading.Thread(target=foreign.serve_forever, daemon=True)
    thread.start()
    try:
        port = foreign.server_address[1]
        ports = iter([port])
        monkeypatch.setattr(runpoint, "find_free_port", lambda host: next(ports, None) or find_free_port(host))
        outcome = run_faulty(faulty("ar", []), tmp_path / "ar", servers, "port held by a foreign server")
    finally:
        foreign.shutdown()
        foreign.server_close()
    assert outcome.kind is None
    assert [s.spec.port for s in servers][0] == port and len(servers) == 2
    info = json.loads((outcome.out / "server_info.json").read_text())
    assert info["simulated"] is True and info["port"] == servers[1].spec.port


def test_other_startup_failure_after_a_port_retry_is_not_blamed_on_the_port(tmp_path, servers):
    marker = tmp_path / "first-attempt-done"
    wrapper = script(tmp_path / "launch", f"""if [ ! -e {marker} ]; then
  touch {marker}; echo "OSError: [Errno 98] Address already in use"; exit 1
fi
echo "RuntimeError: CUDA out of memory"; exit 3
""")
    record = faulty("ar", [])
    record["engine"]["launcher"] = [str(wrapper)]
    outcome = run_faulty(record, tmp_path / "ar", servers, "port in use, then another startup error")
    assert outcome.kind == "startup_exit"
    assert len(servers) == 2
    assert "exited with code 3" in outcome.message and "already in use on all" not in outcome.message
    assert outcome.elapsed_s < 10


@pytest.mark.slow
def test_port_taken_on_every_attempt_fails_naming_the_port(tmp_path, servers, monkeypatch):
    with _pre_bound_port() as taken:
        port = taken.getsockname()[1]
        monkeypatch.setattr(runpoint, "find_free_port", lambda host: port)
        outcome = run_faulty(faulty("ar", []), tmp_path / "ar", servers, "port taken always")
    assert outcome.kind == "startup_exit"
    assert f"already in use on all {runpoint.PORT_ATTEMPTS} attempts" in outcome.message
    assert "address already in use" in outcome.message
    assert len(servers) == runpoint.PORT_ATTEMPTS
    assert outcome.elapsed_s < 20


# --------------------------------------------------------------------------- crashes during the measurements
def test_crash_mid_benchmark_fails_the_point_and_keeps_the_requests_measured_before(tmp_path, servers):
    # Warmup is generate request 1; the 4 measured requests are 2-5; the server dies 50 ms after admitting #3.
    record = faulty("ar", ["--sim-fault", "crash-after:3"], bench(max_new_tokens=32))
    outcome = run_faulty(record, tmp_path / "ar", servers, "crash-after:3 (mid-benchmark)")
    assert outcome.kind == "server_crash"
    assert "exited with code 1 during the benchmark" in outcome.message
    assert "cell context=128 concurrency=1 repeat=0" in outcome.message
    assert "Simulated crash after 3 generate requests" in outcome.message
    assert outcome.elapsed_s < 15
    lines = outcome.lines()
    assert [r["error"] is None for r in lines] == [True, True, False, False, False]
    assert lines[1]["completion_tokens"] == 32 and not lines[1]["warmup"]
    for name in ("server_info.json", "verification.json", "environment.json", "bench/cells.json"):
        assert (outcome.out / name).exists(), name


def test_server_killed_between_cells_fails_with_server_crash(tmp_path, servers, monkeypatch):
    from ddsweep.bench.workloads import PromptBuilder

    original = PromptBuilder.build
    builds: list[int] = []

    def kill_on_second_context(self: PromptBuilder, target_tokens: int, *args: object, **kwargs: object) -> object:
        builds.append(target_tokens)
        # the first 2048-token prompt is built by the context check before any cell; the second by its cell
        if builds.count(2048) == 2 and servers[-1].exited() is None:
            os.kill(servers[-1].process.pid, signal.SIGKILL)
            servers[-1].process.wait()
        return original(self, target_tokens, *args, **kwargs)

    monkeypatch.setattr(PromptBuilder, "build", kill_on_second_context)
    record = faulty("ar", [], bench(contexts=[128, 2048]))
    outcome = run_faulty(record, tmp_path / "ar", servers, "SIGKILL between cells")
    assert outcome.kind == "server_crash"
    assert "exited with code -9" in outcome.message and "could not count prompt tokens" in outcome.message
    cells = json.loads((outcome.out / "bench" / "cells.json").read_text())["cells"]
    assert [(c["context"], c["completed"]) for c in cells] == [(128, 4)]


@pytest.mark.slow
def test_crash_during_the_coding_eval_fails_the_point_and_keeps_the_answers(tmp_path, servers):
    # One benchmark request and one coding answer, then the server dies 50 ms after admitting the second one:
    # the eval itself tolerates failed requests, the point must not.
    record = faulty("ar", ["--sim-fault", "crash-after:3"], bench(requests_per_cell=1, warmup_requests=0),
                    coding_eval={"enabled": True, "limit": 3, "concurrency": 1, "retry_truncated_max_tokens": None})
    outcome = run_faulty(record, tmp_path / "ar", servers, "crash-after:3 (coding eval)")
    assert outcome.kind == "server_crash"
    assert "exited with code 1 during the coding eval" in outcome.message
    assert "Simulated crash after 3 generate requests" in outcome.message
    assert outcome.elapsed_s < 20
    problems = outcome.lines("coding/problems.jsonl")
    assert [p["error_kind"] == "request" for p in problems] == [False, True, True]
    assert problems[0]["completion_tokens"] > 0
    assert (outcome.out / "bench" / "cells.json").exists()


def test_a_server_that_hangs_after_n_requests_is_named_a_hang_after_the_stall_timeout(tmp_path, servers):
    # request_timeout_s 10: the default stall timeout is a tenth of it, and so is the probe's wait
    record = faulty("ar", ["--sim-fault", "hang:3"], bench(concurrency=[2], requests_per_cell=4))
    outcome = run_faulty(record, tmp_path / "ar", servers, "hang after 3 requests (stall_timeout_s 1)")
    assert outcome.kind == "server_hang"
    assert re.match(r"the server hung: no token arrived for 1\.\d s while [12] request\(s\) were in flight "
                    r"\(benchmark.stall_timeout_s 1 s\), and a one-token generation probe got no answer within 1 s",
                    outcome.message), outcome.message
    failure = json.loads((outcome.out / "failure.json").read_text())
    hang = failure["hang"]
    assert 2.0 <= hang["waited_s"] < 4 and hang["stall_timeout_s"] == 1 and hang["probe_timeout_s"] == 1
    assert f"after {hang['waited_s']:.1f} s without an answer" in outcome.message
    assert failure["steps"]["bench"] == "started" and failure["steps"]["stop"] == "ok"
    assert "Scheduler stopped after 3 generate requests" in (outcome.out / "server.log").read_text()
    records = outcome.lines()
    errors = [r["error"] for r in records]
    assert errors.count(None) >= 2 and all(e is None or e.startswith("server hang: no answer") for e in errors)
    # the hung requests were stopped at the hang, not at their 10 s request timeout
    hung = [r for r in records if r["error"] is not None]
    assert hung and all(r["e2e_s"] < 10 for r in hung), [r["e2e_s"] for r in hung]


# --------------------------------------------------------------------------- failed requests
REQUEST_FAULTS = [
    ("error-rate", r"HTTP 500: .*simulated internal server error"),
    ("malformed-rate", r"malformed stream chunk: '\{\"text\""),
    ("cut-stream-rate", r"ClientPayloadError: Response payload is not completed|stream ended without \[DONE\]"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "error"), REQUEST_FAULTS)
def test_failed_requests_below_the_threshold_are_recorded_and_counted(tmp_path, servers, fault, error):
    record = faulty("ar", ["--sim-fault", f"{fault}:0.25"],
                    bench(concurrency=[2], requests_per_cell=8, repeats=2, max_failure_fraction=0.5))
    outcome = run_faulty(record, tmp_path / "ar", servers, f"{fault}:0.25 (max_failure_fraction 0.5)")
    assert outcome.kind is None
    measured = [r for r in outcome.lines() if not r["warmup"]]
    failed = [r for r in measured if r["error"] is not None]
    assert failed, "the fault must have hit some requests"
    assert all(re.search(error, r["error"]) for r in failed), [r["error"] for r in failed]
    cells = json.loads((outcome.out / "bench" / "cells.json").read_text())["cells"]
    for cell in cells:
        in_cell = [r for r in measured if r["repeat"] == cell["repeat"]]
        assert cell["failed"] == sum(r["error"] is not None for r in in_cell)
        assert cell["completed"] + cell["failed"] == cell["requests"] == 8
    assert sum(c["failed"] for c in cells) == len(failed)


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "error"), REQUEST_FAULTS)
def test_failed_requests_above_the_threshold_fail_the_point_naming_the_cell(tmp_path, servers, fault, error):
    record = faulty("ar", ["--sim-fault", f"{fault}:1.0"], bench(max_failure_fraction=0.5))
    outcome = run_faulty(record, tmp_path / "ar", servers, f"{fault}:1.0 (max_failure_fraction 0.5)")
    assert outcome.kind == "bench_failures"
    assert "cell context=128 concurrency=1 repeat=0: 4 of 4 requests failed (allowed fraction 0.5)" in outcome.message
    assert re.search(error, outcome.message), outcome.message
    assert outcome.elapsed_s < 10
    cells = json.loads((outcome.out / "bench" / "cells.json").read_text())["cells"]
    assert [c["failed"] for c in cells] == [4]
    assert len(outcome.lines()) == 5


def test_a_cell_over_the_threshold_makes_a_partial_point_whose_other_cells_are_used(tmp_path, servers):
    # one request in four fails (the stand-in's seeded draws); no failure allowed: some cells fail, not all
    record = faulty("ar", ["--sim-fault", "error-rate:0.25"],
                    bench(contexts=[128, 256], requests_per_cell=4, repeats=2, max_failure_fraction=0.0))
    outcome = run_faulty(record, tmp_path / "points" / "ar", servers, "error-rate:0.25 (max_failure_fraction 0)")
    assert outcome.kind is None, outcome.message
    cells = json.loads((outcome.out / "bench" / "cells.json").read_text())["cells"]
    failed = [c for c in cells if c.get("cell_failed")]
    assert 0 < len(failed) < len(cells) == 4, [(c["failed"], c["requests"]) for c in cells]
    assert all(c["failed"] > 0 and "requests failed (allowed fraction 0)" in c["failure_reason"] for c in failed)
    status = json.loads((outcome.out / "status.json").read_text())
    assert [(c["context"], c["repeat"]) for c in status["failed_cells"]] == [(c["context"], c["repeat"])
                                                                              for c in failed]
    results = load_results(tmp_path)
    point = results.point("ar")
    assert point.shown_status == "partial" and results.ok_points() == [point]
    used = set(zip(results.cells["context"], results.cells["repeat"], strict=True))
    assert used == {(c["context"], c["repeat"]) for c in cells if not c.get("cell_failed")}
    assert results.points_frame().set_index("point_id").loc["ar", "status"] == "partial"
    row = results.failures_frame().set_index("point_id").loc["ar"]
    assert row["error_kind"] == "failed_cells" and f"ctx={failed[0]['context']}" in row["reason"]
    items = failed_points_caveat(SimpleNamespace(results=results))["items"]
    assert items == [f"`ar` **partial**: cell(s) it lacks, not used: {row['reason']}; its other cells count in every "
                     "regime they serve"]


# --------------------------------------------------------------------------- shutdown and leftovers
@pytest.mark.parametrize(("fault", "timeout_s", "killed"), [
    ("slow-shutdown:1", 5, False),
    ("slow-shutdown:30", 1, True),
    ("ignore-sigterm", 1, True),
])
@pytest.mark.slow
def test_slow_or_deaf_server_is_stopped_within_the_shutdown_timeout(tmp_path, servers, fault, timeout_s, killed):
    record = faulty("ar", ["--sim-fault", fault], engine={"shutdown_timeout_s": timeout_s})
    outcome = run_faulty(record, tmp_path / "ar", servers, f"{fault} (shutdown_timeout_s {timeout_s})")
    assert outcome.kind is None
    stop = json.loads((outcome.out / "status.json").read_text())["steps"]["stop"]
    assert stop.startswith("killed") if killed else stop == "ok"
    assert outcome.elapsed_s < timeout_s + 10
    assert servers[0].exited() == (-signal.SIGKILL if killed else 0)


def test_children_and_escaped_daemons_die_with_the_point(tmp_path, servers):
    pidfile = tmp_path / "daemon.pid"
    wrapper = script(tmp_path / "launch", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' "
                     "</dev/null >/dev/null 2>&1 &\nexec \"$@\"\n")
    record = faulty("ar", ["--sim-fault", "spawn-child"])
    record["engine"]["launcher"] = [str(wrapper), *record["engine"]["launcher"]]
    outcome = run_faulty(record, tmp_path / "ar", servers, "spawn-child + setsid daemon")
    assert outcome.kind is None
    child = int(re.search(r"helper child process pid=(\d+)", (outcome.out / "server.log").read_text()).group(1))
    daemon = int(pidfile.read_text())
    assert not alive(child) and not alive(daemon)


# --------------------------------------------------------------------------- disk
@pytest.mark.slow
def test_failed_result_write_fails_the_point_with_io_and_keeps_the_rest(tmp_path, servers, monkeypatch):
    real_write = storage.write_text_atomic

    def disk_full_under_bench(path: str | os.PathLike, text: str) -> Path:
        if Path(path).parent.name == "bench":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(path, text)

    monkeypatch.setattr(storage, "write_text_atomic", disk_full_under_bench)
    outcome = run_faulty(faulty("ar", []), tmp_path / "ar", servers, "disk full (bench/cells.json)")
    assert outcome.kind == "io"
    assert "No space left on device" in outcome.message and "cells.json" in outcome.message
    assert len(outcome.lines()) == 5  # every request was streamed to requests.jsonl before the failed write
    assert json.loads((outcome.out / "failure.json").read_text())["steps"]["bench"] == "started"


# --------------------------------------------------------------------------- the workflow
def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run Snakemake on the demo plus the fault override in `workdir`."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", ".test/config.yaml",
                           "faults.yaml", *args], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=240, check=False)


def _job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run or dry run, as {rule: count}."""
    table = output.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)
            if m.group(1) != "total"}


@pytest.mark.slow
@pytest.mark.full("a fault study of its own through Snakemake")
def test_workflow_records_a_crashing_point_as_a_result_and_reruns_only_it_on_request(tmp_path):
    copy_workflow(tmp_path)  # the lenient stand-in: SGLang's contract is not what a crash tests
    presets = study_yaml()["engine"]["presets"]
    crashy = {**presets["ddtree"], "args": [*presets["ddtree"]["args"], "--sim-fault", "crash-after:5"]}
    marker = f"DDSWEEP_TEST={uuid.uuid4().hex}"  # on every server of this study, and on no other test's
    name, value = marker.split("=")
    override = {
        "engine": {"presets": {"crashy": crashy}, "env": {name: value}},
        "sweep": {"grid": {"budget": [4], "topk": [2], "block_size": [8], "window": [2048]},
                  "points": [{"preset": "crashy", "budget": 8, "topk": 4, "block_size": 8, "window": 2048}]},
        "benchmark": {"contexts": [128], "concurrency": [1], "max_new_tokens": 32, "requests_per_cell": 8,
                      "repeats": 1, "warmup_requests": 1, "workloads": [{"name": "coding", "kind": "coding"}]},
        "coding_eval": {"limit": 2, "concurrency": 2},
        "analysis": {"regimes": [{"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
                                 {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128,
                                  "concurrency": 1}]},
    }
    (tmp_path / "faults.yaml").write_text(yaml.safe_dump(override))
    started = time.monotonic()
    first = _snakemake(tmp_path, "--keep-going")
    elapsed = time.monotonic() - started
    print(f"\n[fault-matrix] workflow with a crash-after:5 point | --keep-going run | {elapsed:.2f} s")
    assert first.returncode == 0, first.stderr[-3000:]
    points = tmp_path / "results" / "points"
    for good in ("bs8-b4-t2-w2048", "ar", "dflash-bs8-w2048"):
        assert json.loads((points / good / "status.json").read_text())["status"] == "ok", first.stderr[-3000:]
    bad = points / "crashy-bs8-b8-t4-w2048"
    failure = json.loads((bad / "failure.json").read_text())
    assert failure["error_kind"] == "server_crash" and "Simulated crash after 5" in failure["error"]
    assert not (bad / "status.json").exists()
    requests = storage.read_jsonl(bad / "bench" / "requests.jsonl")
    # the requests answered before the crash and those it cut are kept (how many were in flight depends on the
    # concurrency of the batch it hit: a settling warm-up may run past the fifth request)
    assert sum(r["error"] is None for r in requests) >= 4 and sum(r["error"] is not None for r in requests) >= 1
    assert marked_processes(marker) == [], "a server of the study survived"
    assert json.loads((bad / "done.json").read_text())["error_kind"] == "server_crash"
    again = _snakemake(tmp_path, "-n")
    assert again.returncode == 0, again.stderr[-3000:]
    attempts = [*(json.loads(f.read_text()) for f in sorted(bad.glob("attempts/*/failure.json"))), failure]
    # a configuration's failure is a result: the crash was named alike on both attempts
    assert "Nothing to be done" in again.stdout + again.stderr, [(a["error_kind"], a["error"][:200]) for a in attempts]
    forced = _snakemake(tmp_path, "-n", "--forcerun", "results/points/crashy-bs8-b8-t4-w2048/done.json")
    dry = forced.stdout + forced.stderr
    counts = _job_counts(dry)
    assert counts["run_point"] == 1 and {"summarize", "bundle", "all"} <= set(counts)
    assert set(counts.values()) == {1}, counts
    assert set(re.findall(r"point=([\w-]+)", dry)) == {"crashy-bs8-b8-t4-w2048"}
