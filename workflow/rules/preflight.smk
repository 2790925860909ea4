# Preflight: before any point job is submitted, check on the submit host that the model paths exist and that
# the installed server accepts every flag of every point's command (`ddsweep preflight`). One local job per
# preset: its params are exactly what all points of that preset share (engine, preset, target, drafter), so a
# change that reruns it reruns those points anyway, while adding or changing a point reruns neither the
# preflight nor the other points. Every run_point job needs the preflight result of its preset. The preflights
# of one invocation share one question to the server's parser (every preset's commands) and one tokenizer load
# (`--shared`: results/preflight/.shared, answers kept for 10 minutes).
import os

from ddsweep.config.knobs import server_preset


localrules:
    preflight,


# The whole study reaches the command through the environment, not params: as a param, adding or changing one
# point would rerun the preflight of its preset and, through it, every point of that preset. Nor as a file
# input: results/study_config.yaml changes with every point, and as an ancient() input its rerun makes
# Snakemake 9 skip the params check of every job downstream of the preflight (a changed point would not rerun).
os.environ["DDSWEEP_PREFLIGHT_STUDY"] = json.dumps(STUDY, sort_keys=True)


envvars:
    "DDSWEEP_PREFLIGHT_STUDY",


rule preflight:
    output:
        "results/preflight/{preset}.json",
    log:
        "results/logs/preflight/{preset}.log",
    priority: reference_priority("preset")
    conda:
        "../../envs/server.yaml"
    params:
        definition=lambda wildcards: json.dumps(
            {
                "engine": engine_definition(),
                "preset": server_preset(STUDY["engine"]["presets"][wildcards.preset]),
                "target": STUDY["target"],
                "drafter": STUDY["drafter"],
                "simulated": STUDY["simulated"],
            },
            sort_keys=True,
        ),
    shell:
        'ddsweep preflight --config-json "$DDSWEEP_PREFLIGHT_STUDY" --preset {wildcards.preset} '
        "--shared results/preflight/.shared --write {output} > {log} 2>&1 || (cat {log} >&2; exit 1)"
