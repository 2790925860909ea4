"""The Snakemake workflow end to end with real Snakemake: the demo study, reruns after a change, bad configs."""

from __future__ import annotations

import csv
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from configs import study_yaml
from conftest import ROOT, across_workers, copy_workflow, shared_study, venv_env
from decision_checks import check_first_screen

from ddsweep.plotting.plots import PLOTS

pytestmark = pytest.mark.full("the demo study in full (17 server starts), its reruns, the HTML report in a browser")


def snakemake(workdir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run Snakemake in `workdir` with this interpreter's environment on PATH."""
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, env=venv_env(), capture_output=True,
                          text=True, timeout=timeout, check=False)


def scheduled_jobs(output: str) -> dict[str, int]:
    """Rule -> job count from Snakemake's 'Job stats' table."""
    match = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\ntotal", output, re.DOTALL)
    assert match, output[-3000:]
    return {rule: int(count) for rule, count in (line.split() for line in match.group(1).strip().splitlines())}


def scheduling_log(log: Path) -> list[dict]:
    """Snakemake's log of a run as its events in order: each job it started (`start`: rule, jobid, wildcards) and
    each job it saw finish (`finished`: jobid, rule)."""
    events: list[dict] = []
    current: dict | None = None
    for line in log.read_text().splitlines():
        if started := re.match(r"(?:local)?(?:rule|checkpoint) (\w+):$", line):
            current = {"event": "start", "rule": started[1], "jobid": None, "wildcards": ""}
            events.append(current)
        elif finished := re.match(r"Finished jobid: (\d+) \(Rule: (\w+)\)", line):
            events.append({"event": "finished", "jobid": finished[1], "rule": finished[2]})
            current = None
        elif current and (field := re.match(r"\s+(jobid|wildcards): (.*)$", line)):
            current[field[1]] = field[2]
    return events


@pytest.fixture(scope="session")
@across_workers
def demo_run(tmp_path_factory) -> Path:
    """The demo study run once per session, end to end, through real Snakemake against the stand-in server (its
    tests read it from any worker: those that run jobs in it work on a copy)."""
    return shared_study(tmp_path_factory, "demo", _run_demo)


def _run_demo(workdir: Path) -> None:
    """Run the demo study in a new working copy at `workdir`."""
    copy_workflow(workdir, strict_standin=True)
    # with the end-of-study reference runs (sweep.reference), which are on by default only on Slurm
    demo = yaml.safe_load((workdir / ".test" / "config.yaml").read_text())
    demo["sweep"]["reference"] = {"enabled": True}
    # 8 requests per cell, not the demo's 4*C: the tests read what the study records and decides, not its precision
    demo["benchmark"]["requests_per_cell"] = 8
    # a strict stand-in imports SGLang at every start (seconds of CPU): on a loaded machine that can outlast the
    # demo's 60 s. The ar launches run strict, so every request the benchmark and the coding eval send is checked
    # with SGLang's classes; the DFlash and DDTree launches (the same requests) run lenient, their command lines
    # checked with SGLang's parser by the preflight (every preset's requests run strict in tests/contract/).
    demo["engine"]["startup_timeout_s"] = 240
    presets = study_yaml()["engine"]["presets"]
    demo["engine"]["presets"] = {name: {**presets[name], "args": [*presets[name]["args"], "--sim-strict", "off"]}
                                 for name in ("ddtree", "dflash", "dflash-nooverlap")}
    (workdir / ".test" / "config.yaml").write_text(yaml.safe_dump(demo, sort_keys=False))
    # two server launches per point (sweep.launches) and the reference run: 17 start-ups, ar's three strict. The
    # stand-in's launches mostly wait, so four run at once.
    result = snakemake(workdir, "--cores", "4", "--configfile", ".test/config.yaml", timeout=1500)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "optimization summary in reports/optimization_summary.md" in result.stdout + result.stderr


