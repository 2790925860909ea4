"""The adaptive study end to end with real Snakemake against the stand-in: the baselines measured once, screen,
select (checkpoints), refine, confirm in the grid's launches, the merged points summarized, the funnel; and
reruns."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import across_workers, copy_workflow, shared_study, venv_env

from ddsweep.adaptive.refinement import refine_candidates
from ddsweep.adaptive.selection import settled_leaders
from ddsweep.config.study import load_config

pytestmark = pytest.mark.full("the adaptive study end to end, and reruns of it")

CONFIGS = ("--configfile", ".test/config.yaml", ".test/adaptive.yaml", "no_coding.yaml")
# The coding eval, the demo's two extra workloads and its one-knob points (block size 16, no window) are the
# same in every stage and tested elsewhere (test_workflow.py); without them the study runs in half the time.
# Settling (off by default) is on, so the race is followed by settling rounds.
NO_CODING = {"coding_eval": {"enabled": False}, "sweep": {"points": [], "screen": {"settle_launches": 1}},
             "benchmark": {"workloads": [{"name": "coding", "kind": "coding"}]}}
# The stand-in's launches mostly wait: four run at once.
CORES = ("--cores", "4")
BASELINES = {"ar", "dflash-bs8-w2048", "dflash-nooverlap-bs8-w2048"}  # the demo's, measured once in full


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run Snakemake in the working copy with this interpreter's environment."""
    env = {**venv_env(), "PYTHONPATH": os.pathsep.join([str(workdir / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


@pytest.fixture(scope="session")
@across_workers
def adaptive_run(tmp_path_factory) -> Path:
    """The demo grid and baselines under `sweep.strategy: adaptive`, run once per session (its tests read it from
    any worker; those that rerun it work on a copy: `with_the_analysis_changed`)."""
    return shared_study(tmp_path_factory, "adaptive", _run_adaptive)


def _run_adaptive(workdir: Path) -> None:
    """Run the adaptive study in a new working copy at `workdir`."""
    copy_workflow(workdir)
    (workdir / "no_coding.yaml").write_text(yaml.safe_dump(NO_CODING))
    result = snakemake(workdir, *CORES, *CONFIGS)
    assert result.returncode == 0, result.stderr[-5000:]


def with_the_analysis_changed(adaptive_run: Path, tmp_path: Path) -> Path:
    """A copy of the adaptive study with `changed.yaml`: the demo's configuration with another analysis setting."""
    workdir = Path(shutil.copytree(adaptive_run, tmp_path / "copy", symlinks=True))
    config = yaml.safe_load((workdir / ".test" / "config.yaml").read_text())
    config["analysis"]["spread_warning"] = 0.2
    (workdir / "changed.yaml").write_text(yaml.safe_dump(config))
    return workdir


@pytest.mark.slow
def test_adaptive_study_screens_every_point_and_confirms_the_survivors_launch_by_launch(adaptive_run):
    selection = json.loads((adaptive_run / "results" / "screen" / "selection.json").read_text())
    assert selection["simulated"] is True
    assert {"ar", "dflash-bs8-w2048"} <= set(selection["survivors"])
    # Which points lead the screening, and whether their cells settled, depends on timing noise; the refinement
    # must be sweep.refine's budget steps around exactly the first round's best points whose lead settled (budget 6
    # lies between the grid's 4 and 8).
    round1 = json.loads((adaptive_run / "results" / "screen" / "round1.json").read_text())
    config = load_config(adaptive_run / "results" / "study_config.yaml")  # the study as the workflow ran it
    around = settled_leaders(round1["best"], round1.get("unstable", {}))
    expected = {p.point_id for p in refine_candidates(config, around)}
    assert set(selection["refine"]) == set(round1["refine"]) == expected
    assert expected <= {"bs8-b6-t1-w2048", "bs8-b6-t4-w2048"}
    baselines = BASELINES
    for pid in selection["screened"]:  # a baseline's one full launch stands for its screening
        job = f"confirm/{pid}/launch-0" if pid in baselines else f"screen/{pid}"
        assert (adaptive_run / "results" / job / "status.json").exists(), pid
    assert not any((adaptive_run / "results" / "screen" / pid).exists() for pid in baselines)
    # The race: the screening stands for a candidate's launch 0 (of the grid's 2), and the final selection, the
    # race's first round, lists the confirmed points, which alone run launch 1 and have every launch merged into
    # results/points/. Then settling rounds, until one leaves nothing unsettled (how many depends on timing
    # noise): the record of the last lists the settling launches each point ran, merged as further repeats of the
    # regime cells.
    races = [json.loads(path.read_text()) for path in sorted((adaptive_run / "results" / "confirm").glob("race-*"))]
    assert {"ar", "dflash-bs8-w2048"} <= set(races[0]["survivors"])
    assert all(race["survivors"] == selection["survivors"] for race in races)
    assert races[-1]["settle"] == [] and all(race["settle"] for race in races[:-1])
    extra = races[-1]["extra_launches"]
    for pid in selection["survivors"]:  # a baseline's one launch 0, a candidate's launch 1, the settling launches
        launches = sorted((adaptive_run / "results" / "confirm" / pid).glob("launch-*/status.json"))
        assert [p.parent.name for p in launches][:1] == ["launch-0" if pid in baselines else "launch-1"], pid
        assert len(launches) == 1 + len(extra.get(pid, [])), pid
    regime_cells = {(128, 1), (128, 8)}  # the regimes a priority weighs: latency and throughput
    matrix = {(context, c) for context in (128, 2048) for c in (1, 4, 8)}
    for pid in selection["survivors"]:  # a candidate's first launch, its screening, measures what the race compares
        first = json.loads((adaptive_run / "results" / ("confirm" if pid in baselines else "screen") / pid
                            / ("launch-0" if pid in baselines else "") / "bench" / "cells.json").read_text())
        measured = {(c["context"], c["concurrency"]) for c in first["cells"]}
        assert measured == (matrix if pid in baselines else regime_cells), pid
    for pid in races[0]["survivors"]:
        cells = json.loads((adaptive_run / "results" / "points" / pid / "bench" / "cells.json").read_text())
        repeats = {(c["context"], c["concurrency"]): set() for c in cells["cells"]}
        for c in cells["cells"]:
            repeats[c["context"], c["concurrency"]].add(c["repeat"])
        assert set(repeats) == matrix, pid
        for cell, seen in repeats.items():
            # every cell: every repeat (a baseline's one launch, a candidate's last); the regime cells besides: a
            # candidate's screening (one repeat, the smaller share) and the settling launches
            earlier = (pid not in baselines) + len(extra.get(pid, []))
            assert len(seen) == 3 + (earlier if cell in regime_cells else 0), (pid, cell)
    assert sorted(p.name for p in (adaptive_run / "results" / "points").iterdir()) == sorted(races[0]["survivors"])
    assert [r["stage"] for r in races[-1]["rounds"]] == [
        "screen", "refine, race cap", *(f"settle after launch {k}" for k in range(2, len(races) + 2))]
    selection = races[-1]
    assert not set(selection["dropped"]) & set(selection["survivors"])
    funnel = json.loads((adaptive_run / "results" / "screen" / "funnel.json").read_text())
    assert funnel["stages"]["screen"]["points"] == 3  # the grid's 3 (budget 4, topk 4 is an alias)
    assert funnel["stages"]["baselines"]["points"] == 3  # measured once each, not screened
    assert funnel["stages"]["refine"]["points"] == len(selection["refine"])
    assert funnel["stages"]["confirm"]["points"] == len(selection["survivors"]) - 3
    assert funnel["stages"]["settle"]["points"] == len(extra)
    assert funnel["survivors"] == selection["survivors"]
    assert all(stage["job_min"] > 0 for stage in funnel["stages"].values() if stage["points"])
    assert "SIMULATED" in (adaptive_run / "reports" / "adaptive_funnel.md").read_text()
    # each rule's drops, and the jobs' cost in the plan's cost model against the grid's estimate
    assert sum(funnel["dropped_by_rule"].values()) == len(selection["dropped"])
    cost = funnel["cost"]
    assert cost["cells"] > 0 and 0 <= cost["unsettled_share"] <= 1 and cost["grid_estimate_min"] > 0
    assert cost["ratio_to_grid"] == pytest.approx(cost["jobs_estimate_min"] / cost["grid_estimate_min"])
    summary = (adaptive_run / "reports" / "optimization_summary.md").read_text()
    assert "## Best point per regime" in summary
    assert "Adaptive study: screening funnel" in summary
    assert "only the cells the selection compares ran in every launch" in summary  # the others: one launch
    assert "Dropped by rule: " in summary and f"{cost['ratio_to_grid']:.0%} of the full grid's" in summary
    # Dropped points appear only in the funnel, each with why; the decisions cover the confirmed points only.
    head, funnel_text = summary.split("Adaptive study: screening funnel", 1)
    funnel_text = funnel_text.split("\n## ", 1)[0]
    assert all(f"`{pid}`" not in head + summary.split(funnel_text, 1)[1] for pid in selection["dropped"])
    assert all(f"`{pid}` dropped: " in funnel_text for pid in selection["dropped"])


@pytest.mark.slow
def test_a_second_invocation_schedules_nothing(adaptive_run):
    result = snakemake(adaptive_run, "-n", *CORES, *CONFIGS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr


@pytest.mark.slow
def test_changing_the_analysis_reruns_no_screening_or_confirmation(adaptive_run, tmp_path):
    adaptive_run = with_the_analysis_changed(adaptive_run, tmp_path)
    result = snakemake(adaptive_run, *CORES, "--configfile", "changed.yaml", ".test/adaptive.yaml",
                       "no_coding.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    executed = set(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", result.stdout + result.stderr, re.MULTILINE))
    assert {"screen_select", "screen_final", "summarize"} <= executed  # the selection and summary are redone
    assert not {"screen_point", "confirm_launch", "confirm_merge"} & executed, executed
    assert "confirm_race" in executed  # the race is a selection too: it follows the analysis


@pytest.mark.slow
def test_a_new_confirmation_benchmark_reruns_every_launch_and_unsettled_picks_settle_on_the_regime_cells(
        adaptive_run, tmp_path):
    # the analysis change as well, in the same run: this test need not wait for the one above
    adaptive_run = with_the_analysis_changed(adaptive_run, tmp_path)
    config = yaml.safe_load((adaptive_run / "changed.yaml").read_text())
    config["benchmark"]["requests_per_cell"] = 6  # the screening has its own (sweep.screen.requests_per_cell)
    (adaptive_run / "more_requests.yaml").write_text(yaml.safe_dump(config))
    # An assumed launch variation of 100% leaves every close rival unsettled after the two configured launches,
    # so each priority's leader and one rival (race_keep 2) run the one settling launch allowed.
    (adaptive_run / "settle.yaml").write_text(yaml.safe_dump(
        {"sweep": {"screen": {"launch_cv": 1.0, "settle_launches": 1}}}))
    screened = {d.name for d in (adaptive_run / "results" / "screen").iterdir() if d.is_dir()}
    result = snakemake(adaptive_run, *CORES, "--configfile", "more_requests.yaml", ".test/adaptive.yaml",
                       "no_coding.yaml", "settle.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    # No screening runs again. A refinement point may be screened for the first time: the points the selection
    # refines around follow figures measured with noise (a ci run screened bs8-b6-t4-w2048 this way).
    assert screened and not screened & set(re.findall(r"output: results/screen/([\w.-]+)/done\.json", output))
    ran = {k for _, k in re.findall(r"wildcards: apoint=([\w.-]+), launch=(\d+)", output)}
    assert {"0", "1", "2"} <= ran <= {"0", "1", "2", "3"}
    # Every confirmation launch of every confirmed point ran with the new setting: no merged point mixes old and
    # new launches; a candidate's screening, its launch 0, keeps its own requests (sweep.screen.requests_per_cell).
    confirm = adaptive_run / "results" / "confirm"
    selection = json.loads((adaptive_run / "results" / "screen" / "selection.json").read_text())
    for pid in selection["survivors"]:
        cells = json.loads((adaptive_run / "results" / "points" / pid / "bench" / "cells.json").read_text())["cells"]
        # every repeat, and a candidate's screening (its regime cells) besides
        assert len({c["repeat"] for c in cells if c["launch"] < 2}) == (3 if pid in BASELINES else 4), pid
        screening = pid not in BASELINES
        assert all(c["requests"] >= max(4 if screening and c["launch"] == 0 else 6, c["concurrency"])
                   for c in cells), pid  # at least C per cell
    # The settling launch measures the regime cells only, merged as a further repeat of them.
    first, last = (json.loads((confirm / f"race-{k}.json").read_text()) for k in (1, 2))
    assert len(first["settle"]) >= 2 and last["settle"] == []
    assert last["extra_launches"] == {pid: [2] for pid in first["settle"]}
    assert all((confirm / pid / "launch-2" / "status.json").exists() for pid in first["settle"])
    for pid in last["survivors"]:
        cells = json.loads((adaptive_run / "results" / "points" / pid / "bench" / "cells.json").read_text())["cells"]
        settled = {(c["context"], c["concurrency"]) for c in cells if c["launch"] == 2}
        assert settled == ({(128, 1), (128, 8)} if pid in first["settle"] else set()), pid
    funnel = json.loads((adaptive_run / "results" / "screen" / "funnel.json").read_text())
    assert funnel["stages"]["settle"]["points"] == len(first["settle"])
    assert funnel["stages"]["settle"]["job_min"] > 0
    assert "| settle after launch 2 |" in (adaptive_run / "reports" / "adaptive_funnel.md").read_text()


@pytest.mark.slow
def test_a_dry_run_of_a_fresh_adaptive_study_lists_the_screening_and_the_first_race(tmp_path):
    # the race's inputs wait for the checkpoints; its command must still be formatted in a dry run
    workdir = copy_workflow(tmp_path)
    (workdir / "no_coding.yaml").write_text(yaml.safe_dump(NO_CODING))
    result = snakemake(workdir, "-n", *CORES, *CONFIGS)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert re.search(r"^screen_point\s+\d+$", output, re.MULTILINE) and re.search(r"^confirm_race\s+\d+$", output,
                                                                                  re.MULTILINE), output[-3000:]


@pytest.mark.slow
def test_a_refinement_point_recommended_by_an_adaptive_study_can_get_its_full_humaneval(tmp_path):
    # bs8-b6-t4-w2048 is not configured: sweep.refine reaches it from the grid's budgets 4 and 8
    workdir = copy_workflow(tmp_path)
    (workdir / "picks.yaml").write_text(yaml.safe_dump({"coding_eval": {"full_on_picks": True}}))
    target = "results/coding_full/bs8-b6-t4-w2048/done.json"
    result = snakemake(workdir, target, "-n", *CORES, "--configfile", ".test/config.yaml",
                       ".test/adaptive.yaml", "picks.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert re.search(r"^coding_full\s+1$", output, re.MULTILINE) and "pick=bs8-b6-t4-w2048" in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.xdist_group("repo-root")  # Snakemake in the repository itself
def test_the_adaptive_workflow_lints_clean():
    root = Path(__file__).resolve().parents[2]
    result = snakemake(root, "--lint", "--configfile", ".test/config.yaml", ".test/adaptive.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "good condition" in result.stdout + result.stderr
