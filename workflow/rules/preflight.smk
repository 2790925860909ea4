# Preflight: before any point job is submitted, check on the submit host that the model paths exist and that
# the installed server accepts every flag of every point's command (`ddsweep preflight`). One local job per
# preset: its params are exactly what all points of that preset share (engine, preset, target, drafter), so a
# change that reruns it reruns those points anyway, while adding or changing a point reruns neither the
# preflight nor the other points. Every run_point job needs the preflight result of its preset.
localrules:
    preflight,


rule preflight:
    input:
        # ancient(): the study file is rewritten whenever any point changes; only its existence matters here,
        # so adding or changing one point reruns neither the preflight of its preset nor, through it, the
        # other points of that preset. What the preset's points share is in params (a change reruns them).
        study=ancient("results/study_config.yaml"),
    output:
        "results/preflight/{preset}.json",
    log:
        "results/logs/preflight/{preset}.log",
    conda:
        "../../envs/server.yaml"
    params:
        definition=lambda wildcards: json.dumps(
            {
                "engine": {k: v for k, v in STUDY["engine"].items() if k != "presets"},
                "preset": STUDY["engine"]["presets"][wildcards.preset],
                "target": STUDY["target"],
                "drafter": STUDY["drafter"],
                "simulated": STUDY.get("simulated", False),
            },
            sort_keys=True,
        ),
    shell:
        "ddsweep preflight --config {input.study} --preset {wildcards.preset} "
        "--write {output} > {log} 2>&1 || (cat {log} >&2; exit 1)"
