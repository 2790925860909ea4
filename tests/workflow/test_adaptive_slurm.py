"""The adaptive study under `--profile slurm` on the single-node test cluster (.ci/slurm-up.sh): screening and
confirmation jobs go to Slurm, the checkpoints run on the submit host, and a second invocation submits nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow, venv_env
from test_slurm import SLURM_MARKS

pytestmark = SLURM_MARKS

SNAKEMAKE = Path(sys.executable).with_name("snakemake")
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")
# Smaller than the demo so the Slurm round trips stay short: two grid points and ar, no coding eval, two
# confirmation launches (the funnel's decisions are tested on the demo in test_adaptive.py).
SMALL = {"coding_eval": {"enabled": False}, "benchmark": {"repeats": 2, "requests_per_cell": 4},
         "sweep": {"grid": {"budget": [4, 8], "topk": [4], "block_size": [8], "window": [2048]}, "points": []},
         "baselines": {"dflash": None}}


def snakemake(workdir: Path) -> subprocess.CompletedProcess:
    """`snakemake --cores all --profile slurm` with the adaptive demo, from the working copy's root."""
    command = [str(SNAKEMAKE), "--cores", "all", "--profile", "slurm", "--slurm-init-seconds-before-status-checks",
               "2", "--configfile", ".test/config.yaml", ".test/adaptive.yaml", "small.yaml"]
    return subprocess.run(command, cwd=workdir, env=venv_env(), capture_output=True, text=True, timeout=1500,
                          check=False)


def submitted(output: str) -> list[str]:
    """`rule/job` of every sbatch submission Snakemake reported."""
    return ["/".join(Path(log).parts[-3:-1]) for _, log in SUBMITTED.findall(output)]


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The adaptive demo, run once through the Slurm executor."""
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-adaptive"))
    (workdir / "small.yaml").write_text(yaml.safe_dump(SMALL))
    return workdir, snakemake(workdir)


def test_an_adaptive_study_completes_under_the_slurm_profile(slurm_run):
    workdir, done = slurm_run
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    jobs = submitted(done.stdout + done.stderr)
    selection = json.loads((workdir / "results/screen/selection.json").read_text())
    candidates = [p for p in selection["screened"] if p != "ar"]  # the baseline runs once, not screened
    assert sum(j.startswith("rule_screen_point/") for j in jobs) == len(candidates)
    # the screening stands for a candidate's launch 0: the final selection's survivors run launch 1; the settling
    # rounds after it (race-1, ...) run launches with sweep.screen.settle_launches, none by default
    races = sorted((workdir / "results/confirm").glob("race-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    settling = json.loads(races[-1].read_text()).get("extra_launches", {}) if races else {}  # none by default
    confirmations = sum(j.startswith("rule_confirm_launch/") for j in jobs)
    # the baseline's one launch 0 and each candidate's launch 1
    assert confirmations == len(selection["survivors"]) + sum(map(len, settling.values()))
    assert not [j for j in jobs if not j.startswith(("rule_screen_point/", "rule_confirm_launch/"))]
    for pid in selection["survivors"]:
        launch = json.loads((workdir / f"results/confirm/{pid}/launch-{0 if pid == 'ar' else 1}/environment.json")
                            .read_text())
        assert launch["slurm"]["job_id"], pid
    assert (workdir / "reports/adaptive_funnel.md").exists()
    assert (workdir / "reports/optimization_summary.md").exists()


def test_a_second_invocation_submits_nothing(slurm_run):
    workdir, first = slurm_run
    assert first.returncode == 0
    done = snakemake(workdir)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert submitted(done.stdout + done.stderr) == []
    assert "Nothing to be done" in done.stdout + done.stderr
