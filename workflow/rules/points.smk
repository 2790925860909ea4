rule run_point:
    input:
        preflight=lambda wildcards: f"results/preflight/{POINTS[wildcards.point].preset}.json",
    output:
        status="results/points/{point}/status.json",
    log:
        "results/logs/points/{point}.log",
    conda:
        "../../envs/server.yaml"
    params:
        preset=lambda wildcards: POINTS[wildcards.point].preset,
        budget=knob("budget"),
        topk=knob("topk"),
        block_size=knob("block_size"),
        window=knob("window"),
        record=point_record_json,
        outdir=lambda wildcards: f"results/points/{wildcards.point}",
    # A real point job owns the machine's GPUs: locally, one point at a time. Stand-in points use no GPU.
    threads: 1 if STUDY["simulated"] else workflow.cores
    resources:
        gres=slurm_gpu_request(),
        slurm_partition=RESOURCES.get("partition") or "",
        runtime=RESOURCES["runtime_min"],
        cpus_per_task=RESOURCES["cpus_per_task"],
        mem_mb=RESOURCES["mem_mb"],
        slurm_extra=RESOURCES.get("slurm_extra") or "",
    shell:
        "ddsweep run-point --record {params.record:q} --out {params.outdir} > {log} 2>&1 "
        "|| (tail -n 30 {log} >&2; exit 1)"
