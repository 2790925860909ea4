"""One point's server lifecycle, through the same launcher code that starts a real server."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import demo_record
from standin import free_port

from ddsweep.point.lifecycle import (
    ManagedServer,
    ServerSpec,
    describe_failed_checks,
    owned_processes,
    render_server,
    verify_settings,
)
from ddsweep.point.run import PointFailed, run_point

NO_CODING = {"coding_eval": {"enabled": False}}


def _started(record: dict, tmp_path: Path, timeout_s: float = 20.0) -> ManagedServer:
    """Start the record's server and wait for it (the caller stops it)."""
    server = ManagedServer(render_server(record, free_port()), tmp_path / "server.log", shutdown_timeout_s=3)
    server.start()
    server.wait_until_healthy(timeout_s)
    return server


def test_render_server_fills_the_preset_template():
    record = demo_record("bs8-b8-t4-w2048")
    spec = render_server(record, 31234)
    cmd = spec.command
    assert cmd[:4] == [sys.executable, "-m", "ddsweep", "sim-server"]
    assert cmd[cmd.index("--speculative-ddtree-budget") + 1] == "8"
    assert cmd[cmd.index("--speculative-dflash-block-size") + 1] == "8"
    assert cmd[cmd.index("--speculative-draft-window-size") + 1] == "2048"
    assert cmd[cmd.index("--port") + 1] == "31234"
    assert spec.env == {"SGLANG_DDTREE_MAX_TOPK": "4"}
    assert spec.expected_server_args["speculative_ddtree_budget"] == 8
    assert spec.url == "http://127.0.0.1:31234"


def test_window_off_drops_the_window_flag_and_expects_none():
    spec = render_server(demo_record("bs8-b8-t4-woff"), 31234)
    assert "--speculative-draft-window-size" not in spec.command
    assert spec.expected_server_args["speculative_draft_window_size"] is None


def test_ar_point_has_no_speculative_flags():
    spec = render_server(demo_record("ar"), 31234)
    assert not [a for a in spec.command if a.startswith("--speculative")]
    assert spec.expected_server_args == {"speculative_algorithm": None}


def test_server_starts_verifies_and_stops_with_its_whole_tree(tmp_path):
    record = demo_record("bs8-b8-t4-w2048", sim_args=["--sim-fault", "spawn-child"])
    server = _started(record, tmp_path)
    try:
        info = server.server_info()
        assert info["speculative_ddtree_budget"] == 8 and info["ddsweep_endpoint"] == "/server_info"
        verification = verify_settings(server.spec, info, server.log_path.read_text())
        assert verification["ok"], verification
        assert verification["unverified"] == [{"knob": "topk", "value": 4,
                                               "reason": "no verify check of the preset reads this knob"}]
        assert len(owned_processes(server.owner_token)) >= 2  # the server and the child it spawned
    finally:
        server.stop()
    assert owned_processes(server.owner_token) == []
    assert server.exited() is not None


@pytest.mark.slow
def test_server_ignoring_sigterm_is_killed(tmp_path):
    record = demo_record("ar", sim_args=["--sim-fault", "ignore-sigterm"])
    server = _started(record, tmp_path)
    started = time.monotonic()
    killed = server.stop()
    assert time.monotonic() - started < 10
    assert killed, "the server ignored SIGTERM, so it must have been killed"
    assert owned_processes(server.owner_token) == []


def test_ignored_knob_fails_verification(tmp_path):
    record = demo_record("bs8-b8-t4-w2048", sim_args=["--sim-fault", "ignore-knob:budget"])
    server = _started(record, tmp_path)
    try:
        verification = verify_settings(server.spec, server.server_info(), server.log_path.read_text())
    finally:
        server.stop()
    failed = [c for c in verification["checks"] if not c["ok"]]
    assert [c.get("key", c["source"]) for c in failed] == ["speculative_ddtree_budget", "log"]
    assert failed[0]["expected"] == 8
    # the DDTree worker's start-up line shows the budget the stand-in really applied (its default, 16)
    assert failed[1]["logged"] == ["Initialized DDTree worker. block_size=8, tree_budget=16, max_tree_nodes=17 "
                                   "[simulated]"]
    assert "verify.log_patterns[0]" in failed[1]["reason"] and "tree_budget=16" in failed[1]["reason"]


