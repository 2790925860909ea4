# ddsweep: sweep DDTree speculative-decoding configurations of an SGLang server.
# Each sweep point is one GPU job (server, knob verification, benchmark, coding eval); the final rules
# aggregate every point into tables, plots, the optimization summary and a report bundle.
# Configuration: config/config.yaml (documented in config/README.md); demo: --configfile .test/config.yaml


from snakemake.utils import min_version

from ddsweep.budget import resume_message

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/canary.smk"


# sweep.strategy: grid runs every point in full; adaptive screens, selects and confirms (workflow/rules/adaptive.smk).
if ADAPTIVE:

    include: "workflow/rules/adaptive.smk"

else:

    include: "workflow/rules/points.smk"
    include: "workflow/rules/launches.smk"
    include: "workflow/rules/reference.smk"


include: "workflow/rules/coding_full.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/store.smk"


rule all:
    default_target: True
    input:
        final_outputs(),


# The last line says what the study measured: a study with failed points still ends with its summary and exit
# code 0, as with --keep-going (failed points are results, or run again by the next invocation).
onsuccess:
    print(
        "\nddsweep: optimization summary in reports/optimization_summary.md; "
        "tables in results/tables/, plots in reports/plots/, bundles in reports/bundles/."
    )
    resume = resume_message(Path("results"), STUDY["reproduce_command"])
    if resume:
        print(resume)
    print(f"ddsweep: {study_outcome()}")


onerror:
    print(f"ddsweep: the workflow stopped with an error; {study_outcome()}")
