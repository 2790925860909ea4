# The study store (`store`, config/README.md): each finished job's directory is copied there as soon as it ends,
# and the reports once written, through Snakemake's storage plugins (ddsweep.store; `ddsweep store push`). The
# manifest written last, <unit>/stored.json, is the local marker of a unit that is in the store. A preflight job
# copies its own result before it ends (ddsweep.point.preflight.store_result), so every point finds it there.


wildcard_constraints:
    unit=r"results/(points/[^/]+|launches/[^/]+/launch-\d+)|reports",


if STORE:

    localrules:
        store_unit,

    rule store_unit:
        input:
            stored_unit_inputs,
        output:
            "{unit}/stored.json",
        log:
            "results/logs/store/{unit}.log",
        # as soon as its job ends: before the next point starts
        priority: 100
        conda:
            "../../envs/analysis.yaml"
        params:
            store=STORE,
        shell:
            "ddsweep store push --store {params.store:q} --unit {wildcards.unit} --write {output} > {log} 2>&1 "
            "|| (cat {log} >&2; exit 1)"