def test_a_ddtree_worker_line_with_another_budget_fails_the_check_and_says_what_was_logged():
    """/server_info agrees, but the engine's own start-up line shows another budget (another tree rule)."""
    spec = render_server(demo_record("bs8-b8-t4-w2048"), 1)
    info = {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 8, "speculative_dflash_block_size": 8,
            "speculative_draft_window_size": 2048}
    good = "INFO Initialized DDTree worker. block_size=8, tree_budget=8, max_tree_nodes=9\n"
    assert verify_settings(spec, info, good)["ok"]
    other = "INFO Initialized DDTree worker. block_size=8, tree_budget=48, max_tree_nodes=49\n"
    result = verify_settings(spec, info, other)
    assert not result["ok"]
    (log_check,) = [c for c in result["checks"] if not c["ok"]]
    assert log_check["source"] == "log" and "tree_budget=48" in log_check["reason"]
    assert "another tree rule" in describe_failed_checks(result)
    missing = verify_settings(spec, info, "INFO Serving HTTP\n")
    assert not missing["ok"] and "pattern not found" in missing["checks"][-1]["reason"]


def test_log_pattern_is_checked(tmp_path):
    record = demo_record("bs8-b8-t4-w2048")
    spec = render_server(record, 1)
    spec.log_patterns = [r"max_topk=4\b", r"max_topk=7\b"]
    result = verify_settings(spec, {}, "DDTree config: budget=8 max_topk=4 block_size=8")
    assert [c["ok"] for c in result["checks"] if c["source"] == "log"] == [True, False]


def test_top_level_server_info_and_launch_command_are_checked():
    spec = render_server(demo_record("bs8-b8-t4-w2048"), 1)
    spec.launch_command = ["--speculative-ddtree-budget 8", "--speculative-ddtree-budget 9"]
    info = {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 8, "speculative_dflash_block_size": 8,
            "speculative_draft_window_size": 2048, "launch_command": "--model-path m --speculative-ddtree-budget 8"}
    result = verify_settings(spec, info, "")
    assert [c["ok"] for c in result["checks"] if c["source"] == "server_args"] == [True] * 4
    assert [c["ok"] for c in result["checks"] if c["source"] == "launch_command"] == [True, False]
    nested = verify_settings(spec, {"server_args": info}, "")  # the layout SGLang 0.5.23 does not have
    assert not nested["ok"] and "top-level key" in nested["checks"][0]["reason"]


def test_a_log_pattern_naming_topk_makes_it_verified():
    record = demo_record("bs8-b8-t4-w2048")
    assert render_server(record, 1).unverified_knobs == {"topk": 4}
    record["preset"]["verify"]["log_patterns"] = [r"max_topk={topk}\b"]
    spec = render_server(record, 1)
    assert spec.unverified_knobs == {} and spec.log_patterns == [r"max_topk=4\b"]


def test_server_info_falls_back_to_get_server_info_only_on_404(tmp_path):
    import http.server
    import threading

    class OldBuild(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = b'{"tp_size": 1}' if self.path == "/get_server_info" else b"{}"
            self.send_response(200 if self.path == "/get_server_info" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), OldBuild)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        spec = render_server(demo_record("ar"), httpd.server_address[1])
        info = ManagedServer(spec, tmp_path / "log").server_info()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert info == {"tp_size": 1, "ddsweep_endpoint": "/get_server_info"}


