"""The Slurm profile for real: the demo through snakemake-executor-plugin-slurm on the single-node test cluster
that .ci/slurm-up.sh starts (GPUs there are generic resources backed by dummy devices)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow, demo_config, venv_env
from standin import marked_processes

from ddsweep.config.plan import running_points


def _slurm_answers() -> bool:
    """Whether a Slurm controller answers `sinfo` on this machine."""
    if shutil.which("sinfo") is None:
        return False
    try:
        done = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, timeout=15,
                              check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


# The marks of every test that submits to the local Slurm (also used by the other Slurm test modules).
SLURM_MARKS = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.full("submits jobs to the local Slurm and waits on its queue"),
    pytest.mark.skipif(not _slurm_answers(), reason="no Slurm controller answers `sinfo` here; start the test "
                       "cluster with `bash .ci/slurm-up.sh` (as root)"),
]
pytestmark = SLURM_MARKS


def _ci_cluster_lacks() -> str | None:
    """What this Slurm lacks of the CI's test cluster (.ci/slurm-up.sh: a node with at least 2 GPUs as generic
    resources and the `fakegpu` feature), or None when it has it."""
    if not _slurm_answers():
        return "no Slurm controller answers"
    done = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%G|%f"], capture_output=True, text=True,
                          timeout=15, check=False)
    for line in done.stdout.splitlines():
        gres, _, features = line.partition("|")
        gpus = [int(m) for m in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres)]
        if gpus and max(gpus) >= 2 and "fakegpu" in features.split(","):
            return None
    return (f"no node of this Slurm has 2 GPUs as generic resources and the fakegpu feature (sinfo: "
            f"{done.stdout.strip() or done.stderr.strip()!r})")


_LACKS = _ci_cluster_lacks()
# Tests that request GPUs or the `fakegpu` constraint: they need the CI's own cluster, not just any Slurm.
CI_CLUSTER = pytest.mark.skipif(_LACKS is not None, reason=f"needs the CI's test cluster (`bash .ci/slurm-up.sh` "
                                f"as root): {_LACKS}")

SNAKEMAKE = Path(sys.executable).with_name("snakemake")
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")
NO_CODING = {"coding_eval": {"enabled": False}}


def snakemake(workdir: Path, *configfiles: str, targets: tuple[str, ...] = (), timeout: float = 900,
              ) -> subprocess.CompletedProcess:
    """Run `snakemake --cores all --profile slurm` in the working copy, as a user types it from the root."""
    command = [str(SNAKEMAKE), *targets, "--cores", "all", "--profile", "slurm",
               "--slurm-init-seconds-before-status-checks", "2", "--configfile", ".test/config.yaml", *configfiles]
    return subprocess.run(command, cwd=workdir, env=venv_env(), capture_output=True, text=True, timeout=timeout,
                          check=False)


def submitted(output: str, rule: str) -> list[str]:
    """The wildcards of every sbatch submission of `rule` Snakemake reported (its Slurm log lives under
    rule_RULE/WILDCARDS/, the values joined by `_`); only point jobs, their launches and end-of-study reference
    runs may go to Slurm."""
    found = []
    for _, log in SUBMITTED.findall(output):
        parts = Path(log).parts
        assert parts[-3] in ("rule_run_point", "rule_launch_point", "rule_reference_run"), (
            f"a job other than a point went to Slurm: {log}")
        if parts[-3] == f"rule_{rule}":
            found.append(parts[-2])
    return found


def submitted_points(output: str) -> list[str]:
    """The point of every point job submitted: a run_point job, or one launch of a point (launch_point, whose
    wildcards are `POINT_LAUNCH`)."""
    return submitted(output, "run_point") + [w.rsplit("_", 1)[0] for w in submitted(output, "launch_point")]


def write_config(workdir: Path, name: str, data: dict) -> str:
    """Write an extra configuration file into the working copy; returns its name for --configfile."""
    (workdir / name).write_text(yaml.safe_dump(data))
    return name


def _output(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


# The demo made smaller for the Slurm round trips: each kind of preset (ar, the DFlash chain, DDTree) once, each
# point in two launch jobs, the coding eval in the last; one context.
SMALL_DEMO = {
    "sweep": {"grid": {"budget": [8], "topk": [4], "block_size": [8], "window": [2048]}, "points": []},
    "baselines": {"dflash": {"block_size": [8], "window": [2048], "no_overlap_preset": None}},
    "benchmark": {"contexts": [128], "concurrency": [1, 4], "repeats": 2,
                  "workloads": [{"name": "coding", "kind": "coding"}]},
    "coding_eval": {"limit": 2},
    "analysis": {"regimes": [{"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
                             {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128,
                              "concurrency": 4}],
                 "priorities": {"latency_first": {"latency": 1.0}, "throughput_first": {"throughput": 1.0}}},
}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The demo workflow, made small (SMALL_DEMO), run once through the Slurm executor in a working copy."""
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-demo"))
    return workdir, snakemake(workdir, write_config(workdir, "small.yaml", SMALL_DEMO))


