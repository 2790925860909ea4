"""Engine-build families and their canaries.

A broken set-up (a package that does not load, a wrong CUDA, a missing kernel) fails every server start of a build
the same way. So before the other points of a study start, one point of each family is started first, its canary:
the `ar` baseline where the family has it, else the family's cheapest point (smallest verify width, then block
size, then the order of expansion). A family is the presets written for one engine build (a library preset's
`build`); a study's own preset without one is a family of its own. What the canary's outcome decides is
ddsweep.point.canary's; the workflow's gate is workflow/rules/canary.smk."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddsweep.config.launches import grid_launches
from ddsweep.config.plan import PlannedPoint, plan_points
from ddsweep.config.points import expand_points


@dataclass(frozen=True)
class Family:
    """The running points of one engine build, its canary first."""

    name: str
    canary: str
    members: tuple[str, ...]

    @property
    def others(self) -> tuple[str, ...]:
        """The points that start only after the canary."""
        return tuple(p for p in self.members if p != self.canary)


def family_name(preset_name: str, preset: dict[str, Any]) -> str:
    """The family of a preset: its engine build, else the preset's own name."""
    return str(preset.get("build") or preset_name)


def _cost(planned: PlannedPoint, index: int) -> tuple:
    """The canary's order: `ar` first, then the smallest verify width, block size, expansion order."""
    point = planned.point
    return (point.kind != "ar", planned.tree.verify_width or 0, point.block_size or 0, index)


def families(config: dict) -> list[Family]:
    """Every family of the study's running points (representatives of alias groups, unless sweep.run_aliases),
    in the order of their first point."""
    presets = config["engine"]["presets"]
    grouped: dict[str, list[tuple[PlannedPoint, int]]] = {}
    for index, planned in enumerate(p for p in plan_points(config) if p.runs):
        name = family_name(planned.point.preset, presets[planned.point.preset])
        grouped.setdefault(name, []).append((planned, index))
    out = []
    for name, members in grouped.items():
        canary = min(members, key=lambda m: _cost(*m))[0].point.point_id
        ids = [m[0].point.point_id for m in members]
        out.append(Family(name, canary, (canary, *(p for p in ids if p != canary))))
    return out


def first_stage(config: dict) -> str:
    """Where the study's first server launches write their records under results/: `screen` (an adaptive study's
    screening), `launches` (a grid study of several launches per point) or `points`."""
    if config["sweep"]["strategy"] == "adaptive":
        return "screen"
    return "launches" if grid_launches(config) > 1 else "points"


def job_dirs(config: dict, results_dir: Path, point_id: str) -> list[Path]:
    """The directories of a point's first-stage jobs, the one its canary run uses first (an adaptive study's
    baseline is not screened: its one confirmation launch is its first job)."""
    stage = first_stage(config)
    if stage == "screen" and any(p.point_id == point_id and p.kind in ("ar", "dflash") for p in expand_points(config)):
        return [results_dir / "confirm" / point_id / "launch-0"]
    if stage == "launches":
        return [results_dir / "launches" / point_id / f"launch-{k}" for k in range(grid_launches(config))]
    return [results_dir / stage / point_id]


def canary_records(config: dict, results_dir: Path) -> list[Path]:
    """The first-stage record (done.json) of each family's canary."""
    return [job_dirs(config, results_dir, family.canary)[0] / "done.json" for family in families(config)]


def canaries_line(config: dict) -> str:
    """The plan's line naming each build's canary, e.g. `started first, one per engine build: ar (sglang), ...`."""
    return ("started first, one per engine build (the build's other points wait for it; workflow/rules/canary.smk): "
            + ", ".join(f"{f.canary} ({f.name}, before {len(f.others)} other point(s))" for f in families(config)))
