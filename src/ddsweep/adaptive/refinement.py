"""The adaptive study's refinement: knob values between the grid's, screened around the screening's best points
(`sweep.refine`), and resolving a refinement point's id back to its knobs. See docs/adaptive.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ddsweep.config.knobs import effective_tree, evaluate
from ddsweep.config.plan import server_key
from ddsweep.config.points import ConfigError, Point, compile_constraint, expand_points, make_point


def _allowed(config: dict, point: Point) -> bool:
    """Whether a ddtree point passes the sweep's constraints."""
    constraints = [compile_constraint(c, f"sweep.constraints[{i}]")
                   for i, c in enumerate(config["sweep"].get("constraints", []))]
    return all(evaluate(code, point.knobs) for code in constraints)


def _server_key(config: dict, point: Point) -> tuple:
    """What makes the point's server configuration distinct (config/plan.py): equal keys are aliases."""
    tree = effective_tree(config["engine"]["presets"][point.preset], point.knobs, f"point {point.point_id}")
    return server_key(config, point, tree)


def _refine_moves(config: dict, known: dict[str, Point], point_id: str) -> Iterator[Point]:
    """Every point `sweep.refine` can reach from one grid point: each refined knob moved by ± its step, inside the
    grid's range for that knob, not a grid value, passing the constraints (aliases not yet removed)."""
    refine = config.get("sweep", {}).get("refine") or {}
    grid = config["sweep"].get("grid") or {}
    point = known.get(point_id)
    if point is None or point.kind != "ddtree" or point.preset != config["sweep"].get("preset", "ddtree"):
        return
    if any(getattr(point, k) not in grid.get(k, [None]) for k in ("budget", "topk", "block_size", "window")):
        return  # an explicit point outside the grid (sweep.points) is not refined
    for knob, step in refine.items():
        values = [v for v in grid.get(knob, []) if v is not None]
        if not values or getattr(point, knob) is None:
            continue
        for sign in (-1, 1):
            value = getattr(point, knob) + sign * step
            if not min(values) < value < max(values) or value in values:
                continue
            try:
                candidate = make_point(config, {"preset": point.preset, **point.knobs, knob: value},
                                        f"sweep.refine.{knob}")
            except ConfigError:
                continue
            if candidate.point_id not in known and _allowed(config, candidate):
                yield candidate


def refine_candidates(config: dict, survivors: Iterable[str]) -> list[Point]:
    """Points `sweep.refine` adds around the surviving grid points (not explicit `sweep.points`): each refined
    knob moved by ± its step, kept inside the grid's range for that knob, passing the constraints and not
    the same server configuration as a point in the sweep or an earlier candidate."""
    if not (config.get("sweep", {}).get("refine") and config["sweep"].get("grid")):
        return []
    known = {p.point_id: p for p in expand_points(config)}
    seen = {_server_key(config, p) for p in known.values()}
    added: dict[str, Point] = {}
    for pid in survivors:
        for candidate in _refine_moves(config, known, pid):
            key = _server_key(config, candidate)
            if key not in seen:
                added[candidate.point_id] = candidate
                seen.add(key)  # a candidate with the same server configuration as another is not added
    return list(added.values())


def resolve_point(config: dict, point_id: str) -> Point:
    """The point with this id: a configured one, or one that `sweep.refine` can reach from a configured one
    (which refinement points a selection adds depends on the points it refines around, so no alias is removed
    here)."""
    known = {p.point_id: p for p in expand_points(config)}
    if point_id in known:
        return known[point_id]
    for pid in known:
        for candidate in _refine_moves(config, known, pid):
            if candidate.point_id == point_id:
                return candidate
    raise ConfigError(f"no point {point_id!r} in this configuration or its refinement (sweep.refine); "
                      f"configured: {', '.join(known)}")
