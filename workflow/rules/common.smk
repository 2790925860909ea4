import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

from snakemake.cli import get_profile_dir
from snakemake.utils import validate

from ddsweep.config.families import canary_records
from ddsweep.config.launches import grid_launches, job_digests
from ddsweep.config.operational import OPERATIONAL_KEYS, measurement_record, operational_settings
from ddsweep.config.plan import running_points
from ddsweep.config.reference import reference_enabled, reference_point
from ddsweep.adaptive.stages import is_adaptive
from ddsweep.config.records import point_record
from ddsweep.config.study import ConfigError, validate_config
from ddsweep.point.failures import drop_persisted_records, note_reruns
from ddsweep.budget import ENV as BUDGET_ENV
from ddsweep.budget import make_budget
from ddsweep.point.marks import STORE_ENV
from ddsweep.slurm import slurm_time_left_s
from ddsweep.store import StoreError, StudyStore, describe_pull, pull, store_units
from ddsweep.point.workflow_watch import stop_point_jobs_on_sigterm

# Snakemake answers SIGTERM by waiting for its running jobs: a point job would measure on for hours. The point jobs
# it runs on this machine get the SIGTERM too, and record themselves as interrupted (docs/faults.md).
stop_point_jobs_on_sigterm()
from ddsweep.findings.progress import study_status
from ddsweep.report.status import outcome_line

# ddsweep's own check first: its messages name the key and the rule broken, and STUDY, which every rule reads,
# has the schema's defaults filled. The catalog-style schema validation follows without filling defaults itself:
# Snakemake's filler cannot skip a section the schema allows to be null (`baselines: {dflash: null}`).
try:
    STUDY = validate_config(config)
except ConfigError as error:
    raise WorkflowError(f"bad configuration: {error}") from None
# A Slurm job's own Snakemake reads the configuration its main process checked (0.1 s of CPU a job saved).
if workflow.is_main_process:
    validate(config, schema="../schemas/config.schema.yaml", set_default=False)

# Only the points that run: of points with the same server configuration, the representative (aliases are
# recorded in results/plan.json), unless sweep.run_aliases is true.
POINTS = {point.point_id: point for point in running_points(STUDY)}
RESOURCES = STUDY["resources"]
# sweep.strategy auto runs adaptive only when `ddsweep plan` expects it to be cheaper than the grid, given the
# share of cells that do not settle in the earlier records under results/; the first invocation records its choice
# (results/strategy.json) and later ones, and Slurm jobs, keep it. The rules see the strategy chosen,
# results/plan.json records the configured one, the choice and both estimates.
CONFIGURED_STRATEGY = STUDY["sweep"]["strategy"]
try:
    ADAPTIVE = is_adaptive(STUDY, Path("results"), write=workflow.is_main_process)
except ValueError as error:
    raise WorkflowError(f"sweep.strategy auto: {error}") from None
STUDY["sweep"]["strategy"] = "adaptive" if ADAPTIVE else "grid"
# The point measured again at the end of a grid study on every host that ran points (sweep.reference;
# workflow/rules/reference.smk), or None.
REFERENCE = reference_point(STUDY)
# Server launches per grid point (sweep.launches; workflow/rules/launches.smk).
LAUNCHES = grid_launches(STUDY)
# The server presets the running points use, one preflight each (workflow/rules/preflight.smk).
PRESETS = sorted({point.preset for point in POINTS.values()})

# The study store (`store`; workflow/rules/store.smk): a fresh working directory first takes every finished job
# from it, with its mtimes, so that Snakemake runs only what is missing; an attempt that started and never ended
# is reported as interrupted, and its job runs again whole. Point jobs mark their attempts there (DDSWEEP_STORE).
STORE = STUDY["store"]
if STORE and ADAPTIVE:
    raise WorkflowError("bad configuration: store: a study store holds grid studies (sweep.strategy grid)")
