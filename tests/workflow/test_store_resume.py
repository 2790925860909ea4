"""A study on GPU time that comes and goes: with a study store, losing the machine mid-study (workflow, point job and
server killed, working directory deleted) loses no finished point; an invocation in a fresh directory takes the
study from the store, reruns exactly the interrupted point and records the interruption. A time budget that fits
two of four points measures two, names the two missing, and the next invocation (here from an S3 store, in a fresh
directory) finishes the study."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import copy_workflow, needs_rsync

pytestmark = pytest.mark.full("studies of their own, interrupted and resumed from a store")

ROOT = Path(__file__).resolve().parents[2]
POINTS = ["ar", "bs8-b4-t2-w2048", "bs8-b8-t2-w2048", "bs8-b16-t2-w2048"]


def _study(startup_delay: float, **extra) -> dict:
    """Four points (ar and three budgets), one launch each, a tiny benchmark; each server takes `startup_delay` s
    to start, so that a point lasts long enough to be interrupted or to fill a time budget."""
    launcher = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())["engine"]["launcher"]
    launcher = [*launcher, "--sim-strict", "off"]
    launcher[launcher.index("--sim-startup-delay") + 1] = str(startup_delay)
    return {
        "engine": {"launcher": launcher, "startup_timeout_s": 60},
        "baselines": {"dflash": None},
        "sweep": {"launches": 1, "grid": {"budget": [4, 8, 16], "topk": [2], "block_size": [8], "window": [2048]},
                  "points": []},
        "benchmark": {"contexts": [128], "concurrency": [1], "max_new_tokens": 8, "requests_per_cell": 2,
                      "repeats": 1, "warmup_requests": 1, "warmup_window_s": 0, "workloads": [{"name": "coding",
                                                                                                 "kind": "coding"}]},
        "coding_eval": {"enabled": False},
        "analysis": {"regimes": [{"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
                                 {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128,
                                  "concurrency": 1}],
                     "priorities": {"latency_first": {"latency": 1.0}}},
        **extra,
    }


def _workdir(tmp_path: Path, name: str, study: dict) -> Path:
    workdir = copy_workflow(tmp_path / name)
    (workdir / "study.yaml").write_text(yaml.safe_dump(study))
    return workdir


def _command(*config: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", ".test/config.yaml", "study.yaml",
            "--config", *config]


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _run(workdir: Path, *config: str) -> subprocess.CompletedProcess:
    return subprocess.run(_command(*config), cwd=workdir, env=_env(), capture_output=True, text=True, timeout=600,
                          check=False)


def _ran(result: subprocess.CompletedProcess) -> list[str]:
    """The points whose job ran in an invocation (Snakemake's job log: `rule run_point:` ... `wildcards: point=`)."""
    lines = (result.stdout + result.stderr).splitlines()
    ran = []
    for i, line in enumerate(lines):
        if line.strip().endswith("rule run_point:"):
            names = [ln.split("point=")[1].split(",")[0].strip() for ln in lines[i:i + 12] if "point=" in ln]
            ran += names[:1]
    return sorted(ran)


def _statuses(workdir: Path) -> dict[str, str]:
    """Each point's status in the study's points table."""
    with open(workdir / "results" / "tables" / "points.csv", newline="") as handle:
        return {row["point_id"]: row["status"] for row in csv.DictReader(handle)}


def _kill_machine(process: subprocess.Popen) -> None:
    """What a lost machine does to its work: every process of the workflow (its point job, the server) ends at once."""
    family = psutil.Process(process.pid).children(recursive=True)
    for member in [psutil.Process(process.pid), *family]:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(family, timeout=10)
    process.wait(timeout=10)


@pytest.mark.slow
def test_a_lost_machine_loses_no_finished_point_and_a_fresh_directory_resumes_from_the_store(tmp_path):
    needs_rsync()
    store = tmp_path / "store"
    study = _study(startup_delay=3)
    first = _workdir(tmp_path, "machine-1", study)
    process = subprocess.Popen(_command(f"store={store}"), cwd=first, env=_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    # wait for one point in the store and another one running (its start marked in the store, not finished)
    deadline = time.monotonic() + 300
    interrupted = None
    while time.monotonic() < deadline and interrupted is None:
        stored = {p for p in POINTS if (store / "results" / "points" / p / "stored.json").exists()}
        running = [p for p in POINTS if p not in stored
                   and list((store / "results" / "points" / p / "started").glob("*.start.json"))]
        if stored and running:
            interrupted = running[0]
        time.sleep(0.1)
    assert interrupted is not None, "no point was stored while another one ran within 300 s"
    time.sleep(1.0)  # mid-way through the point
    _kill_machine(process)
    killed_at = time.time()
    shutil.rmtree(first)
    finished_before = {p: json.loads((store / "results" / "points" / p / "done.json").read_text())
                       for p in POINTS if (store / "results" / "points" / p / "stored.json").exists()}
    assert interrupted not in finished_before and finished_before
    # a preflight job ends once its result is in the store: a finished point never needs it rerun
    for point in finished_before:
        assert (store / "results" / "preflight" / f"{'ar' if point == 'ar' else 'ddtree'}.stored.json").exists()
    # every unit with its manifest in the store: the finished points and the preflight results
    stored_units = list(store.rglob("*stored.json"))

    second = _workdir(tmp_path, "machine-2", study)
    result = _run(second, f"store={store}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f"{len(stored_units)} finished job(s) taken from the store" in output
    assert f"results/points/{interrupted} was interrupted" in output
    # exactly the interrupted point and those never started ran again; no finished point did
    assert _ran(result) == sorted(set(POINTS) - set(finished_before))
    for point, done in finished_before.items():
        assert json.loads((second / "results" / "points" / point / "done.json").read_text()) == done
    rerun = second / "results" / "points" / interrupted
    done = json.loads((rerun / "done.json").read_text())
    assert done["status"] == "ok"
    [lost] = done["interrupted_attempts"]
    assert lost["ended_utc"] is None and "lost mid-way" in lost["how"]
    # the rerun holds no cell of the lost attempt: every file of the point is from after the kill
    status = json.loads((rerun / "status.json").read_text())
    assert not (rerun / "attempts").exists()
    assert all(path.stat().st_mtime >= killed_at for path in (rerun / "bench").rglob("*") if path.is_file())
    assert status["status"] == "ok"
    summary = (second / "reports" / "optimization_summary.md").read_text()
    assert f"`{interrupted}` **interrupted** 1 time(s) before it finished" in summary
    statuses = _statuses(second)
    assert all(statuses[p] == "ok" for p in POINTS), statuses
    # the store holds the finished study: its reports, and every point
    assert (store / "reports" / "optimization_summary.md").exists()
    assert all((store / "results" / "points" / p / "stored.json").exists() for p in POINTS)


@pytest.mark.slow
def test_a_time_budget_measures_what_fits_names_the_rest_and_the_next_invocation_finishes(tmp_path, s3_endpoint):
    store = f"s3://ddsweep-budget-{uuid.uuid4().hex[:12]}/study"
    # each job: a 20-s start-up and a little more (about 22 s), where resources.estimate says 10 s. The first job
    # starts on that estimate, the later ones on the median of the jobs finished by then: a third job, which cannot
    # start before 2 x 22 s have passed, does not fit the less than 22 s left of 62 s, where the 10-s estimate would
    # start it and it would end past the budget. Under a heavy load the second does not fit either.
    study = _study(startup_delay=20, resources={"estimate": {"startup_min": 1 / 6, "cell_min": 0.0, "coding_min": 0}})
    first = _workdir(tmp_path, "machine-1", study)
    result = _run(first, f"store={store}", "budget_s=62")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    measured = [p for p in POINTS
                if json.loads((first / "results" / "points" / p / "done.json").read_text())["status"] == "ok"]
    missing = sorted(set(POINTS) - set(measured))
    assert 1 <= len(measured) <= 2, output[-3000:]
    jobs = [json.loads((first / "results" / "points" / p / "status.json").read_text()) for p in measured]
    begun = [datetime.fromisoformat(job["started_utc"]).timestamp() for job in jobs]
    # none ran past the budget, which began before the first job (start times are in whole seconds)
    assert max(b + job["duration_s"] for b, job in zip(begun, jobs, strict=True)) <= min(begun) + 62 + 1
    assert f"{len(missing)} job(s) not started within the time budget" in output
    assert "Resume the study with: snakemake --cores all --configfile" in output
    # the summary names every job left out, under the time budget's cause (one group when their refusals read alike)
    summary = (first / "reports" / "optimization_summary.md").read_text()
    assert "not started within this invocation's time budget" in summary
    groups = json.loads((first / "reports" / "summary.json").read_text())["decision"]["failures"]["groups"]
    assert sorted(p for g in groups if g["error_kind"] == "time_budget" for p in g["not_started"]) == missing, groups
    for point in missing:
        assert f"`{point}`" in summary.split("### Failed, malformed and incomplete points")[1]
        assert f"`{point}` (not started)" in summary  # the first screen's line on the points it lacks
        done = json.loads((first / "results" / "points" / point / "done.json").read_text())
        assert "the median of the study's" in done["reason"], done

    second = _workdir(tmp_path, "machine-2", study)
    result = _run(second, f"store={store}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert _ran(result) == missing
    assert _statuses(second) == {p: "ok" for p in POINTS}