def test_the_demo_runs_end_to_end_through_slurm(demo_run):
    workdir, done = demo_run
    assert done.returncode == 0, _output(done)[-3000:]
    points = [p.point_id for p in running_points(demo_config(**SMALL_DEMO))]
    assert len(points) == 3
    assert sorted(submitted_points(_output(done))) == sorted(points * 2)  # two launches of each, each a job
    for point in points:
        environment = json.loads((workdir / "results/points" / point / "environment.json").read_text())
        assert environment["slurm"]["job_id"], point
        assert (workdir / "results/points" / point / "status.json").exists()
    assert sorted(p.name for p in (workdir / "results/preflight").glob("*.json")) == ["ar.json", "ddtree.json",
                                                                               "dflash.json"]
    summary = (workdir / "reports/optimization_summary.md").read_text()
    # how to reproduce
    assert "snakemake --cores all --profile slurm --configfile .test/config.yaml --configfile small.yaml" in summary
    assert (workdir / "reports/bundle.json").exists()


def test_on_slurm_the_reference_runs_again_on_the_node_after_every_point(demo_run):
    workdir, done = demo_run
    assert done.returncode == 0, _output(done)[-3000:]
    node = json.loads((workdir / "results/points/ar/environment.json").read_text())["slurm"]["node"]
    assert submitted(_output(done), "reference_run") == [node]  # sweep.reference: auto is on under Slurm
    end = workdir / "results/reference" / f"end-{node}"
    environment = json.loads((end / "environment.json").read_text())
    assert environment["slurm"]["node"] == node and environment["slurm"]["job_id"]
    finished = max(json.loads((p / "status.json").read_text())["finished_utc"]
                   for p in (workdir / "results/points").iterdir())
    assert json.loads((end / "status.json").read_text())["started_utc"] >= finished
    document = json.loads((workdir / "reports/summary.json").read_text())
    caveat = next(c for c in document["caveats"] if c["kind"] == "reference_runs")
    assert caveat["comparisons"] and {c["host"] for c in caveat["comparisons"]} == {node}


def test_a_rerun_without_changes_submits_nothing(demo_run):
    workdir, first = demo_run
    assert first.returncode == 0
    done = snakemake(workdir, "small.yaml")
    assert done.returncode == 0, _output(done)[-3000:]
    assert SUBMITTED.findall(_output(done)) == []
    assert "Nothing to be done" in _output(done)


