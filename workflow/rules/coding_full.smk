# The full HumanEval on the recommended points (coding_eval.full_on_picks; ddsweep.findings.full_coding):
# 1. checkpoint coding_picks, after every point: the points the summary recommends, as it decides them
#    (results/coding_full/picks.json);
# 2. coding_full: each recommended point that has not answered every problem already is launched once more with
#    every problem and no benchmark (results/coding_full/<point>/).
# The summary reports them in a section; the picks are not decided again on the full answers.
from ddsweep.adaptive.refinement import resolve_point
from ddsweep.config.records import coding_full_record


localrules:
    coding_picks,


# A pick is any point that ran, a refinement point of an adaptive study included.
wildcard_constraints:
    pick=r"[A-Za-z0-9_.-]+",


checkpoint coding_picks:
    input:
        points=point_done_files(),
        config="results/study_config.yaml",
        plan="results/plan.json",
    output:
        "results/coding_full/picks.json",
    log:
        "results/logs/coding_full/picks.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "ddsweep picks results --config {input.config} --points {input.points} --write {output} > {log} 2>&1"


rule coding_full:
    input:
        preflight=lambda wildcards: f"results/preflight/{resolve_point(STUDY, wildcards.pick).preset}.json",
    output:
        done="results/coding_full/{pick}/done.json",
    log:
        "results/logs/coding_full/{pick}.log",
    # as run_point (points.smk): resubmitted by the submit host only after an interruption from outside
    retries: 0 if workflow.remote_exec else RESOURCES["retries"]
    conda:
        "../../envs/server.yaml"
    threads: 1 if STUDY["simulated"] else workflow.cores
    resources:
        **point_job_resources(),
    params:
        record=lambda wildcards: record_json(coding_full_record(STUDY, resolve_point(STUDY, wildcards.pick))),
        outdir=lambda wildcards: f"results/coding_full/{wildcards.pick}",
    shell:
        'ddsweep run-point --record {params.record:q} --operations-json "$DDSWEEP_OPERATIONS" --preflight {input.preflight} --out {params.outdir} --done {output.done} --attempt {resources.attempt} --attempts {resources.attempts} --time-limit-lead-s {resources.time_limit_lead_s} > {log} 2>&1 '
        "|| (tail -n 30 {log} >&2; exit 1)"
