"""Cluster features on the local Slurm: the resource keys reach sbatch (read back through `scontrol show job`); a
point that would outlast its time limit stops itself ahead of it, records `interrupted` with what it measured so
far, leaves no process behind and is resubmitted, and its last attempt is recorded as the invocation's result; a
two-node point runs one server per task."""

from __future__ import annotations

import json
import socket
import subprocess
import uuid

import yaml
from configs import study_yaml
from conftest import copy_workflow, demo_record, venv_env
from standin import marked_processes
from test_slurm import (
    CI_CLUSTER,
    NO_CODING,
    SNAKEMAKE,
    _slurm_answers,
    _wait_for,
    pytestmark,
    scontrol_job,
    submitted_points,
    write_config,
)

__all__ = ["pytestmark", "_slurm_answers"]


@CI_CLUSTER
def test_a_point_at_its_time_limit_stops_itself_is_resubmitted_and_its_last_attempt_recorded(tmp_path):
    workdir = copy_workflow(tmp_path)
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, check=True,
                          timeout=30).stdout.split()[0]
    marker = f"DDSWEEP_SLURM_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    demo = yaml.safe_load((workdir / ".test/config.yaml").read_text())
    launcher = list(demo["engine"]["launcher"])
    launcher[launcher.index("--sim-step-ms") + 1] = "60"  # about 1.5 s per request
    assert launcher[-2:] == ["--sim-strict", "off"]  # no SGLang import at start: the stop finds the benchmark
    extra = write_config(workdir, "limits.yaml", {
        "engine": {"env": {name: value}, "launcher": launcher, "startup_timeout_s": 30, "shutdown_timeout_s": 10},
        # the cells outlast the limit, the first alone about 100 s (64 distinct prompts fit every context)
        "benchmark": {"requests_per_cell": 64, "repeats": 1, "min_window_s": 300, "max_window_s": 600},
        # the point stops itself 60 s before the 2 min limit, about 60 s in: well into the benchmark (its server,
        # the lenient stand-in, starts in seconds; on a saturated CI machine a stop 25 s in came before any request
        # had finished) and ended before the executor's fourth status check (about 68 s after
        # submission: its interval grows by 10 s while no job ends). Not exclusive (the default with GPUs, tested
        # in test_slurm.py): other tests' jobs share the node.
        "resources": {"gpus": 1, "runtime_min": 2, "signal_lead_s": 60, "retries": 1, "constraint": "fakegpu",
                      "nodelist": node, "exclusive": False},
        **NO_CODING})
    command = [str(SNAKEMAKE), "results/points/ar/done.json", "--cores", "all", "--profile", "slurm",
               "--slurm-init-seconds-before-status-checks", "2", "--configfile", ".test/config.yaml", extra]
    with open(tmp_path / "limits.log", "w") as log:
        run = subprocess.Popen(command, cwd=workdir, env=venv_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            logs = workdir / ".snakemake/slurm_logs/rule_run_point/ar"
            job_id = _wait_for(lambda: [p.stem for p in logs.glob("*.log")] or _ended(run), 400,
                               "the first Slurm job")[0]
            job = scontrol_job(job_id)
            assert job["Features"] == "fakegpu", job
            assert job["ReqNodeList"] == node, job
            assert job["TimeLimit"] == "00:02:00", job
            assert run.wait(timeout=600) == 0  # the last attempt is recorded: the invocation goes on
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    output = (tmp_path / "limits.log").read_text()
    assert submitted_points(output) == ["ar", "ar"], output[-3000:]  # the interrupted point was resubmitted
    point = workdir / "results/points/ar"
    done = json.loads((point / "done.json").read_text())
    assert done["persisted"] is True and done["attempts"] == 2 and done["error_kind"] == "interrupted", done
    failures = [point / "failure.json", *sorted((point / "attempts").glob("*/failure.json"))]
    assert len(failures) == 2
    for path in failures:
        failure = json.loads(path.read_text())
        assert failure["error_kind"] == "interrupted" and "the Slurm job's time limit" in failure["error"], failure
        assert failure["steps"].get("bench") == "started" and failure["steps"]["stop"] == "ok", failure
        progress = (path.parent / "progress.log").read_text()
        assert failure["duration_s"] < 90, progress  # stopped 60 s ahead of the 2 min limit, not at it
        requests = (path.parent / "bench" / "requests.jsonl").read_text().splitlines()
        # the records written before the signal are kept: at least the warmup's (how many measured requests end
        # before it depends on how loaded the machine is)
        assert requests and all(json.loads(line)["simulated"] for line in requests), progress
        assert failure["host"] == socket.gethostname() and failure["slurm_job_id"], failure
    environment = json.loads((point / "environment.json").read_text())
    assert environment["slurm"]["nodelist"] == node and environment["slurm"]["node"] == node
    assert not marked_processes(marker)


def _ended(run: subprocess.Popen) -> None:
    """Fail at once when Snakemake has exited before submitting anything (e.g. a configuration error)."""
    assert run.poll() is None, "snakemake exited before submitting the point"


def test_a_two_node_point_runs_one_server_per_task_and_leaves_no_process(tmp_path):
    """Two tasks of one job stand in for two nodes: run-point in a job step, as the Slurm executor runs it."""
    marker = f"DDSWEEP_SLURM_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    ar = study_yaml()["engine"]["presets"]["ar"]
    group_args = ["--nnodes", "{nnodes}", "--node-rank", "{node_rank}", "--dist-init-addr", "{dist_init_addr}"]
    preset = {**ar, "args": ar["args"] + group_args}
    record = demo_record("ar", engine={"env": {name: value}, "presets": {"ar": preset}},
                         benchmark={"requests_per_cell": 2, "repeats": 1},
                         resources={"nodes": 2, "gpus": 0, "cpus_per_task": 1}, **NO_CODING)
    (tmp_path / "record.json").write_text(json.dumps(record))
    out = tmp_path / "p"
    job_id = subprocess.run(
        ["sbatch", "--parsable", "--ntasks=2", "--nodes=1", "--time=5", f"--output={tmp_path / 'job.log'}",
         "--wrap", f"srun -n1 --nodes=1 ddsweep run-point --record \"$(cat {tmp_path / 'record.json'})\" "
                   f"--out {out} --done {out / 'done.json'}"],
        capture_output=True, text=True, check=True, timeout=30, env=venv_env(), cwd=tmp_path).stdout.strip()
    _wait_for(lambda: job_id not in subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                                                   timeout=30).stdout.split(), 240, f"Slurm job {job_id} to end")
    log = (tmp_path / "job.log").read_text()
    assert json.loads((out / "done.json").read_text())["status"] == "ok", log[-3000:]
    status = json.loads((out / "status.json").read_text())
    assert status["steps"]["stop"] == "ok" and status["slurm_job_id"] == job_id
    ranks = json.loads((out / "ranks.json").read_text())
    assert ranks["nnodes"] == 2 and ranks["srun"][:3] == ["srun", "--overlap", "--ntasks=2"]
    assert [c[c.index("--node-rank") + 1] for c in ranks["commands"]] == ["0", "1"]
    server_log = (out / "server.log").read_text()
    assert "node rank 1 joined (2 of 2)" in server_log
    assert server_log.index("node rank 1 joined (2 of 2)") < server_log.index("Serving HTTP")  # rank 0 waited
    assert f"dist_init_addr='{ranks['dist_init_addr']}'" in server_log
    assert not marked_processes(marker)