def test_a_config_change_to_one_point_submits_only_that_point(demo_run):
    workdir, first = demo_run
    assert first.returncode == 0
    grid = {**SMALL_DEMO["sweep"]["grid"], "window": [1024]}  # the DDTree point changes; ar and DFlash do not
    extra = write_config(workdir, "one-point.yaml", {"sweep": {"grid": grid}})
    done = snakemake(workdir, "small.yaml", extra)
    assert done.returncode == 0, _output(done)[-3000:]
    assert submitted_points(_output(done)) == ["bs8-b8-t4-w1024"] * 2  # its two launches
    # a point reran, so the end of the study moved: the reference runs again on the node
    assert len(submitted(_output(done), "reference_run")) == 1
    logs = workdir / ".snakemake/slurm_logs/rule_launch_point"
    assert [len(list((logs / f"bs8-b8-t4-w1024_{k}").glob("*.log"))) for k in (0, 1)] == [1, 1]
    assert all(len(list(d.glob("*.log"))) == 1 for d in logs.iterdir())


@CI_CLUSTER
def test_a_point_requesting_gpus_gets_them_from_slurm(tmp_path):
    workdir = copy_workflow(tmp_path)
    extra = write_config(workdir, "gpus.yaml", {"resources": {"gpus": 2}, "sweep": {"launches": 1}, **NO_CODING})
    done = snakemake(workdir, extra, targets=("results/points/ar/done.json",))
    assert done.returncode == 0, _output(done)[-3000:]
    assert submitted_points(_output(done)) == ["ar"]
    environment = json.loads((workdir / "results/points/ar/environment.json").read_text())
    assert environment["cuda_visible_devices"] == "0,1"
    assert environment["slurm"]["gpus_on_node"] == "2"
    job = scontrol_job(environment["slurm"]["job_id"])  # Slurm keeps an ended job for MinJobAge (300 s)
    assert job["OverSubscribe"] == "NO", job  # resources.exclusive: on by default with GPUs


def scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job` as key=value pairs."""
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True,
                          timeout=30).stdout
    return dict(item.split("=", 1) for item in text.split() if "=" in item)


def _wait_for(condition, timeout_s: float, what: str):
    """Poll until condition() is truthy; returns its value or fails naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")


def test_a_cancelled_point_leaves_no_server_and_is_rerun(tmp_path):
    workdir = copy_workflow(tmp_path)
    marker = f"DDSWEEP_SLURM_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    demo = yaml.safe_load((workdir / ".test/config.yaml").read_text())
    launcher = list(demo["engine"]["launcher"])
    launcher[launcher.index("--sim-startup-delay") + 1] = "30"
    marked = write_config(workdir, "marked.yaml", {"engine": {"env": {name: value}}, "resources": {"retries": 0},
                                                   "sweep": {"launches": 1}, **NO_CODING})
    slow = write_config(workdir, "slow.yaml", {"engine": {"launcher": launcher}})
    command = [str(SNAKEMAKE), "results/points/ar/done.json", "--cores", "all", "--profile", "slurm",
               "--slurm-init-seconds-before-status-checks", "2", "--configfile", ".test/config.yaml", marked, slow]
    with open(tmp_path / "cancelled.log", "w") as log:
        run = subprocess.Popen(command, cwd=workdir, env=venv_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            # other tests' jobs may hold the node first (an exclusive GPU job waits for it to be empty)
            _wait_for(lambda: marked_processes(marker), 400, "the point's server to start under Slurm")
            logs = workdir / ".snakemake/slurm_logs/rule_run_point/ar"
            job_id = _wait_for(lambda: [p.stem for p in logs.glob("*.log")], 10, "the Slurm log")[0]
            subprocess.run(["scancel", job_id], check=True, timeout=30)
            _wait_for(lambda: not marked_processes(marker), 25, "the server to stop after scancel")
            assert run.wait(timeout=180) != 0
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    point = workdir / "results/points/ar"
    assert not (point / "status.json").exists()
    failure = json.loads((point / "failure.json").read_text())
    assert failure["error_kind"] == "interrupted", failure
    assert "SIGTERM" in failure["error"]
    done = snakemake(workdir, marked, targets=("results/points/ar/done.json",))
    assert done.returncode == 0, _output(done)[-3000:]
    assert submitted_points(_output(done)) == ["ar"]
    assert (point / "status.json").exists()
    assert not marked_processes(marker)
