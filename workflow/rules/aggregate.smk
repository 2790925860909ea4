localrules:
    study_config,
    plan,
    summarize,
    bundle,


rule study_config:
    output:
        "results/study_config.yaml",
    log:
        "results/logs/study_config.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        config=lambda wildcards: json.dumps(STUDY, sort_keys=True),
    shell:
        "ddsweep validate --config-json {params.config:q} --write {output} > {log} 2>&1"


# Every configured point with its effective tree and alias group (aliases do not run; analysis reads this).
rule plan:
    output:
        "results/plan.json",
    log:
        "results/logs/plan.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        config=lambda wildcards: json.dumps(
            {**STUDY, "sweep": {**STUDY["sweep"], "strategy": CONFIGURED_STRATEGY}},
            sort_keys=True,
        ),
        executor=lambda wildcards: "slurm" if on_slurm() else "local",
    shell:
        "ddsweep plan --config-json {params.config:q} --executor {params.executor} --write {output} > {log} 2>&1"


rule summarize:
    input:
        points=point_done_files(),
        config="results/study_config.yaml",
        plan="results/plan.json",
        # rewritten when this invocation reruns jobs whose machine failed them on every attempt (common.smk)
        reruns="results/reruns.json",
        # an adaptive study's funnel becomes a section of the summary
        funnel=["results/screen/funnel.json"] if ADAPTIVE else [],
        # end-of-study reference runs, when they run (workflow/rules/reference.smk)
        reference=[] if ADAPTIVE else reference_done_files,
        # the recommended points' full HumanEval, when it runs (workflow/rules/coding_full.smk)
        coding_full=coding_full_inputs,
    output:
        summary=report(
            "reports/optimization_summary.md",
            caption="../report/summary.rst",
            category="Summary",
        ),
        document="reports/summary.json",
        tables=expand("results/tables/{table}.csv", table=TABLES),
        plots=report(
            expand("reports/plots/{plot}.png", plot=PLOTS),
            caption="../report/plots.rst",
            category="Plots",
        ),
    log:
        "results/logs/summarize.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        coding_full="--coding-full results/coding_full/picks.json" if full_coding_on() else "",
    shell:
        "ddsweep summarize results --out reports --config {input.config} --points {input.points} "
        "--reference {input.reference} {params.coding_full} > {log} 2>&1"


rule bundle:
    input:
        summary="reports/optimization_summary.md",
        document="reports/summary.json",
        config="results/study_config.yaml",
    output:
        "reports/bundle.json",
    log:
        "results/logs/bundle.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        study=STUDY["study"],
    shell:
        "ddsweep bundle create --study {params.study} --results results --reports reports "
        "--config {input.config} --out reports/bundles --record {output} > {log} 2>&1"