os.environ.setdefault(STORE_ENV, STORE or "")
if STORE and workflow.is_main_process:
    try:
        units, digests = store_units(PRESETS, POINTS, LAUNCHES), job_digests(STUDY, POINTS)
        print(describe_pull(pull(StudyStore.open(STORE), Path("."), units, digests), STORE))
    except StoreError as error:
        raise WorkflowError(f"study store: {error}") from None
# The invocation's time budget (`budget_s`, and the Slurm allocation it runs in): point jobs that would not finish
# in the time left are recorded as not started (ddsweep.budget).
if workflow.is_main_process:
    BUDGET = make_budget(STUDY, Path("results"), time.time(), slurm_time_left_s())
    os.environ[BUDGET_ENV] = BUDGET.to_env() if BUDGET else ""
os.environ.setdefault(BUDGET_ENV, "")


envvars:
    STORE_ENV,
    BUDGET_ENV,


# An infrastructure failure that outlasted the retries of an earlier invocation was that invocation's result
# (done.json `persisted`): this one drops the record and runs the job again, the summary with it (reruns.json,
# an input of the summary). Only the main process: a Slurm job reads this file too.
if workflow.is_main_process:
    stages = ["screen", "confirm", "points"] if ADAPTIVE else ["points", "reference", "launches"]
    # a canary that runs again is judged again before its build's other points start (workflow/rules/canary.smk)
    canaries = canary_records(STUDY, Path("results"))
    RERUN = drop_persisted_records(Path("results"), POINTS, [*stages, "coding_full"], canaries)
    note_reruns(Path("results/reruns.json"), RERUN)
    for path in RERUN:
        print(f"ddsweep: {path} failed on the machine or was not started last time; running it again")


def command_line():
    """The profile and executor named on this run's command line (the executor is not known yet while the
    Snakefile is read)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--profile")
    parser.add_argument("--executor", "-e")
    given, _ = parser.parse_known_args(sys.argv[1:])
    return given


def command_line_executor():
    """The executor named on the command line: --executor, else the `executor:` of the profile (--profile or
    $SNAKEMAKE_PROFILE, found as Snakemake finds it), else local."""
    given = command_line()
    if given.executor:
        return given.executor
    profile = given.profile or os.environ.get("SNAKEMAKE_PROFILE")
    found = get_profile_dir(profile) if profile else None
    if not found:
        return "local"
    with open(found[1]) as handle:
        return (yaml.safe_load(handle) or {}).get("executor") or "local"


def on_slurm():
    """Whether the jobs go to Slurm: the executor Snakemake runs with (known once it builds the DAG), else (in a
    dry run, or while the Snakefile is read) the executor named on the command line."""
    name = getattr(workflow.executor_plugin, "name", None)
    if name in (None, "dryrun", "touch"):
        name = command_line_executor()
    return name == "slurm"


def reproduce_command():
    """The command of this run for the summary: its profile or executor and its config files."""
    words = ["snakemake", "--cores", "all"]
    given = command_line()
    if given.profile:
        words += ["--profile", given.profile]
    elif given.executor and given.executor != "local":
        words += ["--executor", given.executor]
    for path in workflow.config_settings.configfiles:
        words += ["--configfile", os.path.relpath(path)]
    return " ".join(words)


# The summary's "How to reproduce" shows the exact command, unless the configuration gives one.
STUDY.setdefault("reproduce_command", reproduce_command())

PLOTS = [
    "throughput_vs_concurrency",
    "decode_speed_by_point",
    "acceptance_vs_budget",
    "heatmap_latency",
    "heatmap_throughput",
    "pareto",
    "pareto_per_user",
    "coding",
]
TABLES = ["points", "bench_cells", "bench_groups", "coding", "overview", "failures", "jobs"]


wildcard_constraints:
    point="|".join(POINTS) or "(?!)",


def dry_run():
    """Whether this is a dry run (`snakemake -n`)."""
    return getattr(workflow.executor_plugin, "name", None) == "dryrun"


def canary_files():
    """The first-stage record of each engine build's canary (the input of checkpoint canaries)."""
    return [path.as_posix() for path in canary_records(STUDY, Path("results"))]


