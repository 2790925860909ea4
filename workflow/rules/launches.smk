# A grid study's launches (sweep.launches, default 2): each point's repeats are split across server launches,
# each its own job (results/launches/<id>/launch-<k>/), launch k of every point preferred over launch k+1 of
# any (a priority, not a barrier), so a point's launches are interleaved with other points'; the coding eval
# runs in the last launch. merge_point_launches joins them into results/points/<id>/ (ddsweep merge-launches),
# which takes the place of run_point (points.smk) when there is more than one launch.
from pathlib import Path

from ddsweep.config.launches import launch_record


wildcard_constraints:
    launch=r"\d+",


if LAUNCHES > 1:

    ruleorder: merge_point_launches > run_point

    localrules:
        merge_point_launches,

    rule launch_point:
        input:
            preflight=lambda wildcards: f"results/preflight/{POINTS[wildcards.point].preset}.json",
        output:
            done="results/launches/{point}/launch-{launch}/done.json",
        log:
            "results/logs/launches/{point}-launch-{launch}.log",
        priority: launch_priority
        # as run_point (points.smk): resubmitted by the submit host only after an interruption from outside
        retries: 0 if workflow.remote_exec else RESOURCES["retries"]
        conda:
            "../../envs/server.yaml"
        threads: 1 if STUDY["simulated"] else workflow.cores
        resources:
            **point_job_resources(),
        params:
            preset=lambda wildcards: POINTS[wildcards.point].preset,
            budget=knob("budget"),
            topk=knob("topk"),
            block_size=knob("block_size"),
            window=knob("window"),
            record=lambda wildcards: record_json(launch_record(STUDY, POINTS[wildcards.point], int(wildcards.launch))),
            outdir=lambda wildcards: f"results/launches/{wildcards.point}/launch-{wildcards.launch}",
        shell:
            'ddsweep run-point --record {params.record:q} --operations-json "$DDSWEEP_OPERATIONS" --preflight {input.preflight} --out {params.outdir} --done {output.done} --attempt {resources.attempt} --attempts {resources.attempts} --time-limit-lead-s {resources.time_limit_lead_s} > {log} 2>&1 '
            "|| (tail -n 30 {log} >&2; exit 1)"

    rule merge_point_launches:
        input:
            lambda wildcards: expand(
                "results/launches/{point}/launch-{launch}/done.json",
                point=wildcards.point,
                launch=range(LAUNCHES),
            ),
        output:
            done="results/points/{point}/done.json",
        log:
            "results/logs/launches/{point}-merge.log",
        conda:
            "../../envs/server.yaml"
        params:
            launches=lambda wildcards, input: [str(Path(f).parent) for f in input],
            outdir=lambda wildcards: f"results/points/{wildcards.point}",
        shell:
            "ddsweep merge-launches {params.launches:q} --out {params.outdir} --done {output.done} > {log} 2>&1"
