"""`ddsweep smoke`: the smoke study (config/smoke.yaml) runs one point with one cell and three coding problems
through the study's own set-up, in a directory of its own, and writes the summary."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import copy_workflow, venv_env


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
