# Functions of the adaptive study's rules (workflow/rules/adaptive.smk; docs/adaptive.md).
from pathlib import Path

from ddsweep.config.stages import confirm_launches, confirm_record, resolve_point, screen_record

LAUNCHES = confirm_launches(STUDY)


def adaptive_point(wildcards):
    """The point of the wildcard: configured, or a refinement point (sweep.refine)."""
    return resolve_point(STUDY, wildcards.apoint)


def adaptive_preflight(wildcards):
    """The preflight result of the point's preset."""
    return f"results/preflight/{adaptive_point(wildcards).preset}.json"


def refined_screen_files(wildcards):
    """Screening markers of the refinement points listed by the first selection round."""
    round1 = json.loads(Path(checkpoints.screen_select.get().output[0]).read_text())
    return expand("results/screen/{apoint}/done.json", apoint=round1["refine"])


def race_points(launch):
    """The points that run confirmation launch LAUNCH: the final selection's survivors for launch 0, then the
    survivors of the race after the previous launch (checkpoint confirm_race)."""
    if launch == 0:
        return json.loads(Path(checkpoints.screen_final.get().output[0]).read_text())["survivors"]
    race = checkpoints.confirm_race.get(launch=str(launch - 1)).output[0]
    return json.loads(Path(race).read_text())["survivors"]


def confirmed_points():
    """The points that ran every confirmation launch (known once the last race checkpoint has run)."""
    return race_points(LAUNCHES - 1)


def confirmed_done_files(wildcards):
    """The merged confirmation markers of every confirmed point (the summary's inputs)."""
    return expand("results/points/{apoint}/done.json", apoint=confirmed_points())


def final_selection(wildcards):
    """The last selection record: the race after the second-to-last launch, or the screening's selection."""
    if LAUNCHES > 1:
        return f"results/confirm/race-{LAUNCHES - 2}.json"
    return "results/screen/selection.json"


def race_inputs(wildcards):
    """Launch k of every point still in the race, and the selection that put them there."""
    k = int(wildcards.launch)
    return {
        "launches": expand(
            "results/confirm/{apoint}/launch-{k}/done.json",
            apoint=race_points(k),
            k=k,
        ),
        "previous": (f"results/confirm/race-{k - 1}.json" if k > 0 else "results/screen/selection.json"),
    }
