# The canary start (ddsweep.config.families, ddsweep.point.canary): before the other points of a study start, one
# point of each engine build runs first, its canary (the `ar` baseline, else the build's cheapest point; its first
# launch, or its screening in an adaptive study). Checkpoint canaries then reads their records: where a canary failed
# at start-up on the machine (after its own retries), it records the build's other first-stage jobs as not started
# (persisted: the next invocation runs them again, with the canary) and none of their servers starts. A canary that
# failed because of its configuration stops nothing. The other points wait for it through after_canaries
# (common.smk), not through an input of theirs: adding a point, or a canary that runs again, reruns no other point.


localrules:
    canaries,


checkpoint canaries:
    input:
        canary_files(),
    output:
        "results/canary.json",
    log:
        "results/logs/canary.log",
    conda:
        "../../envs/server.yaml"
    # the whole study through the environment, as the preflight gets it (preflight.smk)
    shell:
        'ddsweep canary --config-json "$DDSWEEP_PREFLIGHT_STUDY" --results results --write {output} > {log} 2>&1'