def test_server_exiting_during_startup_fails_within_seconds_with_log_tail(tmp_path):
    record = demo_record("ar", sim_args=["--sim-fault", "exit-during-startup"], **NO_CODING)
    started = time.monotonic()
    with pytest.raises(PointFailed) as error:
        run_point(record, tmp_path / "ar")
    assert time.monotonic() - started < 15
    assert error.value.kind == "startup_exit"
    assert "exited with code" in str(error.value) and "last log lines" in str(error.value)
    # the exception the server died of is named in the first line, which done.json keeps as the reason
    assert str(error.value).splitlines()[0].endswith(
        "RuntimeError: simulated failure while loading the model [simulated fault]; last log lines:")
    failure = json.loads((tmp_path / "ar" / "failure.json").read_text())
    assert failure["error_kind"] == "startup_exit" and failure["status"] == "failed"
    assert not (tmp_path / "ar" / "status.json").exists()


@pytest.mark.slow
def test_server_never_healthy_hits_the_startup_timeout(tmp_path):
    record = demo_record("ar", sim_args=["--sim-fault", "never-healthy"], engine={"startup_timeout_s": 3},
                         **NO_CODING)
    started = time.monotonic()
    with pytest.raises(PointFailed) as error:
        run_point(record, tmp_path / "ar")
    assert 3 <= time.monotonic() - started < 15
    assert error.value.kind == "startup_timeout"
    point = json.loads((tmp_path / "ar" / "point.json").read_text())
    assert owned_processes_of_port(point["port"]) == []


