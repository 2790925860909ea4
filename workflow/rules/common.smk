import argparse
import json
import os
import sys

from snakemake.utils import validate

from ddsweep.config.plan import running_points
from ddsweep.config.stages import is_adaptive
from ddsweep.config.study import ConfigError, point_record, validate_config

# ddsweep's own check first: its messages name the key and the rule broken; the catalog-style schema
# validation then fills in the schema's defaults.
try:
    STUDY = validate_config(config)
except ConfigError as error:
    raise WorkflowError(f"bad configuration: {error}") from None
validate(config, schema="../schemas/config.schema.yaml")

# Only the points that run: of points with the same server configuration, the representative (aliases are
# recorded in results/plan.json), unless sweep.run_aliases is true.
POINTS = {point.point_id: point for point in running_points(STUDY)}
RESOURCES = STUDY["resources"]
ADAPTIVE = is_adaptive(STUDY)


def reproduce_command():
    """The command of this run for the summary: its profile or executor (from the command line: the executor is not
    known yet while the Snakefile is read) and its config files."""
    words = ["snakemake", "--cores", "all"]
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--profile")
    parser.add_argument("--executor", "-e")
    given, _ = parser.parse_known_args(sys.argv[1:])
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
    "coding",
]
TABLES = ["points", "bench_cells", "bench_groups", "coding", "overview", "failures", "jobs"]


wildcard_constraints:
    point="|".join(POINTS) or "(?!)",


def point_done_files():
    """The terminal marker of every point in this configuration (completed, or failed because of its settings);
    in an adaptive study an input function giving the confirmed points' markers (known after the selection
    checkpoint, workflow/rules/adaptive.smk)."""
    if ADAPTIVE:
        return confirmed_done_files
    return expand("results/points/{point}/done.json", point=list(POINTS))


def point_record_json(wildcards):
    """Everything one point's job needs, as JSON: a change to it reruns that point only."""
    return json.dumps(point_record(STUDY, POINTS[wildcards.point]), sort_keys=True)


def knob(name):
    """A params function returning one knob of the wildcard's point (a scalar, for Snakemake's rerun check)."""
    return lambda wildcards: getattr(POINTS[wildcards.point], name)


def slurm_gpu_request():
    """The generic-resource GPU request for one point job."""
    gpus = RESOURCES["gpus"]
    return f"gpu:{gpus}" if gpus else ""


def slurm_extra_flags():
    """sbatch flags the plugin has no resource for: whole nodes, node list, the pre-timeout signal, one task per node."""
    gpus = RESOURCES.get("gpus", 8)
    exclusive = RESOURCES.get("exclusive")
    flags = []
    if exclusive or (exclusive is None and gpus > 0):
        flags.append("--exclusive")
    if RESOURCES.get("nodelist"):
        flags.append(f"--nodelist={RESOURCES['nodelist']}")
    if RESOURCES.get("signal_lead_s", 120):
        flags.append(f"--signal=TERM@{RESOURCES.get('signal_lead_s', 120)}")
    if RESOURCES.get("nodes", 1) > 1:
        flags.append("--ntasks-per-node=1")
    if RESOURCES.get("slurm_extra"):
        flags.append(RESOURCES["slurm_extra"])
    return " ".join(flags)


def final_outputs():
    """What `snakemake` builds by default: the summary, tables, plots and a bundle."""
    return [
        "reports/optimization_summary.md",
        "reports/summary.json",
        "reports/bundle.json",
        *expand("results/tables/{table}.csv", table=TABLES),
        *expand("reports/plots/{plot}.png", plot=PLOTS),
        *(["reports/adaptive_funnel.md"] if ADAPTIVE else []),
    ]
