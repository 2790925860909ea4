"""`ddsweep status` on a fake running study: points done, failed, interrupted, running and pending in squeue."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import yaml
from resultsets import SynthPoint, write_point

from ddsweep.cli import main
from ddsweep.config.plan import estimate_minutes, running_points
from ddsweep.config.study import load_config
from ddsweep.findings.progress import point_state, study_status
from ddsweep.report.status import outcome_line
from ddsweep.slurm import parse_slurm_duration as parse_elapsed

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _fake_study(tmp_path: Path) -> tuple[list[str], Path, SynthPoint]:
    """Config files, results directory and the completed point of a study in the middle of its run."""
    extra = tmp_path / "gpus.yaml"
    extra.write_text(yaml.safe_dump({"resources": {"gpus": 8}}))
    results = tmp_path / "results"
    done = SynthPoint("ar", "ar", decode_c1=123.0)
    write_point(results / "points", done)
    _write(results / "points/ar/status.json", {"point_id": "ar", "status": "ok", "duration_s": 100.0})
    _write(results / "points/ar/done.json", {"point_id": "ar", "status": "ok"})
    failed = results / "points/dflash-bs8-w2048"
    _write(failed / "failure.json", {"status": "failed", "error_kind": "verify", "duration_s": 40.0,
                                     "error": "the server did not apply the requested settings:\nbudget 4 != 8",
                                     "slurm_job_id": "71", "slurm_nodelist": "gpu07"})
    _write(failed / "done.json", {"status": "failed", "error_kind": "verify",
                                  "reason": "the server did not apply the requested settings:"})
    interrupted = results / "points/bs16-b8-t4-w2048"
    _write(interrupted / "failure.json", {"status": "failed", "error_kind": "interrupted", "duration_s": 20.0,
                                          "error": "interrupted by SIGTERM; the server was stopped"})
    _write(interrupted / "attempts/20260101T000000Z/failure.json",
           {"status": "failed", "error_kind": "interrupted", "duration_s": 15.0, "error": "interrupted by SIGTERM"})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    # this study's jobs run in its directory (the parent of results/); another study's `bs16-b8-t4-w2048` does not
    squeue.write_text("#!/bin/sh\n"
                      f"echo '812|RUNNING|1:30|gpu03|rule_run_point_wildcards_bs8-b8-t4-w2048|{tmp_path}'\n"
                      f"echo '813|PENDING|0:00|(Resources)|rule_run_point_wildcards_bs8-b4-t1-w2048|{tmp_path}/'\n"
                      f"echo '814|RUNNING|0:10|gpu04|rule_run_point_wildcards_bs16-b8-t4-w2048|{tmp_path}/other'\n"
                      f"echo '900|RUNNING|5:00|gpu09|someone else|{tmp_path}'\n")
    squeue.chmod(squeue.stat().st_mode | stat.S_IEXEC)
    return [str(ROOT / "config/config.yaml"), str(ROOT / ".test/config.yaml"), str(extra)], results, done


def test_status_shows_every_point_state_gpu_hours_and_an_eta(tmp_path, monkeypatch, capsys):
    configs, results, done = _fake_study(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main(["status", "--config", *configs, "--results", str(results)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line and line.split()[0] in
            {p.point_id for p in running_points(load_config(*configs))}}
    assert rows["bs8-b8-t4-w2048"].split()[1:5] == ["running", "812", "gpu03", "0:01:30"]
    assert rows["bs8-b4-t1-w2048"].split()[1:4] == ["pending", "813", "-"]
    assert "done" in rows["ar"] and f"decode_tok_s {done.figure('decode_tok_s', 128, 1):.4g}" in rows["ar"]
    assert rows["dflash-bs8-w2048"].split()[1:4] == ["failed", "71", "gpu07"]
    assert "verify: the server did not apply the requested settings:" in rows["dflash-bs8-w2048"]
    assert "interrupted: interrupted by SIGTERM" in rows["bs16-b8-t4-w2048"]
    assert "1 running, 1 done, 1 failed, 1 interrupted" in out and "1 pending" in out

    config = load_config(*configs)
    status = study_status(config, results, {"bs8-b8-t4-w2048": {"job_id": "812", "state": "running",
                                                                "elapsed_s": 90.0, "node": "gpu03"}})
    spent_s = 100 + 40 + 20 + 15 + 90  # every attempt's duration plus the running job's elapsed time
    assert abs(status["gpu_hours_spent"] - spent_s * 8 / 3600) < 1e-9
    assert status["gpu_hours_planned"] == estimate_minutes(config, len(status["points"]))["gpu_hours"]
    assert f"GPU hours spent {spent_s * 8 / 3600:.2f} of {status['gpu_hours_planned']:.2f}" in out
    mean = (100 + 40) / 2
    left = len(status["points"]) - 2
    assert abs(status["eta_s"] - ((left - 1) * mean + (mean - 90 if mean > 90 else 0))) < 1e-6


def test_squeue_elapsed_times_are_read_in_every_format():
    assert parse_elapsed("0:07") == 7
    assert parse_elapsed("12:03:04") == 12 * 3600 + 3 * 60 + 4
    assert parse_elapsed("2-01:00:00") == 2 * 86400 + 3600
    assert parse_elapsed("INVALID") is None


def test_an_infrastructure_failure_without_done_json_says_it_runs_again(tmp_path):
    directory = tmp_path / "bs8-b8-t4-w2048"
    _write(directory / "failure.json", {"status": "failed", "error_kind": "startup_timeout", "duration_s": 5.0,
                                        "failure_class": "infrastructure",
                                        "error": "the server did not become healthy within 1200 s"})
    state = point_state(directory, None, None)
    assert state.state == "failed"
    assert state.detail == ("startup_timeout: the server did not become healthy within 1200 s (failed-infrastructure: "
                            "rerun by the next invocation)")


def test_points_not_started_are_named_with_their_canarys_cause_and_nothing_measured_exits_1(tmp_path, capsys):
    configs = [str(ROOT / "config/config.yaml"), str(ROOT / ".test/config.yaml")]
    results = tmp_path / "results"
    error = ("the server exited with code 1 during startup (port {}): OSError: Could not load this library: "
             "/venv/deep_gemm/_C.so; last log lines:\n...")
    for point, port in (("ar", 40001), ("bs8-b4-t1-w2048", 40002)):
        _write(results / "points" / point / "failure.json", {"status": "failed", "error_kind": "startup_exit",
                                                             "failure_class": "infrastructure", "duration_s": 3.0,
                                                             "error": error.format(port)})
        _write(results / "points" / point / "done.json", {"status": "failed", "error_kind": "startup_exit",
                                                          "reason": error.format(port).splitlines()[0],
                                                          "persisted": True, "attempts": 1})
    reason = "not started: the canary `bs8-b4-t1-w2048` of build sglang-pr29907 failed at start-up on the machine"
    canary = {"point_id": "bs8-b4-t1-w2048", "family": "sglang-pr29907", "error_kind": "startup_exit",
              "error": error.format(40002).splitlines()[0].removesuffix("; last log lines:")}
    _write(results / "points/bs8-b8-t1-w2048/failure.json", {"status": "failed", "error_kind": "not_started",
                                                             "error": reason, "failure_class": "infrastructure",
                                                             "canary": canary, "duration_s": 0.0})
    _write(results / "points/bs8-b8-t1-w2048/done.json", {"status": "failed", "error_kind": "not_started",
                                                          "reason": reason, "persisted": True, "attempts": 0})
    assert main(["status", "--config", *configs, "--results", str(results), "--expect-measured", "1"]) == 1
    out = capsys.readouterr()
    row = next(line for line in out.out.splitlines() if line.startswith("bs8-b8-t1-w2048"))
    assert row.split()[1] == "not_started" and reason in row
    (cause,) = [line for line in out.out.splitlines() if line.startswith("- ")]
    assert cause.startswith("- `startup_exit`, the machine's: \"the server exited with code 1 during startup: "
                            "OSError: Could not load this library") and "2 failed: `ar`, `bs8-b4-t1-w2048`" in cause
    assert "1 not started because of it: `bs8-b8-t1-w2048`" in cause
    assert "1 not_started" in out.out and "fewer than the 1 expected" in out.err

    status = study_status(load_config(*configs), results, {})
    assert outcome_line(status, tmp_path / "summary.md").startswith(
        "0 of 8 points measured; 3 failed, 1 of them not started (their build's canary failed at start-up; run "
        "again by the next invocation); 5 without an outcome")
    assert main(["status", "--config", *configs, "--results", str(results)]) == 0  # nothing expected: exit 0


def test_an_adaptive_studys_point_is_shown_from_its_screening_until_it_has_a_record(tmp_path):
    from ddsweep.findings.progress import point_directory

    results = tmp_path / "results"
    _write(results / "screen/bs8-b8-t4-w2048/done.json", {"status": "ok"})
    assert point_directory(results, "bs8-b8-t4-w2048", adaptive=True) == results / "screen/bs8-b8-t4-w2048"
    assert point_directory(results, "bs8-b8-t4-w2048", adaptive=False) == results / "points/bs8-b8-t4-w2048"
    _write(results / "points/bs8-b8-t4-w2048/done.json", {"status": "ok"})
    assert point_directory(results, "bs8-b8-t4-w2048", adaptive=True) == results / "points/bs8-b8-t4-w2048"


def test_an_adaptive_studys_baseline_is_shown_from_its_one_launch_until_it_has_a_record(tmp_path):
    from ddsweep.findings.progress import point_directory

    results = tmp_path / "results"
    assert point_directory(results, "ar", adaptive=True) == results / "points/ar"
    _write(results / "confirm/ar/launch-0/done.json", {"status": "ok"})
    assert point_directory(results, "ar", adaptive=True) == results / "confirm/ar/launch-0"
    _write(results / "points/ar/done.json", {"status": "ok"})
    assert point_directory(results, "ar", adaptive=True) == results / "points/ar"


def test_points_the_time_budget_did_not_start_are_not_started_not_failed(tmp_path, capsys):
    configs = [str(ROOT / "config/config.yaml"), str(ROOT / ".test/config.yaml")]
    results = tmp_path / "results"
    reason = ("not started: its estimate (204 s) does not fit the 160 s left of the time budget (budget_s=1490); "
              "the next invocation runs it")
    for point in ("ar", "bs8-b4-t1-w2048"):
        _write(results / "points" / point / "failure.json", {"status": "failed", "error_kind": "time_budget",
                                                             "error": reason, "failure_class": "infrastructure",
                                                             "duration_s": 0.0})
        _write(results / "points" / point / "done.json", {"status": "failed", "error_kind": "time_budget",
                                                          "reason": reason, "persisted": True, "attempts": 0})
    assert main(["status", "--config", *configs, "--results", str(results)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("ar ", "bs8-b4-t1"))]
    assert [row[1] for row in rows] == ["not_started", "not_started"]
    status = study_status(load_config(*configs), results, {})
    assert status["counts"]["failed"] == 0 and status["not_started_by_budget"] == 2
    assert outcome_line(status, tmp_path / "summary.md") == (
        "0 of 8 points measured; 2 not started within this invocation's time budget (run by the next invocation); "
        "6 without an outcome")
