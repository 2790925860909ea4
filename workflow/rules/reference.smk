# End-of-study reference runs of a grid study (sweep.reference; docs/statistics.md, "What the intervals do not
# include"). The start is the reference point's own job (run_point, scheduled first by priority). The end:
# 1. checkpoint reference_hosts, after every point: the hosts that ran completed points, from each point's
#    environment.json (results/reference/hosts.json);
# 2. reference_run: the reference configuration once per host, pinned to it (sbatch --nodelist), with the
#    configured benchmark on its primary workload and no coding eval (results/reference/end-<host>/).
# `ddsweep summarize` compares each end with the start in a caveat; the runs never enter the decisions.
# When any point reruns, the end moves: hosts.json is rewritten and every end-of-study run reruns.
from ddsweep.config.reference import reference_record


localrules:
    reference_hosts,


wildcard_constraints:
    host=r"[A-Za-z0-9][A-Za-z0-9._-]*",


checkpoint reference_hosts:
    input:
        points=point_done_files(),
    output:
        "results/reference/hosts.json",
    log:
        "results/logs/reference/hosts.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "ddsweep reference-hosts {input.points} --write {output} > {log} 2>&1"


rule reference_run:
    input:
        hosts="results/reference/hosts.json",
    output:
        done="results/reference/end-{host}/done.json",
    log:
        "results/logs/reference/end-{host}.log",
    # as run_point (points.smk): resubmitted by the submit host only after an interruption from outside
    retries: 0 if workflow.remote_exec else RESOURCES["retries"]
    conda:
        "../../envs/server.yaml"
    threads: 1 if STUDY["simulated"] else workflow.cores
    resources:
        # on the host it measures, instead of the study's resources.nodelist
        **point_job_resources(slurm_extra=lambda wildcards: slurm_extra_flags(nodelist=wildcards.host)),
    params:
        record=lambda wildcards: record_json(reference_record(STUDY, REFERENCE)),
        outdir=lambda wildcards: f"results/reference/end-{wildcards.host}",
    shell:
        'ddsweep run-point --record {params.record:q} --operations-json "$DDSWEEP_OPERATIONS" --out {params.outdir} --done {output.done} --attempt {resources.attempt} --attempts {resources.attempts} --time-limit-lead-s {resources.time_limit_lead_s} > {log} 2>&1 '
        "|| (tail -n 30 {log} >&2; exit 1)"
