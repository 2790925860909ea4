"""The real-engine check (.test/real-sglang.yaml): the workflow against a real SGLang 0.5.23 server on CPU.

One Snakemake run of `ar`, the upstream DFLASH baselines (overlap scheduler on and off) and one DDTree point,
through the normal rules and launcher, with the tiny random model of the real-engine environment
(.ci/sglang-real.sh). `ar` must complete against SGLang's own HTTP server, tokenizer and scheduler, its 64-token
context (shorter than any coding prompt) recorded as infeasible and its 512-token cells measured; both DFLASH
points must fail with SGLang's refusal on CPU as configuration results; the DDTree point must be stopped by the
preflight (upstream SGLang has no DDTree flags); the summary must report all four; and no process of any real
server may outlive the run.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow, venv_env
from realsglang import manifest

DFLASH_REFUSAL = "ValueError: DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'."
DFLASH = ("dflash-bs8-w2048", "dflash-nooverlap-bs8-w2048")
POINTS = ("ar", *DFLASH, "bs8-b8-t4-w2048")


def _processes_under(workdir: Path) -> dict[int, str]:
    """Live processes (pid -> command name) whose working directory is inside `workdir`: the workflow's jobs and
    every server process they started (SGLang's HTTP server, scheduler and detokenizer inherit it)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            if cwd == workdir or workdir in cwd.parents:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":  # the command and the kernel's name (setproctitle sets both)
                    command = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                    found[int(entry.name)] = f"{command} [{(entry / 'comm').read_text().strip()}]"
        except OSError:
            continue
    return found


class _Watcher(threading.Thread):
    """Records every process running under the workflow's directory while the workflow runs."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(daemon=True)
        self.workdir, self.seen, self.stop = workdir, {}, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid, name in _processes_under(self.workdir).items():
                self.seen.setdefault(pid, set()).add(name)
            self.stop.wait(0.2)


# every test reads one workflow run against a real server (minutes): the whole module is slow
pytestmark = [pytest.mark.slow, pytest.mark.full("a workflow of its own against a real SGLang server on CPU")]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict[int, str], float]:
    """The real-engine study run once through Snakemake; the processes seen meanwhile; its wall time."""
    env = manifest()
    workdir = copy_workflow(tmp_path_factory.mktemp("real"), strict_standin=True).resolve()
    # what depends on the machine, from the environment's manifest: the model (also the drafter the DFLASH
    # baseline names), the launcher's Python, the server's environment and CPU flags
    overlay = {"target": {"model_path": env["model_dir"], "server_args": env["server_args"]},
               "drafter": {"model_path": env["model_dir"]},
               "engine": {"launcher": [env["python"], "-m", "sglang.launch_server"], "env": env["env"]}}
    (workdir / "real-env.yaml").write_text(yaml.safe_dump(overlay))
    watcher = _Watcher(workdir)
    watcher.start()
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile",
                               ".test/real-sglang.yaml", "real-env.yaml"], cwd=workdir, env=venv_env(),
                              capture_output=True, text=True, timeout=1800, check=False)
    finally:
        watcher.stop.set()
        watcher.join()
    elapsed = time.monotonic() - started
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return workdir, done, watcher.seen, elapsed


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_ar_runs_in_full_against_the_real_server(real_run):
    workdir = real_run[0]
    point = workdir / "results/points/ar"
    status = _json(point / "status.json")
    assert status["status"] == "ok" and status["simulated"] is False
    assert status["steps"] == {"server": "ok", "verify": "ok", "bench": "ok", "coding": "ok", "stop": "ok"}
    command = _json(point / "point.json")["command"]
    assert command[1:3] == ["-m", "sglang.launch_server"] and "--device" in command
    info = _json(point / "server_info.json")
    assert info["version"] == "0.5.23" and "simulated" not in info and info["device"] == "cpu"
    verification = _json(point / "verification.json")
    assert verification["ok"] and verification["endpoint"] == "/server_info"
    assert {c["key"]: c["actual"] for c in verification["checks"]} == {"speculative_algorithm": None}
    # the server's log is SGLang's own
    assert "sglang" in (point / "server.log").read_text(errors="replace").lower()
    # no coding prompt fits 64 tokens as SGLang counts them: that cell is infeasible, the 512-token cells measured
    (cell,) = status["infeasible_cells"]
    assert (cell["workload"], cell["context"]) == ("coding", 64) and "no prompt can be sized" in cell["reason"]
    assert {c["context"] for c in _json(point / "bench/cells.json")["cells"]} == {512}


def test_every_measured_prompt_has_its_context_as_the_real_server_counts_it(real_run):
    workdir = real_run[0]
    bench = workdir / "results/points/ar/bench"
    config = yaml.safe_load((workdir / ".test/real-sglang.yaml").read_text())
    tolerance = _json(bench / "cells.json")["cells"][0]["context_tolerance"]
    requests = [json.loads(line) for line in (bench / "requests.jsonl").read_text().splitlines() if line.strip()]
    measured = [r for r in requests if not r["warmup"]]
    measurable = [c for c in config["benchmark"]["contexts"] if c != 64]  # 64 is infeasible (above)
    cells = len(measurable) * len(config["benchmark"]["concurrency"])
    # a cell runs for its window (benchmark.min_window_s) and at least requests_per_cell requests
    assert len(measured) >= cells * config["benchmark"]["requests_per_cell"] * config["benchmark"]["repeats"]
    assert len(measured) == sum(c["completed"] for c in _json(bench / "cells.json")["cells"])
    for r in requests:
        assert r["error"] is None, r
        assert abs(r["prompt_tokens"] - r["context"]) <= tolerance * r["context"], r
        # SGLang reports radix-cache hits per request; every record keeps them
        assert isinstance(r["cached_tokens"], int) and 0 <= r["cached_tokens"] <= r["prompt_tokens"], r
        assert r["completion_tokens"] and r["finish_reason"] in ("length", "stop")
    assert not any(c["prompt_tokens_off_target"] for c in _json(bench / "cells.json")["cells"])


def test_the_coding_eval_went_through_the_real_chat_endpoint(real_run):
    workdir = real_run[0]
    coding = workdir / "results/points/ar/coding"
    summary = _json(coding / "summary.json")
    assert summary["simulated"] is False and summary["problems"] == 2 and summary["request_failures"] == 0
    records = [json.loads(line) for line in (coding / "problems.jsonl").read_text().splitlines()]
    assert all(r["finish_reason"] in ("length", "stop") and r["completion_tokens"] for r in records)


@pytest.mark.parametrize("point_id", DFLASH)
def test_dflash_fails_with_sglangs_own_refusal_as_a_configuration_result(real_run, point_id):
    workdir = real_run[0]
    point = workdir / "results/points" / point_id
    failure = _json(point / "failure.json")
    assert failure["error_kind"] == "startup_exit" and DFLASH_REFUSAL in failure["error"]
    assert failure["failure_class"] == "configuration", failure  # the refusal is the configuration's, at once
    done = _json(point / "done.json")
    assert done["status"] == "failed" and DFLASH_REFUSAL in done["reason"]
    assert DFLASH_REFUSAL in (point / "server.log").read_text(errors="replace")


def test_the_ddtree_point_is_stopped_by_the_preflight_naming_the_flag(real_run):
    workdir = real_run[0]
    preflight = _json(workdir / "results/preflight/ddtree.json")
    assert preflight["ok"] is False
    errors = [f["message"] for f in preflight["findings"] if f["level"] == "error"]
    assert any(m.endswith("does not accept the flag --speculative-ddtree-budget") for m in errors), errors
    point = workdir / "results/points/bs8-b8-t4-w2048"
    done = _json(point / "done.json")
    assert done["status"] == "failed" and done["error_kind"] == "preflight"
    assert "--speculative-ddtree-budget" in done["reason"]
    assert not (point / "server.log").exists(), "the preflight must stop the point before any server start"
    for preset in ("ar", "dflash", "dflash-nooverlap"):
        assert _json(workdir / f"results/preflight/{preset}.json")["ok"] is True
    # the four presets' preflights asked SGLang's parser once, about every preset's commands
    (flags,) = (workdir / "results/preflight/.shared").glob("flags-*.json")
    assert len(_json(flags)["answer"]["results"]) >= 4


def test_the_summary_reports_all_four_and_is_labelled_a_toy(real_run):
    workdir = real_run[0]
    rows = {r["point_id"]: r for r in csv.DictReader((workdir / "results/tables/points.csv").open())}
    # ar's infeasible context makes it partial: measured, with the cell it lacks named
    assert {p: rows[p]["status"] for p in POINTS} == {"ar": "partial", **dict.fromkeys(DFLASH, "failed"),
                                                      "bs8-b8-t4-w2048": "failed"}
    assert "coding ctx=64 (not measurable" in rows["ar"]["missing_cells"]
    failures = {r["point_id"]: r for r in csv.DictReader((workdir / "results/tables/failures.csv").open())}
    assert all(failures[p]["error_kind"] == "startup_exit" for p in DFLASH)
    assert failures["bs8-b8-t4-w2048"]["error_kind"] == "preflight"
    summary = (workdir / "reports/optimization_summary.md").read_text()
    assert "SIMULATED" not in summary
    assert summary.splitlines()[2].startswith("> **Note.** Real SGLang 0.5.23 on a CPU with a tiny randomly")
    for point in POINTS:
        assert point in summary
    assert "--speculative-ddtree-budget" in summary and DFLASH_REFUSAL in summary


def test_no_process_of_the_real_servers_is_left(real_run):
    workdir, _, seen, _ = real_run
    names = {name for pid_names in seen.values() for name in pid_names}
    # SGLang's server is a tree: the HTTP server, the scheduler and the detokenizer (named by setproctitle)
    assert any("sglang::sched" in n for n in names) and any("sglang::detok" in n for n in names), names
    alive = _processes_under(workdir)
    assert alive == {}, f"processes left after the workflow: {alive}"
    assert not [pid for pid in seen if Path(f"/proc/{pid}").exists() and pid in _processes_under(workdir)]

