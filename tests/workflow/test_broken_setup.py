"""The canary start on the stand-in: a launcher that fails at start-up the same way for every server costs one
start-up per engine build, the summary opens with the cause and the points not started, and the next invocation,
with the cause removed, runs them all; a preset whose flags are refused fails its own points only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from configs import study_yaml
from conftest import copy_workflow

pytestmark = pytest.mark.full("studies of their own whose launcher fails")

STANDIN = ["--sim-strict", "off", "--sim-startup-delay", "0.2", "--sim-step-ms", "1", "--sim-prefill-ms-per-1k", "1"]
# Six DDTree points (aliases run too) and `ar`, one launch each, one short cell, no coding eval, no retry.
STUDY = {
    "baselines": {"ar": True, "dflash": None},
    "sweep": {"launches": 1, "run_aliases": True, "points": [], "constraints": [],
              "grid": {"budget": [4, 8, 16], "topk": [1, 4], "block_size": [8], "window": [2048]}},
    "benchmark": {"contexts": [128], "concurrency": [1], "max_new_tokens": 16, "requests_per_cell": 4, "repeats": 1,
                  "warmup_requests": 1, "warmup_window_s": 0, "request_timeout_s": 5,
                  "workloads": [{"name": "prose", "kind": "prose"}]},
    "coding_eval": {"enabled": False},
    "resources": {"retries": 0},
    "analysis": {"regimes": [{"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
                             {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128,
                              "concurrency": 1}]},
}
DDTREE = [f"bs8-b{b}-t{t}-w2048" for b in (4, 8, 16) for t in (1, 4)]
CANARIES = ("ar", "bs8-b4-t1-w2048")


def _launcher(path: Path, library: Path, starts: Path) -> Path:
    """A launcher that counts its starts and, while LIBRARY is missing, dies at start-up as SGLang did when
    deep_gemm's compiled library did not load; else it starts the stand-in."""
    path.write_text(f"""#!/bin/sh
echo start >> {starts}
if [ ! -e {library} ]; then
  echo 'Traceback (most recent call last):'
  echo '  File "/venv/lib/python3.11/site-packages/deep_gemm/__init__.py", line 20, in <module>'
  echo '    from . import _C'
  echo 'OSError: Could not load this library: {library}'
  exit 1
fi
exec {sys.executable} -m ddsweep sim-server {' '.join(STANDIN)} "$@"
""")
    path.chmod(0o755)
    return path


def _snakemake(workdir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", ".test/config.yaml",
                           "study.yaml"], cwd=workdir, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def _status(workdir: Path) -> str:
    return subprocess.run([sys.executable, "-m", "ddsweep", "status", "--config", "config/config.yaml",
                           ".test/config.yaml", "study.yaml"], cwd=workdir, capture_output=True, text=True,
                          timeout=120, check=True).stdout