def after_canaries(files):
    """An input function giving FILES (a list, or an input function) once checkpoint canaries has run, so that
    no other point starts before its build's canary (workflow/rules/canary.smk); a dry run lists them at once:
    the gate orders the jobs, it does not change which run."""

    def inputs(wildcards):
        if not dry_run():
            checkpoints.canaries.get()
        return files(wildcards) if callable(files) else files

    return inputs


def point_done_files():
    """The terminal marker of every point in this configuration (completed, or failed because of its settings),
    once the canaries have run; in an adaptive study the confirmed points' markers (known after the selection
    checkpoints, workflow/rules/adaptive.smk, which wait for the canaries)."""
    if ADAPTIVE:
        return confirmed_done_files
    return after_canaries(expand("results/points/{point}/done.json", point=list(POINTS)))


# The operational settings of every point job (timeouts, the coding sandbox's isolation; config/operational.py)
# reach `ddsweep run-point` through the environment, not params: changing them reruns no completed point. As an
# ancient() file input, its rewriting would make Snakemake skip the params check of every job downstream.
os.environ["DDSWEEP_OPERATIONS"] = json.dumps(operational_settings(STUDY), sort_keys=True)


envvars:
    "DDSWEEP_OPERATIONS",


def record_json(record):
    """A point job's record param: its measurement-defining part only, as JSON (a change reruns the job)."""
    return json.dumps(measurement_record(record), sort_keys=True)


def point_record_json(wildcards):
    """What defines one point's measurement, as JSON: a change to it reruns that point only."""
    return record_json(point_record(STUDY, POINTS[wildcards.point]))


def engine_definition():
    """The engine settings that define a server (engine.presets and the operational keys aside)."""
    return {k: v for k, v in STUDY["engine"].items() if k != "presets" and k not in OPERATIONAL_KEYS["engine"]}


def knob(name):
    """A params function returning one knob of the wildcard's point (a scalar, for Snakemake's rerun check)."""
    return lambda wildcards: getattr(POINTS[wildcards.point], name)


def slurm_gpu_request():
    """The generic-resource GPU request for one point job."""
    gpus = RESOURCES["gpus"]
    return f"gpu:{gpus}" if gpus else ""


def point_job_resources(slurm_extra=None):
    """The resources of every job that starts a server (point, screening, confirmation launch, reference run),
    from the study's `resources:`; `slurm_extra` replaces the sbatch flags (a reference run pins its host)."""
    return {
        "gres": slurm_gpu_request(),
        "slurm_partition": RESOURCES.get("partition") or "",
        "runtime": RESOURCES["runtime_min"],
        "cpus_per_task": RESOURCES["cpus_per_task"],
        "mem_mb": RESOURCES["mem_mb"],
        "constraint": RESOURCES["constraint"],
        "nodes": RESOURCES["nodes"],
        "slurm_extra": slurm_extra or slurm_extra_flags(),
        # Snakemake's attempt of the job and how many it makes: on the last one an infrastructure failure is
        # recorded as the job's result of this invocation (`ddsweep run-point --attempt`), dropped at the next start
        "attempt": lambda wildcards, attempt: attempt,
        "attempts": RESOURCES["retries"] + 1,
        # under Slurm the point stops itself this long before the job's time limit (`--time-limit-lead-s`): its
        # job ends on its own, where a signal would also stop the Snakemake that runs it and lose the record
        "time_limit_lead_s": RESOURCES.get("signal_lead_s", 120),
    }


def slurm_extra_flags(nodelist=None):
    """sbatch flags the plugin has no resource for: whole nodes, node list (the study's, unless a job is pinned to
    `nodelist`), one task per node."""
    gpus = RESOURCES.get("gpus", 8)
    exclusive = RESOURCES.get("exclusive")
    nodelist = nodelist or RESOURCES.get("nodelist")
    flags = []
    if exclusive or (exclusive is None and gpus > 0):
        flags.append("--exclusive")
    if nodelist:
        flags.append(f"--nodelist={nodelist}")
    if RESOURCES.get("nodes", 1) > 1:
        flags.append("--ntasks-per-node=1")
    if RESOURCES.get("slurm_extra"):
        flags.append(RESOURCES["slurm_extra"])
    return " ".join(flags)


