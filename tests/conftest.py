"""Shared fixtures: the demo study configuration and point records built from it."""

from __future__ import annotations

import copy
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from ddsweep.config.study import find_point, merge_config, point_record, validate_config

ROOT = Path(__file__).resolve().parents[1]


def demo_config(**sections: dict) -> dict:
    """The demo configuration (merged over the study configuration, as Snakemake does), with sections updated."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    merge_config(config, yaml.safe_load((ROOT / ".test" / "config.yaml").read_text()))
    merge_config(config, copy.deepcopy(sections))
    return validate_config(config)


def demo_record(point_id: str = "bs8-b8-t4-w2048", sim_args: list[str] | None = None, strict: bool = False,
                **sections: dict) -> dict:
    """A point record from the demo configuration; `sim_args` are appended to the stand-in's command line.

    The stand-in is lenient unless `strict` (loading SGLang's classes costs seconds of CPU per start; the
    contract tests start it strict)."""
    config = demo_config(**sections)
    strictness = ["--sim-strict", "auto" if strict else "off"]
    config["engine"]["launcher"] = config["engine"]["launcher"] + strictness + (sim_args or [])
    return point_record(config, find_point(config, point_id))


@pytest.fixture
def small_bench() -> dict:
    """A benchmark section small enough for unit tests."""
    return {"contexts": [64], "concurrency": [1, 2], "max_new_tokens": 16, "requests_per_cell": 2, "repeats": 1,
            "warmup_requests": 1}


def copy_workflow(dest: Path, strict_standin: bool = False) -> Path:
    """A working copy of the workflow (its own results/ and .snakemake/), sharing the package sources.

    Its demo configurations start the stand-in lenient unless `strict_standin`: a strict stand-in loads SGLang's
    classes at every start (about 7 s of CPU), and the tests of scheduling and selection start dozens. The demo
    study test (tests/workflow/test_workflow.py) and the contract tests run it strict."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "config", ".test", "envs", "profiles"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, symlinks=True)
        else:
            shutil.copy(source, dest / name)
    (dest / "src").symlink_to(ROOT / "src")
    (dest / "slurm").symlink_to("profiles/slurm")
    if not strict_standin:
        for path in (dest / ".test").glob("*.yaml"):
            config = yaml.safe_load(path.read_text()) or {}
            launcher = config.get("engine", {}).get("launcher")
            if launcher and "sim-server" in launcher and "--sim-strict" not in launcher:
                config["engine"]["launcher"] = [*launcher, "--sim-strict", "off"]
                path.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def venv_env() -> dict[str, str]:
    """The environment with this interpreter's bin directory first on PATH, so jobs find `ddsweep`."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
