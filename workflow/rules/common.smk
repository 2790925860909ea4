import json

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

PLOTS = [
    "throughput_vs_concurrency",
    "decode_speed_by_point",
    "acceptance_vs_budget",
    "heatmap_latency",
    "heatmap_throughput",
    "pareto",
    "coding",
]
TABLES = ["points", "bench_cells", "bench_groups", "coding", "overview"]


wildcard_constraints:
    point="|".join(POINTS) or "(?!)",


def point_status_files():
    """The completion marker of every point in this configuration; in an adaptive study an input function
    giving the confirmed points' markers (known after the selection checkpoint, workflow/rules/adaptive.smk)."""
    if ADAPTIVE:
        return confirmed_status_files
    return expand("results/points/{point}/status.json", point=list(POINTS))


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