def reference_on():
    """Whether this run schedules the reference runs: sweep.reference.enabled true, or auto on Slurm."""
    return REFERENCE is not None and reference_enabled(STUDY, on_slurm())


def reference_priority(wildcard):
    """A priority function: 1 for the job of the reference point (wildcard `point`) or its preset's preflight
    (wildcard `preset`) when the reference runs, so that it is scheduled before the other points; 0 otherwise.
    An ordering by priority, not a barrier: nothing waits for it."""
    if REFERENCE is None:
        return 0
    wanted = {"point": REFERENCE.point_id, "preset": REFERENCE.preset}[wildcard]
    return lambda wildcards: int(wildcards[wildcard] == wanted and reference_on())


def launch_priority(wildcards):
    """A grid point's launch (workflow/rules/launches.smk): earlier launches first, so a point's launches are
    interleaved with other points'; the reference point's first launch before every other job (sweep.reference)."""
    first = reference_priority("point")
    reference = first(wildcards) if callable(first) else first
    return 2 * (LAUNCHES - int(wildcards.launch)) + reference


def reference_done_files(wildcards):
    """The end-of-study reference runs the summary needs (workflow/rules/reference.smk): one per host in
    results/reference/hosts.json when the reference runs (sweep.reference.enabled true, or auto on Slurm)."""
    if not reference_on():
        return []
    with checkpoints.reference_hosts.get().output[0].open() as handle:
        hosts = [entry["host"] for entry in json.load(handle)["hosts"]]
    return expand("results/reference/end-{host}/done.json", host=hosts)


def full_coding_on():
    """Whether the recommended points answer the full HumanEval after the study (coding_eval.full_on_picks)."""
    coding = STUDY["coding_eval"]
    return bool(coding["enabled"] and coding.get("full_on_picks"))


def coding_full_inputs(wildcards):
    """The picks of the full HumanEval and the done.json of each full run the summary waits for (none when
    coding_eval.full_on_picks is off; workflow/rules/coding_full.smk)."""
    if not full_coding_on():
        return []
    picks = checkpoints.coding_picks.get().output[0]
    with open(picks) as handle:
        run = json.load(handle)["run"]
    return [picks, *expand("results/coding_full/{pick}/done.json", pick=run)]


def final_outputs():
    """What `snakemake` builds by default: the summary, tables, plots and a bundle."""
    return [
        "reports/optimization_summary.md",
        "reports/summary.json",
        "reports/bundle.json",
        *expand("results/tables/{table}.csv", table=TABLES),
        *expand("reports/plots/{plot}.png", plot=PLOTS),
        *(["reports/adaptive_funnel.md"] if ADAPTIVE else []),
        *stored_markers(),
    ]


def stored_markers():
    """With a study store: the manifest of every job's directory and of the reports, once copied there (a preflight
    job copies its own result: ddsweep.point.preflight.store_result)."""
    if not STORE:
        return []
    return [f"{unit}/stored.json" for unit in [*store_units([], POINTS, LAUNCHES), "reports"]]


def study_outcome():
    """The study's outcome in one line, for the workflow's last line: points measured, failed, not started."""
    status = study_status(STUDY, Path("results"), {})
    line = outcome_line(status, Path("reports/optimization_summary.md"))
    return ("NOTHING WAS MEASURED: " if status["points"] and not status["counts"]["done"] else "") + line


def stored_unit_inputs(wildcards):
    """What a unit's copy waits for: its job's terminal record, or the finished reports."""
    if wildcards.unit == "reports":
        return [f for f in final_outputs() if f.startswith("reports/") and f != "reports/stored.json"]
    return [f"{wildcards.unit}/done.json"]