@pytest.mark.slow
def test_a_set_up_that_fails_every_start_costs_one_start_up_per_build_and_runs_again_once_fixed(tmp_path):
    library, starts = tmp_path / "lib" / "_C.so", tmp_path / "starts"
    workdir = copy_workflow(tmp_path / "study")
    launcher = _launcher(tmp_path / "launcher.sh", library, starts)
    (workdir / "study.yaml").write_text(yaml.safe_dump({**STUDY, "engine": {"launcher": [str(launcher)]}}))
    first = _snakemake(workdir)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    assert len(starts.read_text().splitlines()) == 2  # one canary per build
    not_started = [p for p in DDTREE if p not in CANARIES]
    for point in not_started:
        done = json.loads((workdir / "results/points" / point / "done.json").read_text())
        assert done["error_kind"] == "not_started" and done["persisted"] is True, done
        assert not (workdir / "results/points" / point / "server.log").exists()

    lines = (workdir / "reports/optimization_summary.md").read_text().splitlines()
    opening = lines.index("## Nothing was measured")
    assert opening <= 4 and lines[opening + 2] == "0 of 7 points measured; 7 lost: 2 failed, 5 not started."
    cause = lines[opening + 4]
    assert cause.startswith(f"- `startup_exit`, the machine's: \"the server exited with code 1 during startup: "
                            f"OSError: Could not load this library: {library}\" — 2 failed: `ar`, `bs8-b4-t1-w2048`")
    assert "5 not started because of it: " + ", ".join(f"`{p}`" for p in sorted(not_started)) in cause
    assert lines[opening + 6].startswith("Next: ") and opening + 6 < lines.index("## Decision")
    assert ("ddsweep: NOTHING WAS MEASURED: 0 of 7 points measured; 7 failed, 5 of them not started"
            in first.stdout.strip().splitlines()[-1]), first.stdout[-2000:]
    status = _status(workdir)
    assert all(next(r for r in status.splitlines() if r.startswith(p)).split()[1] == "not_started"
               for p in not_started)
    assert "5 not started because of it" in status

    library.parent.mkdir()
    library.write_text("")  # the cause removed: the same study runs again
    second = _snakemake(workdir)
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    assert len(starts.read_text().splitlines()) == 2 + 7
    for point in ("ar", *DDTREE):
        assert json.loads((workdir / "results/points" / point / "done.json").read_text())["status"] == "ok", point
    log = second.stdout + second.stderr
    gate = log.index("checkpoint canaries:")
    assert all(log.index(f"point={p}\n") > gate for p in not_started)
    assert all(log.index(f"point={p}\n") < gate for p in CANARIES)
    assert "## Nothing was measured" not in (workdir / "reports/optimization_summary.md").read_text()
    assert second.stdout.strip().splitlines()[-1] == (
        "ddsweep: 7 of 7 points measured — see reports/optimization_summary.md")


@pytest.mark.slow
def test_a_preset_whose_flags_are_refused_fails_its_own_points_and_every_other_point_runs(tmp_path):
    presets = study_yaml()["engine"]["presets"]
    refused = {**presets["ddtree"], "args": [*presets["ddtree"]["args"], "--sim-fault", "refuse-flags"]}
    study = {**STUDY, "engine": {"presets": {"frefuse": refused}}, "resources": {"retries": 1}}
    # the refused preset has the build's cheapest point, so it is the canary of the build
    study["sweep"] = {**STUDY["sweep"], "grid": {"budget": [8, 16], "topk": [4], "block_size": [8], "window": [2048]},
                      "points": [{"preset": "frefuse", "budget": b, "topk": 4, "block_size": 8, "window": 2048}
                                 for b in (4, 8)]}
    workdir = copy_workflow(tmp_path / "study")
    (workdir / "study.yaml").write_text(yaml.safe_dump(study))
    result = _snakemake(workdir)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    verdicts = {v["family"]: v for v in json.loads((workdir / "results/canary.json").read_text())["families"]}
    assert verdicts["sglang-pr29907"]["canary"] == "frefuse-bs8-b4-t4-w2048"
    assert verdicts["sglang-pr29907"]["status"] == "failed" and not verdicts["sglang-pr29907"]["not_started"]
    outcomes = {p.name: json.loads((p / "done.json").read_text()) for p in (workdir / "results/points").iterdir()}
    assert {p: d["status"] for p, d in outcomes.items()} == {
        "ar": "ok", "bs8-b8-t4-w2048": "ok", "bs8-b16-t4-w2048": "ok",
        "frefuse-bs8-b4-t4-w2048": "failed", "frefuse-bs8-b8-t4-w2048": "failed"}
    for point in ("frefuse-bs8-b4-t4-w2048", "frefuse-bs8-b8-t4-w2048"):
        failure = json.loads((workdir / "results/points" / point / "failure.json").read_text())
        assert failure["failure_class"] == "configuration" and failure["attempt"] == 1, failure
    summary = (workdir / "reports/optimization_summary.md").read_text()
    assert "## More than half" not in summary and "## Nothing was measured" not in summary
    (line,) = [x for x in summary.splitlines() if "unrecognized arguments" in x and x.startswith("- ")]
    assert line.startswith("- `startup_exit`, the configuration's: ") and (
        "2 failed: `frefuse-bs8-b4-t4-w2048`, `frefuse-bs8-b8-t4-w2048`") in line
    assert result.stdout.strip().splitlines()[-1].startswith("ddsweep: 3 of 5 points measured; 2 failed")
