"""`ddsweep smoke`: the smoke study (config/smoke.yaml) runs one point with one cell and three coding problems
through the study's own set-up, in a directory of its own, and writes the summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow, venv_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_smoke_study_runs_one_point_one_cell_and_three_problems_in_its_own_directory(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    result = subprocess.run([sys.executable, "-m", "ddsweep", "smoke", "-c", "config/config.yaml",
                             ".test/config.yaml"], cwd=workdir, env=venv_env(), capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ddsweep smoke: the set-up works; summary in smoke/reports/optimization_summary.md" in result.stderr
    smoke = workdir / "smoke"
    points = sorted(p.name for p in (smoke / "results" / "points").iterdir())
    assert points == ["bs8-b8-t4-w2048"]
    point = smoke / "results" / "points" / points[0]
    cells = json.loads((point / "bench" / "cells.json").read_text())["cells"]
    assert [(c["context"], c["concurrency"], c["repeat"]) for c in cells] == [(128, 1, 0)]
    assert len((point / "coding" / "problems.jsonl").read_text().splitlines()) == 3
    assert json.loads((point / "verification.json").read_text())["ok"] is True
    assert json.loads((point / "status.json").read_text())["steps"]["stop"] == "ok"
    assert "# Optimization summary: smoke" in (smoke / "reports" / "optimization_summary.md").read_text()
    assert not (workdir / "results").exists()  # the study's own results directory is untouched


@pytest.mark.slow  # Snakemake
def test_a_smoke_overlay_that_does_not_fit_the_study_stops_naming_the_key(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "bad.yaml").write_text("benchmark: {contexts: [128], concurrency: [0]}\n")
    result = subprocess.run([sys.executable, "-m", "ddsweep", "smoke", "-c", "config/config.yaml",
                             ".test/config.yaml", "--smoke", "bad.yaml"], cwd=workdir, env=venv_env(),
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and "benchmark.concurrency" in result.stderr, result.stderr
    assert not (workdir / "smoke" / "results").exists()


NOTHING_STARTS = {"engine": {"launcher": ["/nonexistent/sglang/bin/python", "-m", "sglang.launch_server"]},
                  "resources": {"retries": 0}}


@pytest.mark.slow
@pytest.mark.full("a second smoke study; the fast tier runs the one that measures")
def test_a_smoke_study_that_measured_nothing_fails(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "broken.yaml").write_text(yaml.safe_dump(NOTHING_STARTS))
    result = subprocess.run([sys.executable, "-m", "ddsweep", "smoke", "-c", "config/config.yaml",
                             ".test/config.yaml", "broken.yaml"], cwd=workdir, env=venv_env(), capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "ddsweep smoke: FAILED: nothing was measured" in result.stderr
    assert "the set-up works" not in result.stderr
    assert "(engine.launcher) is not on PATH" in result.stdout  # the status table names why
    assert (workdir / "smoke/reports/optimization_summary.md").exists()  # the workflow still wrote its summary


@pytest.mark.slow
@pytest.mark.full("the GPU check script's install and study on the stand-in")
def test_the_gpu_check_on_the_stand_in_fails_when_nothing_was_measured(tmp_path):
    study = yaml.safe_load((ROOT / ".test/config.yaml").read_text())
    study.update(yaml.safe_load((ROOT / "config/smoke.yaml").read_text()))
    study["coding_eval"]["enabled"] = False
    study["engine"]["launcher"] = NOTHING_STARTS["engine"]["launcher"]
    study["resources"]["retries"] = 0
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    result = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/check.sh"), "--install", "standin", "--work",
                             str(tmp_path / "work"), "--study", str(tmp_path / "study.yaml")],
                            env={**venv_env(), "PYTHON": sys.executable}, capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 1, (result.stdout + result.stderr)[-3000:]
    assert "check.sh: workflow exit code 0" in result.stdout  # the workflow ends with its summary ...
    assert "check.sh: FAILED: nothing was measured" in result.stderr  # ... but the check fails
    assert "check.sh: passed" not in result.stdout
