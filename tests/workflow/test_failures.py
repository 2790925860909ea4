"""Failures as results: a study with one point per server fault of the stand-in still writes its summary, tables
and bundle, naming each failed point, its kind and why; the failed points are not rerun by the next invocation.
Infrastructure failures are retried; one that persists through the last attempt is recorded as that invocation's
result (the summary names it as the machine's), and the next invocation runs the point again."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
import yaml
from configs import study_yaml
from conftest import copy_workflow
from standin import marked_processes

pytestmark = pytest.mark.full("a fault study of its own per test")

ROOT = Path(__file__).resolve().parents[2]

# preset name -> (stand-in fault flags, the error kind the point must record). Each is a configuration result:
# refused flags at once (the preset's pattern), an exception in the engine's code at once (its traceback), the
# others when they happen again on the retry. `hang:3`: the server's scheduler stops after 3 generate requests.
FAULTS = {
    "fexit": (["exit-during-startup"], "startup_exit"),
    "frefuse": (["refuse-flags"], "startup_exit"),
    "fcrash": (["crash-after:3"], "server_crash"),
    "fhang": (["hang:3"], "server_hang"),
    "fhttp": (["error-rate:1.0"], "bench_failures"),
    "fmalformed": (["malformed-rate:1.0"], "bench_failures"),
    "fcut": (["cut-stream-rate:1.0"], "bench_failures"),
    "fknob": (["ignore-knob:budget"], "verify"),
    "fraise": (["engine-exception"], "server_crash"),
}
# A server that serves but ignores SIGTERM: the point completes, its stop needs SIGKILL, and the summary says so.
STUBBORN = {"fsigterm": (["ignore-sigterm"], None)}


def _study(faults_of: dict | None = None) -> dict:
    """Demo overrides: one healthy grid point, the baselines and one point per faulty preset, a tiny benchmark."""
    presets = study_yaml()["engine"]["presets"]
    faulty = {}
    faults_of = FAULTS if faults_of is None else faults_of
    for name, (faults, _) in faults_of.items():
        args = list(presets["ddtree"]["args"])
        for fault in faults:
            args += ["--sim-fault", fault]
        faulty[name] = {**presets["ddtree"], "args": args}
    # The lenient stand-in: the strict one spends seconds importing SGLang at every start, and the 6 s startup
    # limit (which bounds the never-healthy case) is about the faults, not the contract (tests/contract/).
    launcher = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())["engine"]["launcher"]
    return {
        "engine": {"presets": faulty, "startup_timeout_s": 6, "launcher": [*launcher, "--sim-strict", "off"]},
        # one launch per point: each fault's outcome in results/points/<id>/ (launches: tests/workflow/test_workflow.py)
        # and no DFlash baseline: the healthy points are ar and one grid point
        "baselines": {"dflash": None},
        "sweep": {"launches": 1, "grid": {"budget": [4], "topk": [2], "block_size": [8], "window": [2048]},
                  "points": [{"preset": name, "budget": 8, "topk": 4, "block_size": 8, "window": 2048}
                             for name in faults_of]},
        # counted warm-ups: the crash thresholds below count requests
        "benchmark": {"contexts": [128], "concurrency": [1], "max_new_tokens": 16, "requests_per_cell": 4,
                      "repeats": 1, "warmup_requests": 1, "warmup_window_s": 0, "request_timeout_s": 3},
        "coding_eval": {"enabled": False},
        "analysis": {"regimes": [{"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
                                 {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128,
                                  "concurrency": 1}]},
    }


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", ".test/config.yaml",
                           "faults.yaml", *args], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def _flaky_study(tmp_path: Path, sweep: dict, repeats: int) -> Path:
    """A study whose `flaky` point's first server start never becomes healthy (counted across starts in a state
    dir) while later ones serve, with no retry, run once with --keep-going; returns its directory."""
    study = _study({"flaky": (["never-healthy-first:1"], None)})
    study["engine"]["presets"]["flaky"]["args"] += ["--sim-state-dir", str(tmp_path / "standin-state")]
    study["sweep"].update(sweep)
    study["benchmark"]["repeats"] = repeats
    study["resources"] = {"retries": 0}
    workdir = copy_workflow(tmp_path / "study")
    (workdir / "faults.yaml").write_text(yaml.safe_dump(study))
    first = _snakemake(workdir, "--keep-going")
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    return workdir


@pytest.mark.slow
def test_a_study_with_a_failing_point_per_fault_kind_still_writes_summary_tables_and_bundle(tmp_path):
    workdir = copy_workflow(tmp_path / "study", strict_standin=True)
    study = _study({**FAULTS, **STUBBORN})
    study["engine"]["shutdown_timeout_s"] = 2
    marker = f"DDSWEEP_FAILURES_TEST={uuid.uuid4().hex}"  # in every server's environment (engine.env)
    study["engine"]["env"] = dict([marker.split("=")])
    # a hung server's requests would each wait this long; the hang is named after a tenth of it and a probe
    study["benchmark"]["request_timeout_s"] = 30
    (workdir / "faults.yaml").write_text(yaml.safe_dump(study))
    first = _snakemake(workdir)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]

    failed = {f"{name}-bs8-b8-t4-w2048": kind for name, (_, kind) in FAULTS.items()}
    rows = {r["point_id"]: r for r in csv.DictReader((workdir / "results/tables/failures.csv").open())}
    assert {p: r["error_kind"] for p, r in rows.items()} == failed
    assert all(r["reason"] and "\n" not in r["reason"] for r in rows.values())
    assert "the server exited with code 1 during the benchmark" in rows["fcrash-bs8-b8-t4-w2048"]["reason"]
    assert "the server exited with code 2 during startup" in rows["frefuse-bs8-b8-t4-w2048"]["reason"]
    # the hang: named on each of its two attempts (the second makes it the configuration's) after 3 s of silence
    # and a 3 s probe, where each of its requests would have waited 30 s
    hung = workdir / "results/points/fhang-bs8-b8-t4-w2048"
    attempts = [json.loads(f.read_text()) for f in [*sorted(hung.glob("attempts/*/failure.json")),
                                                     hung / "failure.json"]]
    assert [a["error_kind"] for a in attempts] == ["server_hang"] * 2, attempts
    assert all(6 <= a["hang"]["waited_s"] < 10 and a["duration_s"] < 20 for a in attempts), attempts
    assert rows["fhang-bs8-b8-t4-w2048"]["reason"].startswith("the server hung: no token arrived for 3.")
    for point, kind in failed.items():
        done = json.loads((workdir / "results/points" / point / "done.json").read_text())
        assert done["status"] == "failed" and done["error_kind"] == kind, done
        # no fault is left to its requests' 30 s timeouts: every attempt ends well before one request's would
        durations = [json.loads(f.read_text())["duration_s"] for f in (workdir / "results/points" / point).glob(
            "**/failure.json")]
        assert durations and max(durations) < 30, (point, durations)
        assert not (workdir / "results/points" / point / "status.json").exists()
    healthy = ("bs8-b4-t2-w2048", "ar", "fsigterm-bs8-b8-t4-w2048")
    for point in healthy:
        assert json.loads((workdir / "results/points" / point / "done.json").read_text())["status"] == "ok"
    jobs = {r["point_id"]: r for r in csv.DictReader((workdir / "results/tables/jobs.csv").open())}
    assert len(jobs) == len(failed) + len(healthy) and all(r["host"] for r in jobs.values())

    summary = (workdir / "reports/optimization_summary.md").read_text()
    assert "snakemake --cores all --configfile .test/config.yaml --configfile faults.yaml" in summary
    for point, kind in failed.items():
        assert f"`{point}` **failed** ({kind})" in summary
    # the engine's exception: a result on its first occurrence, named with the engine's message
    raised = json.loads((workdir / "results/points/fraise-bs8-b8-t4-w2048/failure.json").read_text())
    assert raised["attempt"] == 1 and raised["failure_class"] == "configuration", raised
    assert ("`fraise-bs8-b8-t4-w2048` **failed** (server_crash): the server exited with code 1 during the "
            "benchmark: RuntimeError: The size of tensor a (7) must match") in summary
    assert "the configuration's failure: the engine's own code raised an exception: RuntimeError" in summary
    stop = json.loads((workdir / "results/points/fsigterm-bs8-b8-t4-w2048/status.json").read_text())["steps"]["stop"]
    assert stop.startswith("killed") and "ignored SIGTERM" in stop
    assert f"`fsigterm-bs8-b8-t4-w2048` completed, but its server ignored SIGTERM when it was stopped ({stop})" \
        in summary
    bundle = workdir / json.loads((workdir / "reports/bundle.json").read_text())["bundle"]
    with tarfile.open(bundle) as tar:
        names = set(tar.getnames())
    assert all(any(n.endswith(f"results/points/{p}/failure.json") for n in names) for p in failed), sorted(names)
    assert any(n.endswith("results/tables/failures.csv") for n in names)

    assert not marked_processes(marker)  # no server of the study outlives it, whatever its fault
    again = _snakemake(workdir, "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]


@pytest.mark.slow
def test_infrastructure_failures_are_retried_and_a_persistent_one_runs_again_next_time(tmp_path):
    # flaky: never healthy on its first two launches, healthy on the third (within resources.retries: 2);
    # down: never healthy at all; frefuse: refuses its flags (a configuration result, not rerun).
    study = _study({"flaky": (["never-healthy-first:2"], None), "down": (["never-healthy"], None),
                    "frefuse": (["refuse-flags"], None)})
    study["engine"]["presets"]["flaky"]["args"] += ["--sim-state-dir", str(tmp_path / "standin-state")]
    study["resources"] = {"retries": 2}
    workdir = copy_workflow(tmp_path / "study")
    (workdir / "faults.yaml").write_text(yaml.safe_dump(study))
    first = _snakemake(workdir, "--keep-going")
    # the point that never starts is recorded after its last attempt: the study ends with its summary
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    points = workdir / "results/points"
    flaky = points / "flaky-bs8-b8-t4-w2048"
    assert json.loads((flaky / "status.json").read_text())["status"] == "ok", first.stderr[-3000:]
    earlier = sorted((flaky / "attempts").iterdir())
    assert [json.loads((d / "failure.json").read_text())["error_kind"] for d in earlier] == ["startup_timeout"] * 2
    assert json.loads((flaky / "done.json").read_text())["status"] == "ok"
    down = points / "down-bs8-b8-t4-w2048"
    failure = json.loads((down / "failure.json").read_text())
    assert failure["failure_class"] == "infrastructure" and failure["attempt"] == 3, failure
    assert failure["persisted"] is True and failure["attempts"] == 3, failure
    done = json.loads((down / "done.json").read_text())
    assert done["status"] == "failed" and done["persisted"] is True and done["error_kind"] == "startup_timeout"
    summary = (workdir / "reports/optimization_summary.md").read_text()
    assert ("`down-bs8-b8-t4-w2048` **failed** (startup_timeout): the server did not become healthy within 6 s"
            in summary), summary
    assert ("the machine's failure (infrastructure, on all 3 attempts of this invocation: startup_timeout does "
            "not depend on the point's configuration); the next invocation runs it again") in summary
    status = subprocess.run([sys.executable, "-m", "ddsweep", "status", "--config", "config/config.yaml",
                             ".test/config.yaml", "faults.yaml"], cwd=workdir, capture_output=True, text=True,
                            timeout=120, check=False)
    assert status.returncode == 0, status.stderr
    (line,) = [row for row in status.stdout.splitlines() if row.startswith("down-bs8-b8-t4-w2048")]
    assert " failed " in line and "failed-infrastructure on all 3 attempt(s); rerun by the next invocation" in line
    refused = json.loads((points / "frefuse-bs8-b8-t4-w2048" / "failure.json").read_text())
    assert refused["failure_class"] == "configuration" and refused["attempt"] == 1, refused
    assert not (points / "dflash-bs8-w2048").exists()
    again = _snakemake(workdir, "-n")  # the persisted record: the next invocation runs the point again
    assert "down-bs8-b8-t4-w2048" in again.stdout and "rule run_point" in again.stdout
    assert again.stdout.count("rule run_point:") == 1, again.stdout[-3000:]
    assert "rule summarize:" in again.stdout and not (down / "done.json").exists()

    # Without the point that never starts, the study completes from what it has: nothing else reruns.
    study["sweep"]["points"] = [p for p in study["sweep"]["points"] if p["preset"] != "down"]
    (workdir / "faults.yaml").write_text(yaml.safe_dump(study))
    second = _snakemake(workdir)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "rule run_point:" not in second.stdout
    rows = {r["point_id"]: r for r in csv.DictReader((workdir / "results/tables/points.csv").open())}
    assert rows["flaky-bs8-b8-t4-w2048"]["status"] == "ok"
    assert rows["frefuse-bs8-b8-t4-w2048"]["status"] == "failed"

    # Operational settings rerun no point; a setting that defines the measurement reruns every point.
    operational = {**study, "engine": {**study["engine"], "startup_timeout_s": 600, "shutdown_timeout_s": 20},
                   "benchmark": {**study["benchmark"], "request_timeout_s": 30},
                   "coding_eval": {"enabled": False, "isolation": "rlimits-only", "require_isolation": False,
                                   "exec_timeout_s": 20},
                   "resources": {"retries": 5, "runtime_min": 30}}
    (workdir / "faults.yaml").write_text(yaml.safe_dump(operational))
    dry = _snakemake(workdir, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "rule run_point:" not in dry.stdout and "rule preflight:" not in dry.stdout, dry.stdout[-3000:]
    assert "rule summarize:" in dry.stdout  # the study's record changed: only the aggregation reruns
    measured = {**study, "benchmark": {**study["benchmark"], "contexts": [256]}}
    measured["analysis"] = {"regimes": [{**r, "context": 256} for r in study["analysis"]["regimes"]]}
    (workdir / "faults.yaml").write_text(yaml.safe_dump(measured))
    dry = _snakemake(workdir, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert dry.stdout.count("rule run_point:") == len(rows) == 4, dry.stdout[-3000:]


@pytest.mark.slow
def test_an_adaptive_study_names_screening_and_confirmation_failures_and_still_recommends(tmp_path):
    # fexit never starts (fails in screening); flate passes the short screening and crashes in every
    # confirmation launch, whose cells have more requests than its crash threshold: counted cells (no window), so
    # the screening sends its warm-up and 4 requests, a confirmation launch its warm-up and 10 per cell and repeat.
    study = _study()
    late = {**study["engine"]["presets"]["fcrash"]}
    late["args"] = [a if a != "crash-after:3" else "crash-after:8" for a in late["args"]]
    study["engine"]["presets"] = {"fexit": study["engine"]["presets"]["fexit"], "flate": late}
    study["sweep"]["points"] = [p for p in study["sweep"]["points"] if p["preset"] in ("fexit", "fcrash")]
    study["sweep"]["points"][1]["preset"] = "flate"
    study["sweep"]["strategy"] = "adaptive"
    study["sweep"]["launches"] = 2  # the grid's two launches: the screening stands for the first
    # keep every screened point (no band excludes anything at this confidence, no cap) and no settling
    study["sweep"]["screen"] = {"requests_per_cell": 4, "confidence": 0.999999, "race_keep": None,
                                "settle_launches": 0}
    study["benchmark"].update(repeats=2, requests_per_cell=10, min_window_s=0)
    workdir = copy_workflow(tmp_path / "study", strict_standin=True)
    (workdir / "faults.yaml").write_text(yaml.safe_dump(study))
    first = _snakemake(workdir)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]

    funnel = json.loads((workdir / "results/screen/funnel.json").read_text())
    assert funnel["failed"] == ["fexit-bs8-b8-t4-w2048"]
    assert funnel["failures"]["fexit-bs8-b8-t4-w2048"]["error_kind"] == "startup_exit"
    assert "flate-bs8-b8-t4-w2048" in funnel["survivors"]
    # its screening stood for launch 0; its one confirmation launch crashed and keeps its failure record, and the
    # screening alone makes no point
    failure = json.loads((workdir / "results/confirm/flate-bs8-b8-t4-w2048/launch-1/failure.json").read_text())
    assert failure["error_kind"] == "server_crash", failure
    done = json.loads((workdir / "results/points/flate-bs8-b8-t4-w2048/done.json").read_text())
    assert done["status"] == "failed" and done["error_kind"] == "server_crash", done
    rows = {r["point_id"]: r for r in csv.DictReader((workdir / "results/tables/failures.csv").open())}
    assert rows["flate-bs8-b8-t4-w2048"]["error_kind"] == "server_crash"
    summary = (workdir / "reports/optimization_summary.md").read_text()
    assert "`fexit-bs8-b8-t4-w2048` failed in screening (startup_exit: " in summary
    assert "`flate-bs8-b8-t4-w2048` **failed** (server_crash)" in summary
    assert "**`ar`**" in summary or "**`bs8-b4-t2-w2048`**" in summary
    again = _snakemake(workdir, "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]


@pytest.mark.slow
def test_a_launch_that_failed_on_the_machine_runs_again_next_time_and_joins_its_point(tmp_path):
    # flaky: its first start never becomes healthy (counted across launches in the state dir), later ones serve;
    # no retry, so one of its two launches ends persisted and the point is measured from the other.
    sweep = {"launches": 2}
    workdir = _flaky_study(tmp_path, sweep, repeats=2)  # one repeat per launch
    point = "flaky-bs8-b8-t4-w2048"
    launches = workdir / "results/launches" / point
    persisted = [d.name for d in sorted(launches.iterdir())
                 if json.loads((d / "done.json").read_text()).get("persisted")]
    assert len(persisted) == 1, persisted
    merged = json.loads((workdir / "results/points" / point / "launches.json").read_text())
    assert len(merged["launches"]) == 1 and len(merged["failed_launches"]) == 1, merged
    assert merged["failed_launches"][0]["failure"]["error_kind"] == "startup_timeout", merged

    again = _snakemake(workdir, "-n")  # the persisted launch runs again, its point is merged again
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("rule launch_point:") == 1, again.stdout[-3000:]
    assert f"results/launches/{point}/{persisted[0]}/done.json" in again.stdout
    assert "rule merge_point_launches:" in again.stdout and "rule summarize:" in again.stdout

    second = _snakemake(workdir)
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    merged = json.loads((workdir / "results/points" / point / "launches.json").read_text())
    assert [e["launch"] for e in merged["launches"]] == [0, 1] and not merged["failed_launches"], merged
    rows = {r["point_id"]: r for r in csv.DictReader((workdir / "results/tables/points.csv").open())}
    assert rows[point]["status"] == "ok", rows[point]
    assert f"`{point}` **failed**" not in (workdir / "reports/optimization_summary.md").read_text()


@pytest.mark.slow
def test_a_screening_that_failed_on_the_machine_runs_again_next_time_and_the_study_settles(tmp_path):
    # flaky: its first start never becomes healthy (counted in the state dir), later ones serve; no retry, so its
    # screening ends persisted; the next invocation screens it again and reselects without repeating launches.
    sweep = {"strategy": "adaptive", "launches": 2,
             "screen": {"requests_per_cell": 4, "confidence": 0.999999, "race_keep": None, "settle_launches": 0}}
    workdir = _flaky_study(tmp_path, sweep, repeats=2)
    point = "flaky-bs8-b8-t4-w2048"
    screened = workdir / "results/screen" / point / "done.json"
    assert json.loads(screened.read_text()).get("persisted"), screened.read_text()
    assert point in json.loads((workdir / "results/screen/funnel.json").read_text())["failed"]
    launches_before = {p: p.stat().st_mtime for p in (workdir / "results/confirm").rglob("launch-*/done.json")}

    again = _snakemake(workdir, "-n")  # the screening runs again, and the selections after it
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("rule screen_point:") == 1 and f"results/screen/{point}/done.json" in again.stdout
    assert "checkpoint screen_select:" in again.stdout and "rule summarize:" in again.stdout
    assert "rule confirm_launch:" not in again.stdout  # known after the selections; none is repeated (below)

    second = _snakemake(workdir)
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    assert json.loads(screened.read_text()).get("status") == "ok", screened.read_text()
    funnel = json.loads((workdir / "results/screen/funnel.json").read_text())
    assert point not in funnel["failed"] and (point in funnel["survivors"] or point in funnel["dropped"]), funnel
    assert all(p.stat().st_mtime == t for p, t in launches_before.items())  # no launch ran twice
    merged = json.loads((workdir / "results/points" / point / "done.json").read_text())  # it joined the race
    # its screening stands for launch 0: one confirmation launch
    assert merged["status"] == "ok" and [p.name for p in (workdir / "results/confirm" / point).glob("launch-*")] == [
        "launch-1"]
    assert f"`{point}` failed in screening" not in (workdir / "reports/optimization_summary.md").read_text()
    settled = _snakemake(workdir, "-n")
    assert settled.returncode == 0 and "Nothing to be done" in settled.stdout + settled.stderr, settled.stdout[-3000:]
