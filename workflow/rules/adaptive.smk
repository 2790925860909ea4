# Adaptive study (sweep.strategy: adaptive; docs/adaptive.md). Instead of running every point in full:
# 1. screen_point: every configured point but the baselines, briefly (the selected regimes' cells, few requests,
#    one launch, no coding eval), under results/screen/<id>/; each baseline runs once, its confirmation launch 0
#    with every repeat and the coding eval, which stands for its screening;
# 2. checkpoint screen_select: keep every point that could still be the best (results/screen/round1.json),
#    listing refinement points around the survivors (sweep.refine), which are then screened too;
# 3. checkpoint screen_final: select again among survivors and refinement points (results/screen/selection.json);
# 4. confirm_launch: each surviving candidate in the grid's launches (sweep.launches)
#    (results/confirm/<id>/launch-<k>/); after launch k of every point still in the race, checkpoint
#    confirm_race (results/confirm/race-<k>.json) drops the points that can no longer be the best, and launch
#    k+1 runs for the others, so launches interleave across points; the launches before the last measure the
#    regime cells the race compares, the last the whole matrix with every repeat and the coding eval;
#    after it, settling rounds (the same checkpoint) send each priority's leader and its unsettled rivals to
#    up to sweep.screen.settle_launches further launches of the regime cells;
#    confirm_merge joins a point's launches into results/points/<id>/, the layout `ddsweep summarize` reads;
#    funnel records the points and GPU time of each stage.
# Stage results live in their own directories: changing the analysis or the confirmation reruns no screening.
include: "adaptive_common.smk"


localrules:
    screen_select,
    screen_final,
    confirm_race,
    confirm_merge,
    funnel,


wildcard_constraints:
    apoint=r"[A-Za-z0-9_.-]+",
    launch="|".join(str(k) for k in range(LAUNCHES + SETTLE)),


rule screen_point:
    input:
        preflight=adaptive_preflight,
    output:
        done="results/screen/{apoint}/done.json",
    log:
        "results/logs/screen/{apoint}.log",
    # as run_point (points.smk): resubmitted by the submit host only after an interruption from outside
    retries: 0 if workflow.remote_exec else RESOURCES["retries"]
    conda:
        "../../envs/server.yaml"
    threads: 1 if STUDY["simulated"] else workflow.cores
    resources:
        **point_job_resources(),
    params:
        record=lambda wildcards: record_json(screen_record(STUDY, adaptive_point(wildcards))),
        outdir=lambda wildcards: f"results/screen/{wildcards.apoint}",
    shell:
        'ddsweep run-point --record {params.record:q} --operations-json "$DDSWEEP_OPERATIONS" --preflight {input.preflight} --out {params.outdir} --done {output.done} --attempt {resources.attempt} --attempts {resources.attempts} --time-limit-lead-s {resources.time_limit_lead_s} > {log} 2>&1 '
        "|| (tail -n 30 {log} >&2; exit 1)"


checkpoint screen_select:
    input:
        points=after_canaries(first_selection_files()),
        config="results/study_config.yaml",
    output:
        "results/screen/round1.json",
    log:
        "results/logs/screen/select_round1.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "ddsweep select --config {input.config} --screen results/screen --out {output} > {log} 2>&1"


checkpoint screen_final:
    input:
        round1="results/screen/round1.json",
        refined=refined_screen_files,
        config="results/study_config.yaml",
    output:
        "results/screen/selection.json",
    log:
        "results/logs/screen/select_final.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "ddsweep select --config {input.config} --screen results/screen --previous {input.round1} "
        "--out {output} > {log} 2>&1"


rule confirm_launch:
    input:
        preflight=adaptive_preflight,
    # No input on the race record: launch k+1 of a point is asked for only through race_points, that is once the
    # race after launch k has run (which needs launch k of every point in it), so launches interleave across
    # points; a rewritten race record (a changed analysis reruns the selections) reruns no launch, while a
    # launch's own changed settings rerun it (a params check that an ancient() input would skip).
    output:
        done="results/confirm/{apoint}/launch-{launch}/done.json",
    log:
        "results/logs/confirm/{apoint}-launch-{launch}.log",
    # as run_point (points.smk): resubmitted by the submit host only after an interruption from outside
    retries: 0 if workflow.remote_exec else RESOURCES["retries"]
    conda:
        "../../envs/server.yaml"
    threads: 1 if STUDY["simulated"] else workflow.cores
    resources:
        **point_job_resources(),
    params:
        record=lambda wildcards: record_json(confirm_record(STUDY, adaptive_point(wildcards), int(wildcards.launch))),
        outdir=lambda wildcards: f"results/confirm/{wildcards.apoint}/launch-{wildcards.launch}",
    shell:
        'ddsweep run-point --record {params.record:q} --operations-json "$DDSWEEP_OPERATIONS" --preflight {input.preflight} --out {params.outdir} --done {output.done} --attempt {resources.attempt} --attempts {resources.attempts} --time-limit-lead-s {resources.time_limit_lead_s} > {log} 2>&1 '
        "|| (tail -n 30 {log} >&2; exit 1)"


checkpoint confirm_race:
    input:
        launches=race_launch_files,
        previous=race_previous,
        config="results/study_config.yaml",
    output:
        "results/confirm/race-{launch}.json",
    log:
        "results/logs/confirm/race-{launch}.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "ddsweep select --config {input.config} --screen results/screen --confirm results/confirm "
        "--previous {input.previous} --launch {wildcards.launch} --out {output} > {log} 2>&1"


rule confirm_merge:
    input:
        point_launch_files,
    output:
        done="results/points/{apoint}/done.json",
    log:
        "results/logs/confirm/{apoint}-merge.log",
    conda:
        "../../envs/server.yaml"
    params:
        launches=lambda wildcards, input: [str(Path(f).parent) for f in input],
        outdir=lambda wildcards: f"results/points/{wildcards.apoint}",
    shell:
        "ddsweep merge-launches {params.launches:q} --out {params.outdir} --done {output.done} > {log} 2>&1"


rule funnel:
    input:
        selection=final_selection,
        points=confirmed_done_files,
        config="results/study_config.yaml",
    output:
        funnel="results/screen/funnel.json",
        markdown="reports/adaptive_funnel.md",
    log:
        "results/logs/funnel.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "ddsweep funnel --config {input.config} --selection {input.selection} --screen results/screen "
        "--confirm results/confirm --out {output.funnel} --markdown {output.markdown} > {log} 2>&1"
