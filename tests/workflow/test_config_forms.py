"""Every documented "null or absent" form of a setting (config/README.md) goes through the workflow, not only
through `ddsweep validate`: a dry run builds the DAG with it, and the points it leaves out do not run."""

from __future__ import annotations

import pytest
import yaml
from conftest import copy_workflow, demo_config
from test_workflow import scheduled_jobs, snakemake

from ddsweep.config.plan import running_points
from ddsweep.config.study import load_config

# Every setting config/README.md documents as taking null, each null at once, in an overlay on the demo.
NULLS = {
    "drafter": {"trained_window": None, "trained_block_size": None},
    "baselines": {"dflash": None},
    "sweep": {"reference": {"point": None}, "screen": {"race_keep": None}},
    "benchmark": {"requests_per_cell": None, "cell_order_seed": None, "request_rate": None,
                  "workloads": [{"name": "coding", "kind": "coding", "path": None, "max_new_tokens": None,
                                 "contexts": None, "concurrency": None}]},
    "coding_eval": {"limit": None, "task_ids": None, "retry_truncated_max_tokens": None},
    "resources": {"partition": None, "slurm_extra": None, "exclusive": None, "constraint": None, "nodelist": None},
}


def _points_scheduled(workdir, *configfiles: str) -> dict[str, int]:
    result = snakemake(workdir, "-n", "--cores", "1", "--configfile", *configfiles)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return scheduled_jobs(result.stdout + result.stderr)


@pytest.mark.slow
@pytest.mark.full("runs Snakemake on a working copy of the workflow")
def test_every_documented_null_in_an_overlay_builds_the_workflow_without_the_dflash_baseline(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "nulls.yaml").write_text(yaml.safe_dump(NULLS))
    jobs = _points_scheduled(workdir, ".test/config.yaml", "nulls.yaml")
    # the demo's points that run, without the DFlash baselines, each merged from its launches (sweep.launches)
    expected = [p for p in running_points(demo_config()) if p.kind != "dflash"]
    assert jobs["merge_point_launches"] == len(expected) and jobs["summarize"] == 1, jobs
    assert len(expected) < len(running_points(demo_config()))


@pytest.mark.slow
@pytest.mark.full("runs Snakemake on a working copy of the workflow")
def test_absent_dflash_baseline_and_absent_grid_build_the_workflow(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    for name in ("config/config.yaml", ".test/config.yaml"):
        config = yaml.safe_load((workdir / name).read_text())
        config["baselines"].pop("dflash", None)
        config["sweep"].pop("grid", None)
        (workdir / name).write_text(yaml.safe_dump(config, sort_keys=False))
    jobs = _points_scheduled(workdir, ".test/config.yaml")
    # ar and the demo's explicit points that run (no grid, no DFlash baseline), as ddsweep plans them
    config = load_config(workdir / "config/config.yaml", workdir / ".test/config.yaml")
    expected = running_points(config)
    assert {p.kind for p in expected} == {"ar", "ddtree"} and not config["sweep"].get("grid")
    assert jobs["merge_point_launches"] == len(expected) >= 2, jobs