@pytest.mark.slow
def test_demo_produces_a_simulated_summary_tables_plots_and_a_bundle(demo_run):
    summary = (demo_run / "reports" / "optimization_summary.md").read_text()
    assert "SIMULATED" in summary
    assert "## Best point per regime" in summary
    points = list(csv.DictReader((demo_run / "results" / "tables" / "points.csv").open()))
    assert {p["point_id"] for p in points} >= {"ar", "dflash-bs8-w2048", "bs8-b8-t4-w2048", "bs16-b8-t4-w2048"}
    ran = [p for p in points if p["status"] != "alias"]
    assert len(ran) == 8 and all(p["status"] == "ok" and p["simulated"] == "True" for p in ran)
    alias = next(p for p in points if p["point_id"] == "bs8-b8-t8-w2048")
    assert alias["status"] == "alias" and alias["alias_of"] == "bs8-b8-t4-w2048" and alias["tree_width"] == "2"
    assert not (demo_run / "results" / "points" / "bs8-b8-t8-w2048").exists()
    # every point ran in two server launches (sweep.launches), its three repeats split 2 + 1
    for p in ran:
        launches = json.loads((demo_run / "results" / "points" / p["point_id"] / "launches.json").read_text())
        assert [entry["repeats"] for entry in launches["launches"]] == [[0, 1], [2]], p["point_id"]
    document = json.loads((demo_run / "reports" / "summary.json").read_text())
    spread = next(c for c in document["caveats"] if c["kind"] == "launch_spread")
    assert spread["spreads"] and all(s["df"] >= len(ran) - 1 for s in spread["spreads"])
    assert "Launch-to-launch spread" in summary and "Does DDTree beat the DFlash chain?" in summary
    assert "`dflash-nooverlap-bs8-w2048` (overlap scheduler off, like DDTree)" in summary
    for plot in ("throughput_vs_concurrency", "pareto", "heatmap_latency"):
        assert (demo_run / "reports" / "plots" / f"{plot}.png").stat().st_size > 10_000
    bundle = yaml.safe_load((demo_run / "reports" / "bundle.json").read_text())["bundle"]
    verify = subprocess.run([sys.executable, "-m", "ddsweep", "bundle", "verify", str(demo_run / bundle)],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.slow
def test_demo_summary_opens_with_the_decision_and_has_the_load_level_table(demo_run):
    summary = (demo_run / "reports" / "optimization_summary.md").read_text()
    document = json.loads((demo_run / "reports" / "summary.json").read_text())
    presets = study_yaml()["engine"]["presets"]
    check_first_screen(summary, document, presets)
    assert "## Best configuration per load level" in summary
    levels = document["load_levels"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4, 8]
    for lv in levels:  # every tied decision names the member it recommends
        row = next(line for line in summary.splitlines() if line.startswith(f"| {lv['concurrency']} | "))
        assert f"`{lv['recommended']}`" in row
    for regime in document["regimes"]:
        if regime["tied"]:
            assert f"recommended **`{regime['recommended']}`**" in summary
    assert (demo_run / "reports" / "plots" / "pareto_per_user.png").stat().st_size > 10_000


@pytest.mark.slow
def test_demo_summary_renders_byte_for_byte_from_its_summary_json(demo_run, tmp_path):
    result = subprocess.run([sys.executable, "-m", "ddsweep", "summarize", "--from", "reports/summary.json", "--out",
                             str(tmp_path)], cwd=demo_run, env=venv_env(), capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert ((tmp_path / "optimization_summary.md").read_bytes()
            == (demo_run / "reports" / "optimization_summary.md").read_bytes())


@pytest.mark.slow
def test_every_point_records_verification_environment_and_measurements(demo_run):
    point = demo_run / "results" / "points" / "bs8-b8-t4-w2048"
    for name in ("point.json", "server.log", "server_info.json", "verification.json", "environment.json",
                 "bench/cells.json", "bench/requests.jsonl", "coding/problems.jsonl", "coding/summary.json"):
        assert (point / name).exists(), name
    verification = yaml.safe_load((point / "verification.json").read_text())
    # four /server_info keys and the DDTree worker's start-up line (block size and budget)
    assert verification["ok"] and len(verification["checks"]) == 5
    assert [c["ok"] for c in verification["checks"] if c["source"] == "log"] == [True]
    environment = yaml.safe_load((point / "environment.json").read_text())
    assert environment["simulated"] is True and environment["hostname"]


def _utc(path: Path, key: str) -> str:
    return json.loads(path.read_text())[key]


@pytest.mark.slow
def test_the_reference_point_runs_first_and_again_after_every_point_and_its_drift_is_a_caveat(demo_run):
    points = sorted((demo_run / "results" / "points").iterdir())
    started = {p.name: _utc(p / "status.json", "started_utc") for p in points}
    # Scheduled first, by priority: in Snakemake's log of the run, the jobs it started as soon as the reference
    # preset's preflight had finished include the reference point's first launch (before then other presets'
    # launches may start: a priority is not a barrier).
    events = scheduling_log(sorted((demo_run / ".snakemake" / "log").glob("*.snakemake.log"))[0])
    preflight = next(e for e in events if e["event"] == "start" and e["wildcards"] == "preset=ar")
    ready = events.index({"event": "finished", "jobid": preflight["jobid"], "rule": "preflight"})
    batch = list(itertools.takewhile(lambda e: e["event"] == "start",
                                     itertools.dropwhile(lambda e: e["event"] == "finished", events[ready:])))
    assert "point=ar, launch=0" in [e["wildcards"] for e in batch if e["rule"] == "launch_point"], batch
    hosts = json.loads((demo_run / "results" / "reference" / "hosts.json").read_text())["hosts"]
    assert len(hosts) == 1 and hosts[0]["points"] == sorted(started)  # locally one host ran every point
    end = demo_run / "results" / "reference" / f"end-{hosts[0]['host']}"
    assert _utc(end / "status.json", "started_utc") >= max(_utc(p / "status.json", "finished_utc") for p in points)
    assert _utc(end / "point.json", "point_id") == "ar" and not (end / "coding").exists()
    document = json.loads((demo_run / "reports" / "summary.json").read_text())
    caveat = next(c for c in document["caveats"] if c["kind"] == "reference_runs")
    assert {c["regime"] for c in caveat["comparisons"]} == {"latency", "long_context", "throughput"}
    for comparison in caveat["comparisons"]:
        assert comparison["host"] == hosts[0]["host"] and comparison["ratio"]["value"] > 0
        assert comparison["ratio"]["ci_low"] <= comparison["ratio"]["value"] <= comparison["ratio"]["ci_high"]
        assert comparison["verdict"] in ("drift", "within", "not settled")
    assert "Reference point at the start and the end of the study" in (
        demo_run / "reports" / "optimization_summary.md").read_text()
    jobs = list(csv.DictReader((demo_run / "results" / "tables" / "jobs.csv").open()))
    assert sorted(j["point_id"] for j in jobs) == sorted(started)  # the end run is not a point


@pytest.mark.slow
def test_nothing_to_do_after_a_complete_run(demo_run):
    result = snakemake(demo_run, "-n", "--cores", "2", "--configfile", ".test/config.yaml")
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr


@pytest.mark.slow
def test_changing_one_points_topk_reruns_only_that_point_and_the_aggregates(demo_run):
    config = yaml.safe_load((demo_run / ".test" / "config.yaml").read_text())
    changed = next(p for p in config["sweep"]["points"] if p["block_size"] == 16)
    changed["topk"] = 2
    (demo_run / "changed.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(demo_run, "-n", "--cores", "2", "--configfile", "changed.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = scheduled_jobs(result.stdout + result.stderr)
    # the end of the study moves: the host inventory is rewritten (the reference run follows once it has been)
    assert jobs == {"launch_point": 2, "merge_point_launches": 1, "study_config": 1, "plan": 1, "reference_hosts": 1,
                    "summarize": 1, "bundle": 1, "all": 1}
    assert "results/points/bs16-b8-t2-w2048/done.json" in result.stdout + result.stderr


@pytest.mark.slow
def test_changing_only_analysis_settings_reruns_no_point_job(demo_run, tmp_path):
    demo_run = Path(shutil.copytree(demo_run, tmp_path / "copy", symlinks=True))  # the real run changes files
    config = yaml.safe_load((demo_run / ".test" / "config.yaml").read_text())
    config["analysis"].update(confidence=0.9, equivalence_margin=0.05, min_repeats_for_decision=2)
    config["analysis"]["priorities"]["interactive"] = {"throughput": 1.0, "slo": {"ttft_p99_s": 2.0}}
    (demo_run / "analysis.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(demo_run, "-n", "--cores", "2", "--configfile", "analysis.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = scheduled_jobs(result.stdout + result.stderr)
    # only aggregate jobs: the study file, the plan (it holds the whole study), the summary and the bundle
    assert jobs == {"study_config": 1, "plan": 1, "summarize": 1, "bundle": 1, "all": 1}
    # Run it: the summary is recomputed from the stored request records at the new level.
    result = snakemake(demo_run, "--cores", "2", "--configfile", "analysis.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((demo_run / "reports" / "summary.json").read_text())
    assert document["statistics"]["confidence"] == 0.9
    assert document["statistics"]["data_source"] == ["requests.jsonl"]
    assert "90% CI" in (demo_run / "reports" / "optimization_summary.md").read_text()
    interactive = next(p for p in document["priorities"] if p["name"] == "interactive")
    assert interactive["slo"]["limits"] == {"ttft_p99_s": 2.0}
    assert set(interactive["slo"]["points"]) >= {"ar", "bs8-b8-t4-w2048"}


@pytest.mark.slow
def test_changing_the_benchmark_matrix_reruns_every_point(demo_run):
    config = yaml.safe_load((demo_run / ".test" / "config.yaml").read_text())
    config["benchmark"]["max_new_tokens"] = 32  # every launch measures something else now
    (demo_run / "matrix.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(demo_run, "-n", "--cores", "2", "--configfile", "matrix.yaml")
    assert scheduled_jobs(result.stdout + result.stderr)["launch_point"] == 16  # two launches of each point


@pytest.mark.slow
def test_operational_settings_rerun_no_launch_and_the_contexts_rerun_every_launch(demo_run):
    config = yaml.safe_load((demo_run / ".test" / "config.yaml").read_text())
    slower = {**config, "engine": {**config["engine"], "startup_timeout_s": 300, "shutdown_timeout_s": 20},
              "benchmark": {**config["benchmark"], "request_timeout_s": 120}, "resources": {"retries": 4}}
    (demo_run / "operational.yaml").write_text(yaml.safe_dump(slower))
    result = snakemake(demo_run, "-n", "--cores", "2", "--configfile", "operational.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = scheduled_jobs(result.stdout + result.stderr)
    assert set(jobs) <= {"study_config", "plan", "summarize", "bundle", "all"}, jobs
    contexts = {**config, "benchmark": {**config["benchmark"], "contexts": [128, 1024]}}
    contexts["analysis"]["regimes"] = [r for r in config["analysis"]["regimes"] if r["context"] == 128]
    (demo_run / "contexts.yaml").write_text(yaml.safe_dump(contexts))
    result = snakemake(demo_run, "-n", "--cores", "2", "--configfile", "contexts.yaml")
    assert scheduled_jobs(result.stdout + result.stderr)["launch_point"] == 16, result.stdout[-3000:]


@pytest.mark.slow
def test_bad_config_stops_before_any_job_with_the_key_named(tmp_path):
    workdir = copy_workflow(tmp_path / "wf", strict_standin=True)
    config = yaml.safe_load((workdir / ".test" / "config.yaml").read_text())
    config["sweep"]["points"].append({"preset": "ddtree", "budget": 8, "topk": 4, "block_size": 16, "window": 8})
    (workdir / "bad.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(workdir, "--cores", "1", "--configfile", "bad.yaml")
    assert result.returncode != 0
    index = len(config["sweep"]["points"]) - 1
    assert f"sweep.points[{index}].window: window 8 is smaller than block_size 16" in result.stdout + result.stderr
    assert not (workdir / "results").exists()


@pytest.mark.slow
def test_unknown_key_stops_before_any_job(tmp_path):
    workdir = copy_workflow(tmp_path / "wf", strict_standin=True)
    (workdir / "bad.yaml").write_text("benchmark:\n  repeat: 3\n")
    result = snakemake(workdir, "-n", "--cores", "1", "--configfile", ".test/config.yaml", "bad.yaml")
    assert result.returncode != 0
    assert "benchmark: unknown key(s) 'repeat'" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("repo-root")  # Snakemake in the repository itself
def test_workflow_lints_clean():
    result = snakemake(ROOT, "--lint", "--configfile", ".test/config.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "good condition" in result.stdout + result.stderr


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.slow
def test_html_report_opens_in_a_browser_shows_every_plot_and_has_no_broken_links(demo_run, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    result = snakemake(demo_run, "--report", "reports/report.zip", "--configfile", ".test/config.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    shutil.unpack_archive(demo_run / "reports" / "report.zip", tmp_path)
    page_path = tmp_path / "report" / "report.html"
    html = page_path.read_text()
    referenced = set(re.findall(r"data/raw/[0-9a-f]+/[\w.]+", html))
    assert len(referenced) == len(PLOTS) + 1  # every plot and the summary
    assert all((page_path.parent / ref).is_file() for ref in referenced)
    failures: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page()
        page.on("requestfailed", lambda request: failures.append(request.url))
        page.on("response", lambda response: response.status >= 400 and failures.append(response.url))
        page.goto(page_path.as_uri())
        page.wait_for_load_state("networkidle")
        assert "Summary" in page.inner_text("body")
        page.get_by_text("Plots", exact=True).click()
        shown = {}
        for plot in ("throughput_vs_concurrency", "decode_speed_by_point", "acceptance_vs_budget",
                     "heatmap_latency", "heatmap_throughput", "pareto", "coding"):
            page.locator("tr", has_text=f"{plot}.png").locator("a[iconname=eye]").click()
            image = page.locator(f"img[src$='/{plot}.png']")
            image.wait_for(timeout=10_000)
            # decode() settles once the image has loaded (or failed: then the width stays 0)
            shown[plot] = image.evaluate("img => img.decode().then(() => img.naturalWidth, () => 0)")
        browser.close()
    assert all(width > 300 for width in shown.values()), shown
    assert failures == []


@pytest.mark.slow
def test_full_humaneval_on_the_picks_runs_after_the_study_without_rerunning_a_point(demo_run, tmp_path):
    demo_run = Path(shutil.copytree(demo_run, tmp_path / "copy", symlinks=True))  # the real run changes files
    config = yaml.safe_load((demo_run / ".test" / "config.yaml").read_text())
    config["coding_eval"]["full_on_picks"] = True
    (demo_run / "picks.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(demo_run, "-n", "--cores", "2", "--configfile", "picks.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = scheduled_jobs(result.stdout + result.stderr)
    assert "coding_picks" in jobs and not {"launch_point", "run_point", "merge_point_launches"} & set(jobs), jobs
    result = snakemake(demo_run, "--cores", "4", "--configfile", "picks.yaml", timeout=1200)  # the picks at once
    assert result.returncode == 0, result.stderr[-5000:]
    picks = json.loads((demo_run / "results" / "coding_full" / "picks.json").read_text())
    document = json.loads((demo_run / "reports" / "summary.json").read_text())
    recommended = {e["recommended"] for e in document["decision"]["priorities"] if e["recommended"]}
    assert set(picks["picks"]) == recommended and picks["run"]
    section = next(s for s in document["sections"] if s["kind"] == "full_coding")
    assert {row["point_id"] for row in section["rows"]} == recommended
    for row in section["rows"]:
        if row["point_id"] in picks["run"]:
            status = json.loads((demo_run / "results" / "coding_full" / row["point_id"] / "status.json").read_text())
            assert status["steps"]["bench"] == "skipped" and status["steps"]["coding"] == "ok"
            assert row["problems"] == 164 and row["passed"]["trials"] == 164
            assert not (demo_run / "results" / "coding_full" / row["point_id"] / "bench").exists()
    summary = (demo_run / "reports" / "optimization_summary.md").read_text()
    assert "## Full HumanEval on the recommended points" in summary
