"""A workflow stopped by a signal to Snakemake alone (`kill`, a wrapper's timeout, a CI limit: the signal does not
reach the process group) stops its running point: no `run-point` and no server outlives it by more than the
shutdown timeout plus 10 s, and the point is recorded as interrupted (and rerun by the next invocation). On
SIGTERM, Snakemake waits for its jobs and passes the signal on to them; killed outright, it is gone, and the point
job notices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import copy_workflow
from standin import marked_processes

pytestmark = pytest.mark.full("a workflow of its own, stopped by a signal")

ROOT = Path(__file__).resolve().parents[2]
SHUTDOWN_S = 3


def _run_points(workdir: Path) -> list[int]:
    """Live `ddsweep run-point` processes of the study in `workdir`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        if ("run-point" in (proc.info["cmdline"] or []) and proc.info["cwd"] == str(workdir)
                and proc.info["status"] != psutil.STATUS_ZOMBIE):
            found.append(proc.pid)
    return found


# the signal, what the point's failure.json says, and whether Snakemake writes that it waits for its jobs
STOPS = {"SIGTERM": (signal.SIGTERM, "interrupted by SIGTERM; the server was stopped", True),
         "SIGKILL": (signal.SIGKILL, "interrupted by the end of the workflow that launched this job (snakemake (pid",
                     False)}


@pytest.mark.slow
@pytest.mark.parametrize("stop", list(STOPS))
def test_a_signal_to_snakemake_alone_stops_the_running_point_and_records_it_interrupted(tmp_path, stop):
    sig, recorded, waits = STOPS[stop]
    workdir = copy_workflow(tmp_path / "study")
    marker = f"DDSWEEP_STOPPED_TEST={uuid.uuid4().hex}"
    launcher = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())["engine"]["launcher"]
    study = {  # the `ar` point alone, on a stand-in that takes 0.2 s a token: its benchmark outlasts the test
        "engine": {"launcher": [*launcher, "--sim-strict", "off", "--sim-step-ms", "200"],
                   "shutdown_timeout_s": SHUTDOWN_S, "env": dict([marker.split("=")])},
        "baselines": {"dflash": None},
        "sweep": {"launches": 1, "points": [], "constraints": ["budget > 100"]},
        "benchmark": {"contexts": [128], "concurrency": [1], "max_new_tokens": 256, "requests_per_cell": 8,
                      "repeats": 1, "warmup_requests": 1, "warmup_window_s": 0, "min_window_s": 0},
        "coding_eval": {"enabled": False},
        "analysis": {"regimes": [{"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
                                 {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128,
                                  "concurrency": 1}]},
    }
    (workdir / "stop.yaml").write_text(yaml.safe_dump(study))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    with open(tmp_path / "snakemake.log", "w") as log:
        workflow = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile",
                                     ".test/config.yaml", "stop.yaml"], cwd=workdir, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
    point = workdir / "results" / "points" / "ar"
    try:
        deadline = time.monotonic() + 180
        while not (point / "bench" / "requests.jsonl").exists() and time.monotonic() < deadline:
            assert workflow.poll() is None, (tmp_path / "snakemake.log").read_text()[-3000:]
            time.sleep(0.2)
        assert (point / "bench" / "requests.jsonl").exists(), (tmp_path / "snakemake.log").read_text()[-3000:]
        time.sleep(1.0)  # the point is measuring
        assert _run_points(workdir) and marked_processes(marker)
        workflow.send_signal(sig)  # Snakemake alone, not its process group
        signalled = time.monotonic()
        while (_run_points(workdir) or marked_processes(marker)) and time.monotonic() < signalled + SHUTDOWN_S + 10:
            time.sleep(0.2)
        left = _run_points(workdir), marked_processes(marker)
        print(f"\n[stopped-workflow] point job and server gone {time.monotonic() - signalled:.1f} s after {stop}")
        code = workflow.wait(timeout=30)  # Snakemake ends once its job has
    finally:
        workflow.kill()
        for pid in [*_run_points(workdir), *marked_processes(marker)]:
            os.kill(pid, signal.SIGKILL)
    log = (tmp_path / "snakemake.log").read_text()
    assert left == ([], []), (left, log[-3000:])
    assert code != 0 and ("Will exit after finishing currently running jobs" in log) == waits, log[-3000:]
    failure = json.loads((point / "failure.json").read_text())
    assert failure["error_kind"] == "interrupted" and failure["steps"]["bench"] == "started", failure
    assert failure["error"].startswith(recorded), failure["error"]
    assert not (point / "status.json").exists() and not (point / "done.json").exists()