def owned_processes_of_port(port: int) -> list[int]:
    """Pids of stand-in servers still running with this port on their command line."""
    out = subprocess.run(["pgrep", "-f", f"sim-server.*--port {port}"], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def test_launcher_missing_fails_at_once_with_a_hint(tmp_path):
    record = demo_record("ar", **NO_CODING)
    record["engine"]["launcher"] = ["/nonexistent/python", "-m", "sglang.launch_server"]
    with pytest.raises(PointFailed, match="launcher '/nonexistent/python'.*demo"):
        run_point(record, tmp_path / "ar")


def test_real_server_without_sglang_fails_at_once_with_a_hint(tmp_path):
    record = demo_record("ar", **NO_CODING)
    record["simulated"] = False
    record["engine"]["launcher"] = [sys.executable, "-m", "sglang.launch_server"]
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("this interpreter has SGLang (no GPU tool is required: AMD and CPU builds have no nvidia-smi)")
    started = time.monotonic()
    with pytest.raises(PointFailed, match="SGLang is not installed.*snakemake --cores all --configfile .test"):
        run_point(record, tmp_path / "ar")
    assert time.monotonic() - started < 10
    assert not (tmp_path / "ar" / "server.log").exists(), "no server may be started"


def test_verification_failure_fails_the_point_and_keeps_the_records(tmp_path):
    record = demo_record("bs8-b8-t4-w2048", sim_args=["--sim-fault", "ignore-knob:window"], **NO_CODING)
    with pytest.raises(PointFailed) as error:
        run_point(record, tmp_path / "p")
    assert error.value.kind == "verify"
    assert "speculative_draft_window_size: expected 2048" in str(error.value)
    assert json.loads((tmp_path / "p" / "verification.json").read_text())["ok"] is False
    assert (tmp_path / "p" / "server_info.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_run_point_stops_the_server_and_leaves_the_point_incomplete(tmp_path, sig):
    """Slurm's SIGTERM, Ctrl-C's SIGINT, a closed terminal's SIGHUP: the server's process group goes too."""
    out = tmp_path / "p"
    proc, port = start_run_point_on_a_slow_server(out, subprocess.PIPE)
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == 143
    assert owned_processes_of_port(port) == []
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error_kind"] == "interrupted" and sig.name in failure["error"]
    assert not (out / "status.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_run_point_killed_outright_takes_its_server_with_it(tmp_path):
    """SIGKILL (a harness or scheduler killing the job's process group) leaves run-point no time to stop its
    server: the kernel does (PR_SET_PDEATHSIG)."""
    out = tmp_path / "p"
    proc, port = start_run_point_on_a_slow_server(out, subprocess.DEVNULL)
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while owned_processes_of_port(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert owned_processes_of_port(port) == []


def test_rerun_archives_the_previous_attempt(tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "failure.json").write_text("{}")
    record = demo_record("ar", sim_args=["--sim-fault", "exit-during-startup"], **NO_CODING)
    with pytest.raises(PointFailed):
        run_point(record, out)
    attempts = list((out / "attempts").iterdir())
    assert len(attempts) == 1 and (attempts[0] / "failure.json").read_text() == "{}"


def test_every_attempt_keeps_its_own_progress_log_with_its_record(tmp_path):
    """Snakemake removes a job's log file before each attempt: the point directory keeps each attempt's lines."""
    out = tmp_path / "p"
    with pytest.raises(PointFailed):
        run_point(demo_record("ar", sim_args=["--sim-fault", "exit-during-startup"], **NO_CODING), out)
    run_point(demo_record("ar", **NO_CODING), out)
    (first,) = (out / "attempts").iterdir()
    failed, done = (first / "progress.log").read_text(), (out / "progress.log").read_text()
    assert "ar: started " in failed and "starting server on" in failed
    assert re.search(r"FAILED \(startup_exit, \w+\): the server exited with code \d+ during startup", failed), failed
    assert "ar: started " in done and "server healthy after" in done and "FAILED" not in done


def start_run_point_on_a_slow_server(out: Path, stderr: int) -> tuple[subprocess.Popen, int]:
    """`ddsweep run-point` on a stand-in that takes 30 s to become healthy, returned once its server is starting."""
    record = demo_record("ar", sim_args=["--sim-startup-delay", "30"], **NO_CODING)
    proc = subprocess.Popen([sys.executable, "-m", "ddsweep", "run-point", "--record", json.dumps(record),
                             "--out", str(out)], stderr=stderr, text=True)
    deadline = time.monotonic() + 20
    while not (out / "point.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    port = json.loads((out / "point.json").read_text())["port"]
    assert owned_processes_of_port(port), "the server should be starting"
    return proc, port


def test_a_failure_while_the_server_is_still_dying_is_named_a_crash(tmp_path):
    """A dying server's connections close before its process ends: the failure waits for it to end, so one
    crash gets one kind on every attempt (the rule that tells a deterministic crash from the machine's)."""
    from ddsweep.point.run import _crash_or

    dying = [sys.executable, "-c", "import time; print('Traceback (most recent call last):'); "
             "print('  File \"x.py\", line 1, in f'); print('RuntimeError: boom', flush=True); "
             "time.sleep(1.0); raise SystemExit(3)"]
    server = ManagedServer(ServerSpec(command=dying, env={}, host="127.0.0.1", port=free_port()),
                           tmp_path / "server.log", shutdown_timeout_s=3)
    server.start()
    try:
        assert server.exited() is None  # still running when the requests failed
        failure = _crash_or(server, "benchmark", "bench_failures", "requests failed")
    finally:
        server.stop()
    assert failure.kind == "server_crash"
    assert "exited with code 3 during the benchmark: RuntimeError: boom" in str(failure)


def test_a_failure_of_a_server_that_lives_on_keeps_its_kind(tmp_path):
    from ddsweep.point.run import CRASH_GRACE_S, _crash_or

    living = [sys.executable, "-c", "import time; time.sleep(60)"]
    server = ManagedServer(ServerSpec(command=living, env={}, host="127.0.0.1", port=free_port()),
                           tmp_path / "server.log", shutdown_timeout_s=3)
    server.start()
    try:
        started = time.monotonic()
        failure = _crash_or(server, "benchmark", "bench_failures", "requests failed")
        waited = time.monotonic() - started
    finally:
        server.stop()
    assert failure.kind == "bench_failures" and str(failure) == "requests failed"
    assert CRASH_GRACE_S - 0.5 <= waited < CRASH_GRACE_S + 5
