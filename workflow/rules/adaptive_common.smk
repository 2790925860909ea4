# Functions of the adaptive study's rules (workflow/rules/adaptive.smk; docs/adaptive.md).
from pathlib import Path

from ddsweep.adaptive.refinement import resolve_point
from ddsweep.adaptive.stages import (
    confirm_launches,
    confirm_record,
    first_confirm_launch,
    running_baselines,
    screen_ids,
    screen_record,
    settle_launches,
)

LAUNCHES = confirm_launches(STUDY)
# a candidate's first confirmation launch: 1 where its screening stands for launch 0
FIRST = first_confirm_launch(STUDY)
SETTLE = settle_launches(STUDY)
# measured once, in their confirmation launch 0 (every repeat, the coding eval), which stands for their screening
BASELINES = running_baselines(STUDY)


def first_selection_files():
    """The inputs of the first selection: the candidates' screening markers and the baselines' one launch."""
    return expand("results/screen/{apoint}/done.json", apoint=screen_ids(STUDY)) + expand(
        "results/confirm/{apoint}/launch-0/done.json", apoint=BASELINES
    )


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


def selected_points():
    """The final selection's survivors (checkpoint screen_final): the baselines it keeps and the candidates that
    enter the confirmation."""
    return json.loads(Path(checkpoints.screen_final.get().output[0]).read_text())["survivors"]


def race_points(launch):
    """The points that run confirmation launch LAUNCH: the final selection's survivors for the candidates' first
    launch (FIRST; the baselines' launch 0 ran before the selection, and where the screening stands for launch 0 no
    candidate runs it), then the candidates the race kept after the previous launch (checkpoint confirm_race; the
    baselines run no later launch); for a settling launch (after the configured ones), the points the previous
    round left unsettled."""
    if launch < FIRST:
        return []  # a candidate's launch 0 is its screening
    if launch == FIRST:
        return [p for p in selected_points() if launch == 0 or p not in BASELINES]
    race = json.loads(Path(checkpoints.confirm_race.get(launch=str(launch - 1)).output[0]).read_text())
    if launch < LAUNCHES:
        return [p for p in race["survivors"] if p not in BASELINES]
    return race["settle"]


def confirmed_points():
    """The points that ran every confirmation launch, and the baselines (known once the last race checkpoint has
    run)."""
    kept = [p for p in selected_points() if p in BASELINES]
    return list(dict.fromkeys([*kept, *race_points(LAUNCHES - 1)]))


def confirmed_done_files(wildcards):
    """The merged confirmation markers of every confirmed point (the summary's inputs)."""
    return expand("results/points/{apoint}/done.json", apoint=confirmed_points())


def final_selection(wildcards):
    """The last selection record: with settling, the round after the last launch that ran; without, the race
    after the second-to-last launch, or the screening's selection (where it is the race's last round)."""
    if SETTLE:
        last = LAUNCHES - 1
        while last + 1 < LAUNCHES + SETTLE and race_points(last + 1):
            last += 1
        return checkpoints.confirm_race.get(launch=str(last)).output[0]
    if LAUNCHES - 2 >= FIRST:
        return f"results/confirm/race-{LAUNCHES - 2}.json"
    return "results/screen/selection.json"


def point_launch_files(wildcards):
    """A confirmed point's launch markers: the configured launches (a baseline's one; a candidate's screening where
    it stands for launch 0) and the settling launches it ran."""
    baseline = wildcards.apoint in BASELINES
    launches = [0] if baseline else list(range(FIRST, LAUNCHES))
    if SETTLE:
        final = json.loads(Path(final_selection(wildcards)).read_text())
        launches += final["extra_launches"].get(wildcards.apoint, [])
    screening = [] if baseline or not FIRST else [f"results/screen/{wildcards.apoint}/done.json"]
    return screening + expand("results/confirm/{apoint}/launch-{k}/done.json", apoint=wildcards.apoint, k=launches)


def race_launch_files(wildcards):
    """Launch k of every point still in the race (known once the selection before it has run)."""
    k = int(wildcards.launch)
    return expand("results/confirm/{apoint}/launch-{k}/done.json", apoint=race_points(k), k=k)


def race_previous(wildcards):
    """The selection that put the points in race k: the race before it, or the screening's selection. Its own
    input function, so that a dry run can name it before the checkpoints have run."""
    k = int(wildcards.launch)
    return f"results/confirm/race-{k - 1}.json" if k > FIRST else "results/screen/selection.json"
