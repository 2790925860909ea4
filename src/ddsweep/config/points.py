"""Sweep points: the Point record, constraints, and the expansion of baselines, grid and explicit points.

The plan (config/plan.py) and the validation (config/study.py) build on this module.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddsweep.config.knobs import BY_NAME, KIND_KNOBS, KNOBS, ExpressionError, compile_expression, evaluate


class ConfigError(ValueError):
    """A study configuration that breaks a rule; the message names the key and the rule."""


@dataclass(frozen=True)
class Point:
    """One sweep point: a preset and the knob values it is started with."""

    preset: str
    kind: str
    budget: int | None = None
    topk: int | None = None
    block_size: int | None = None
    window: int | None = None

    @property
    def knobs(self) -> dict[str, int | None]:
        """The four knobs, None where they do not apply."""
        return {k: getattr(self, k) for k in KNOBS}

    @property
    def point_id(self) -> str:
        """A stable, readable id such as `bs8-b8-t4-w2048`, `dflash-bs8` or `ar`."""
        window = "off" if self.window is None else str(self.window)
        if self.kind == "ddtree":
            body = f"bs{self.block_size}-b{self.budget}-t{self.topk}-w{window}"
            return body if self.preset == "ddtree" else f"{self.preset}-{body}"
        if self.kind == "dflash":
            body = f"bs{self.block_size}" + ("" if self.window is None else f"-w{self.window}")
            return f"{self.preset}-{body}"
        return self.preset


def compile_constraint(expression: str, where: str) -> Any:
    """Parse a constraint into a code object, allowing only comparisons and arithmetic over the knobs."""
    try:
        return compile_expression(expression, where)
    except ExpressionError as exc:
        raise ConfigError(str(exc)) from exc


def make_point(config: dict, spec: Mapping[str, Any], where: str, preset_key: str | None = None) -> Point:
    """Build a Point from a mapping of preset and knobs, checking the knobs fit the preset's kind; `preset_key`
    names the key the preset came from when it is not `where`'s own `preset`."""
    preset_name = spec["preset"]
    presets = config["engine"]["presets"]
    if preset_name not in presets:
        raise ConfigError(f"{preset_key or where + '.preset'}: unknown preset {preset_name!r}; "
                          f"defined in engine.presets: {', '.join(presets)}")
    kind = presets[preset_name]["kind"]
    used = KIND_KNOBS[kind]
    values = {k: spec.get(k) for k in KNOBS}
    for knob in KNOBS:
        if knob not in used and values[knob] is not None:
            raise ConfigError(f"{where}.{knob}: a point of kind {kind} has no {knob} (preset {preset_name!r})")
    for knob in used:
        if not BY_NAME[knob].optional and values[knob] is None:
            raise ConfigError(f"{where}.{knob}: a point of kind {kind} needs {knob}")
        value = values[knob]
        if value is not None and (isinstance(value, bool) or not isinstance(value, BY_NAME[knob].type) or value < 1):
            raise ConfigError(f"{where}.{knob}: must be a positive integer, got {value!r}")
    if values["window"] is not None and values["block_size"] is not None and values["window"] < values["block_size"]:
        raise ConfigError(f"{where}.window: window {values['window']} is smaller than block_size "
                          f"{values['block_size']}; the drafter's sliding window must hold a whole block "
                          "(window >= block_size)")
    return Point(preset=preset_name, kind=kind, **values)


def grid_combinations(sweep: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The knob values of every combination of `sweep.grid` that the constraints keep, in grid order."""
    grid = sweep.get("grid")
    if not grid:
        return []
    constraints = [compile_constraint(c, f"sweep.constraints[{i}]") for i, c in enumerate(sweep["constraints"])]
    combinations = (dict(zip(KNOBS, values, strict=True))
                    for values in itertools.product(grid["budget"], grid["topk"], grid["block_size"], grid["window"]))
    return [knobs for knobs in combinations if all(evaluate(code, knobs) for code in constraints)]


def expand_points(config: dict) -> list[Point]:
    """Expand baselines, the grid (filtered by constraints) and explicit points, in that order."""
    points: list[tuple[Point, str]] = []
    baselines = config["baselines"]
    if baselines["ar"]:
        ar = make_point(config, {"preset": baselines["ar_preset"]}, "baselines.ar", "baselines.ar_preset")
        points.append((ar, "baselines.ar"))
    dflash = baselines.get("dflash")
    if dflash:
        presets = [dflash["preset"], *([dflash["no_overlap_preset"]] if dflash.get("no_overlap_preset") else [])]
        for preset, bs, window in itertools.product(presets, dflash["block_size"], dflash["window"]):
            where = "baselines.dflash" + (".no_overlap_preset" if preset != dflash["preset"] else "")
            spec = {"preset": preset, "block_size": bs, "window": window}
            points.append((make_point(config, spec, where, where if preset != dflash["preset"] else None), where))
    sweep = config["sweep"]
    for knobs in grid_combinations(sweep):
        spec = {"preset": sweep["preset"], **knobs}
        points.append((make_point(config, spec, "sweep.grid", "sweep.preset"), "sweep.grid"))
    for i, spec in enumerate(sweep["points"]):
        points.append((make_point(config, spec, f"sweep.points[{i}]"), f"sweep.points[{i}]"))
    seen: dict[str, str] = {}
    for point, where in points:
        if point.point_id in seen:
            raise ConfigError(f"{where}: duplicate point {point.point_id!r} (already defined by "
                              f"{seen[point.point_id]}); each point must appear once")
        seen[point.point_id] = where
    return [point for point, _ in points]
