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


def confirmed_points():
    """The points the final selection keeps (known once the screen_final checkpoint has run)."""
    return json.loads(Path(checkpoints.screen_final.get().output[0]).read_text())["survivors"]


def confirmed_done_files(wildcards):
    """The merged confirmation markers of every confirmed point (the summary's inputs)."""
    return expand("results/points/{apoint}/done.json", apoint=confirmed_points())


def previous_launch_round(wildcards):
    """Launch k of a point waits for launch k-1 of every confirmed point (ancient: existence only)."""
    k = int(wildcards.launch)
    if k == 0:
        return []
    return ancient(
        expand(
            "results/confirm/{apoint}/launch-{k}/done.json",
            apoint=confirmed_points(),
            k=k - 1,
        )
    )
