rule run_point:
    input:
        preflight=lambda wildcards: f"results/preflight/{POINTS[wildcards.point].preset}.json",
    # done.json is written when the point completed or failed because of its configuration (a result of the
    # study); an infrastructure failure (the machine's: start-up timeout, OOM on a busy GPU, NCCL, an interruption
    # from outside) fails the job, which is retried, and on the last attempt is recorded as persisted: the
    # aggregates still run, and the next invocation drops that record and runs the point again (common.smk).
    output:
        done="results/points/{point}/done.json",
    log:
        "results/logs/points/{point}.log",
    # the reference point first (sweep.reference): the start of the study it is measured again at the end of
    priority: reference_priority("point")
    # Retries are resubmissions by the Snakemake on the submit host: inside a Slurm job (remote execution) a retry
    # would rerun the point in the same allocation, whose time is up.
    retries: 0 if workflow.remote_exec else RESOURCES["retries"]
    conda:
        "../../envs/server.yaml"
    # A real point job owns the machine's GPUs: locally, one point at a time. Stand-in points use no GPU.
    threads: 1 if STUDY["simulated"] else workflow.cores
    resources:
        **point_job_resources(),
    params:
        preset=lambda wildcards: POINTS[wildcards.point].preset,
        budget=knob("budget"),
        topk=knob("topk"),
        block_size=knob("block_size"),
        window=knob("window"),
        record=point_record_json,
        outdir=lambda wildcards: f"results/points/{wildcards.point}",
    shell:
        'ddsweep run-point --record {params.record:q} --operations-json "$DDSWEEP_OPERATIONS" --preflight {input.preflight} --out {params.outdir} --done {output.done} --attempt {resources.attempt} --attempts {resources.attempts} --time-limit-lead-s {resources.time_limit_lead_s} > {log} 2>&1 '
        "|| (tail -n 30 {log} >&2; exit 1)"
