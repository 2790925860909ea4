"""Study configuration: loading, schema and semantic validation, sweep expansion and `ddsweep plan`."""

from __future__ import annotations

import argparse
import ast
import copy
import itertools
import json
import string
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ddsweep.storage import write_text_atomic

KNOBS = ("budget", "topk", "block_size", "window")
# Knobs each kind of point uses; the others are None for that kind.
KIND_KNOBS = {"ddtree": KNOBS, "dflash": ("block_size", "window"), "ar": ()}
# Placeholders a command template, environment value or verify value may use besides the knobs.
SERVER_PLACEHOLDERS = ("model_path", "served_model_name", "drafter_path", "host", "port", "python")
CODING_PROBLEMS = 164
DEMO_HINT = "to try the pipeline without a GPU, run the demo: snakemake --cores all --configfile .test/config.yaml"


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


def schema_path() -> Path:
    """The JSON schema the configuration is validated against (also linked from workflow/schemas/)."""
    return Path(str(resources.files("ddsweep.config") / "schemas" / "config.schema.yaml"))


def _key_path(parts: Any) -> str:
    """Render a jsonschema path such as ['engine', 'presets', 'ar'] as `engine.presets.ar`."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


class _DefaultFillingValidator:
    """A Draft 2020-12 validator that also fills in schema defaults, like snakemake.utils.validate."""

    def __init__(self, schema: dict) -> None:
        base = jsonschema.Draft202012Validator

        def set_defaults(validator, properties, instance, schema):  # noqa: ANN001
            if isinstance(instance, dict):
                for name, sub in properties.items():
                    if isinstance(sub, dict) and "default" in sub and name not in instance:
                        instance[name] = copy.deepcopy(sub["default"])
            yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

        cls = jsonschema.validators.extend(base, {"properties": set_defaults})
        self.validator = cls(schema)

    def errors(self, instance: dict) -> list[jsonschema.ValidationError]:
        """All schema violations, sorted so the first names the outermost key."""
        return sorted(self.validator.iter_errors(instance), key=lambda e: (len(e.path), list(map(str, e.path))))


def validate_config(raw: Mapping[str, Any]) -> dict:
    """Validate a configuration against the schema and the semantic rules; returns it with defaults filled."""
    if not isinstance(raw, Mapping):
        raise ConfigError("the configuration must be a mapping of keys to values")
    config = copy.deepcopy(dict(raw))
    schema = yaml.safe_load(schema_path().read_text())
    errors = _DefaultFillingValidator(schema).errors(config)
    if errors:
        lines = [f"{_key_path(e.absolute_path)}: {_describe_schema_error(e)}" for e in errors[:10]]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    _check_presets(config)
    _check_constraints(config)
    points = expand_points(config)
    _check_analysis(config)
    _check_resources(config)
    _check_coding(config)
    if not points:
        raise ConfigError("sweep: the sweep expands to no points (empty grid, constraints remove every point, "
                          "and no baselines); nothing would run")
    return config


def _describe_schema_error(error: jsonschema.ValidationError) -> str:
    """Turn a jsonschema error into a sentence that says which rule was broken."""
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"unknown key(s) {', '.join(map(repr, extra))}{hint}"
    if error.validator == "required":
        return f"missing required key: {error.message.split(' ')[0]}"
    return error.message


def load_config(*paths: str | Path, overrides: Mapping[str, Any] | None = None) -> dict:
    """Read one or more YAML files (later ones update earlier ones, as Snakemake does) and validate."""
    merged: dict = {}
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError as exc:
            raise ConfigError(f"configuration file not found: {path}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the configuration must be a mapping of keys to values")
        merge_config(merged, data)
    if overrides:
        merge_config(merged, dict(overrides))
    return validate_config(merged)


def merge_config(base: dict, update: Mapping[str, Any]) -> dict:
    """Recursively update nested mappings in place (Snakemake's rule for several config files)."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge_config(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _placeholders(template: str) -> list[str]:
    """Names used as `{name}` in a template string."""
    return [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]


def _check_presets(config: dict) -> None:
    """Every template placeholder must be known and apply to the preset's kind."""
    for name, preset in config["engine"]["presets"].items():
        kind = preset["kind"]
        allowed = set(SERVER_PLACEHOLDERS) | set(KIND_KNOBS[kind])
        templates: list[tuple[str, Any]] = [(f"args[{i}]", a) for i, a in enumerate(preset["args"])]
        for knob, extra in preset.get("args_if_set", {}).items():
            if knob not in KIND_KNOBS[kind]:
                raise ConfigError(f"engine.presets.{name}.args_if_set.{knob}: knob {knob!r} does not apply "
                                  f"to a {kind} preset (its knobs: {', '.join(KIND_KNOBS[kind]) or 'none'})")
            templates += [(f"args_if_set.{knob}[{i}]", a) for i, a in enumerate(extra)]
        templates += [(f"env.{k}", v) for k, v in preset.get("env", {}).items()]
        verify = preset.get("verify", {})
        templates += [(f"verify.server_args.{k}", v) for k, v in verify.get("server_args", {}).items()]
        templates += [(f"verify.log_patterns[{i}]", p) for i, p in enumerate(verify.get("log_patterns", []))]
        for where, template in templates:
            if not isinstance(template, str):
                continue
            try:
                fields = _placeholders(template)
            except ValueError as exc:
                raise ConfigError(f"engine.presets.{name}.{where}: malformed template {template!r}: {exc}") from exc
            for field in fields:
                if field not in allowed:
                    raise ConfigError(
                        f"engine.presets.{name}.{where}: unknown placeholder {{{field}}} in {template!r}; "
                        f"a {kind} preset may use {', '.join('{' + a + '}' for a in sorted(allowed))}")
        port_used = any("{port}" in a for a in preset["args"])
        if not port_used:
            raise ConfigError(f"engine.presets.{name}.args: the command must pass the port with {{port}}, "
                              "so that every job listens on a port of its own")
    for i, part in enumerate(config["engine"]["launcher"]):
        for field in _placeholders(part):
            if field != "python":
                raise ConfigError(f"engine.launcher[{i}]: unknown placeholder {{{field}}}; only {{python}} "
                                  "(the interpreter running ddsweep) is allowed here")


_ALLOWED_NODES = (ast.Expression, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Name, ast.Load,
                  ast.Constant, ast.And, ast.Or, ast.Not, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
                  ast.Is, ast.IsNot, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.USub,
                  ast.In, ast.NotIn, ast.Tuple, ast.List)


def _compile_constraint(expression: str, where: str) -> Any:
    """Parse a constraint into a code object, allowing only comparisons and arithmetic over the knobs."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"{where}: not a valid expression: {expression!r} ({exc.msg})") from exc
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ConfigError(f"{where}: {type(node).__name__} is not allowed in {expression!r}; use comparisons "
                              "and arithmetic over budget, topk, block_size, window")
        if isinstance(node, ast.Name) and node.id not in KNOBS:
            raise ConfigError(f"{where}: unknown name {node.id!r} in {expression!r}; "
                              f"known: {', '.join(KNOBS)}, None")
    return compile(tree, where, "eval")


def _check_constraints(config: dict) -> None:
    """Constraints must parse (checked before expansion, so the error names the constraint)."""
    for i, expression in enumerate(config["sweep"].get("constraints", [])):
        _compile_constraint(expression, f"sweep.constraints[{i}]")


def _make_point(config: dict, spec: Mapping[str, Any], where: str) -> Point:
    """Build a Point from a mapping of preset and knobs, checking the knobs fit the preset's kind."""
    preset_name = spec["preset"]
    presets = config["engine"]["presets"]
    if preset_name not in presets:
        raise ConfigError(f"{where}.preset: unknown preset {preset_name!r}; "
                          f"defined in engine.presets: {', '.join(presets)}")
    kind = presets[preset_name]["kind"]
    used = KIND_KNOBS[kind]
    values = {k: spec.get(k) for k in KNOBS}
    for knob in KNOBS:
        if knob not in used and values[knob] is not None:
            raise ConfigError(f"{where}.{knob}: a point of kind {kind} has no {knob} (preset {preset_name!r})")
    for knob in used:
        if knob != "window" and values[knob] is None:
            raise ConfigError(f"{where}.{knob}: a point of kind {kind} needs {knob}")
        if values[knob] is not None and (not isinstance(values[knob], int) or values[knob] < 1):
            raise ConfigError(f"{where}.{knob}: must be a positive integer, got {values[knob]!r}")
    if values["window"] is not None and values["block_size"] is not None and values["window"] < values["block_size"]:
        raise ConfigError(f"{where}.window: window {values['window']} is smaller than block_size "
                          f"{values['block_size']}; the drafter's sliding window must hold a whole block "
                          "(window >= block_size)")
    return Point(preset=preset_name, kind=kind, **values)


def expand_points(config: dict) -> list[Point]:
    """Expand baselines, the grid (filtered by constraints) and explicit points, in that order."""
    points: list[tuple[Point, str]] = []
    baselines = config.get("baselines", {})
    if baselines.get("ar", True):
        points.append((_make_point(config, {"preset": baselines.get("ar_preset", "ar")}, "baselines.ar"),
                       "baselines.ar"))
    dflash = baselines.get("dflash")
    if dflash:
        for bs, window in itertools.product(dflash.get("block_size", [8]), dflash.get("window", [None])):
            where = "baselines.dflash"
            spec = {"preset": dflash.get("preset", "dflash"), "block_size": bs, "window": window}
            points.append((_make_point(config, spec, where), where))
    sweep = config["sweep"]
    grid = sweep.get("grid")
    if grid:
        constraints = [_compile_constraint(c, f"sweep.constraints[{i}]")
                       for i, c in enumerate(sweep.get("constraints", []))]
        for values in itertools.product(grid["budget"], grid["topk"], grid["block_size"], grid.get("window", [None])):
            knobs = dict(zip(KNOBS, values, strict=True))
            if all(eval(code, {"__builtins__": {}}, dict(knobs)) for code in constraints):  # noqa: S307
                spec = {"preset": sweep.get("preset", "ddtree"), **knobs}
                points.append((_make_point(config, spec, "sweep.grid"), "sweep.grid"))
    for i, spec in enumerate(sweep.get("points", [])):
        points.append((_make_point(config, spec, f"sweep.points[{i}]"), f"sweep.points[{i}]"))
    seen: dict[str, str] = {}
    for point, where in points:
        if point.point_id in seen:
            raise ConfigError(f"{where}: duplicate point {point.point_id!r} (already defined by "
                              f"{seen[point.point_id]}); each point must appear once")
        seen[point.point_id] = where
    return [point for point, _ in points]


def _check_analysis(config: dict) -> None:
    """Regimes must name cells of the benchmark matrix; priorities must name regimes."""
    analysis = config.get("analysis", {})
    bench = config["benchmark"]
    names = []
    for i, regime in enumerate(analysis.get("regimes", [])):
        where = f"analysis.regimes[{i}]"
        if regime["context"] not in bench["contexts"]:
            raise ConfigError(f"{where}.context: {regime['context']} is not in benchmark.contexts {bench['contexts']}")
        if regime["concurrency"] not in bench["concurrency"]:
            raise ConfigError(f"{where}.concurrency: {regime['concurrency']} is not in "
                              f"benchmark.concurrency {bench['concurrency']}")
        names.append(regime["name"])
    if len(set(names)) != len(names):
        raise ConfigError("analysis.regimes: regime names must be unique")
    if names:
        for priority, weights in analysis.get("priorities", {}).items():
            for regime in weights:
                if regime not in names:
                    raise ConfigError(f"analysis.priorities.{priority}.{regime}: no regime named {regime!r}; "
                                      f"regimes: {', '.join(names)}")


def _check_resources(config: dict) -> None:
    """The server's startup timeout must fit inside the job's runtime, with room for the measurements."""
    resources_cfg = config.get("resources", {})
    runtime_s = resources_cfg.get("runtime_min", 240) * 60
    startup_s = config["engine"].get("startup_timeout_s", 1200)
    if startup_s >= runtime_s:
        raise ConfigError(f"engine.startup_timeout_s: {startup_s:g} s does not fit inside resources.runtime_min "
                          f"({runtime_s / 60:g} min); the job would be killed before the server is up")


def _check_coding(config: dict) -> None:
    """The coding-eval subset must exist."""
    coding = config.get("coding_eval", {})
    if coding.get("limit") and coding["limit"] > CODING_PROBLEMS:
        raise ConfigError(f"coding_eval.limit: {coding['limit']} exceeds the {CODING_PROBLEMS} HumanEval problems")
    retry = coding.get("retry_truncated_max_tokens")
    if retry is not None and retry <= coding.get("max_tokens", 0):
        raise ConfigError(f"coding_eval.retry_truncated_max_tokens: {retry} must be larger than "
                          f"coding_eval.max_tokens ({coding['max_tokens']})")


def find_point(config: dict, point_id: str) -> Point:
    """The point with this id, or a ConfigError listing the known ids."""
    points = {p.point_id: p for p in expand_points(config)}
    if point_id not in points:
        raise ConfigError(f"no point {point_id!r} in this configuration; known: {', '.join(points)}")
    return points[point_id]


def configured_point_ids(config: Mapping[str, Any] | None) -> list[str] | None:
    """The point ids of a full study configuration, or None (meaning: every point found) for a partial one."""
    if not config or "sweep" not in config or config["sweep"].get("strategy") == "adaptive":
        return None  # an adaptive study's confirmed points include refinement points outside the grid
    try:
        return [p.point_id for p in expand_points(validate_config(config))]
    except ConfigError:
        return None


def point_record(config: dict, point: Point) -> dict:
    """Everything one point's job needs, as plain data (the workflow passes it to `ddsweep run-point`)."""
    preset = config["engine"]["presets"][point.preset]
    return {
        "study": config["study"],
        "point_id": point.point_id,
        "simulated": bool(config.get("simulated", False)),
        "point": asdict(point),
        "target": config["target"],
        "drafter": config["drafter"],
        "engine": {k: v for k, v in config["engine"].items() if k != "presets"},
        "preset": preset,
        "benchmark": config["benchmark"],
        "coding_eval": config.get("coding_eval", {"enabled": False}),
    }


def estimate_minutes(config: dict, n_points: int) -> dict[str, float]:
    """GPU-time estimate for the whole sweep from the configured startup and per-cell times."""
    est = config.get("resources", {}).get("estimate", {})
    bench = config["benchmark"]
    cells = len(bench["contexts"]) * len(bench["concurrency"]) * bench.get("repeats", 3)
    coding = est.get("coding_min", 15) if config.get("coding_eval", {}).get("enabled", True) else 0.0
    per_point = est.get("startup_min", 10) + cells * est.get("cell_min", 1.5) + coding
    gpus = config.get("resources", {}).get("gpus", 8)
    return {"per_point_min": per_point, "total_min": per_point * n_points,
            "gpu_hours": per_point * n_points * gpus / 60, "cells_per_point": cells}


def format_plan(config: dict) -> str:
    """The expanded sweep as a table with a count and a GPU-time estimate."""
    points = expand_points(config)
    header = f"{'point':<24} {'preset':<10} {'kind':<7} {'budget':>6} {'topk':>5} {'block':>6} {'window':>7}"
    lines = [header, "-" * len(header)]
    for p in points:
        def show(value: int | None) -> str:
            return "-" if value is None else str(value)
        window = "off" if p.kind != "ar" and p.window is None else show(p.window)
        lines.append(f"{p.point_id:<24} {p.preset:<10} {p.kind:<7} {show(p.budget):>6} {show(p.topk):>5} "
                     f"{show(p.block_size):>6} {window:>7}")
    est = estimate_minutes(config, len(points))
    gpus = config.get("resources", {}).get("gpus", 8)
    lines += ["", f"{len(points)} points; {est['cells_per_point']} benchmark cells per point",
              f"estimated {est['per_point_min']:.0f} min per point, {est['total_min'] / 60:.1f} h of jobs in all "
              f"= {est['gpu_hours']:.0f} GPU-hours at {gpus} GPUs per point"]
    from ddsweep.config.stages import format_stage_plan  # stages imports this module

    lines += format_stage_plan(config)
    if config.get("simulated"):
        lines.append("SIMULATED: the launcher is the stand-in server; no GPU is used")
    return "\n".join(lines)


def config_from_args(args: argparse.Namespace) -> dict:
    """The validated configuration named on the command line (files, or JSON as the workflow passes it)."""
    if getattr(args, "config_json", None):
        try:
            return validate_config(json.loads(args.config_json))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config-json is not valid JSON: {exc}") from exc
    return load_config(*args.config)


def _run_plan(args: argparse.Namespace) -> int:
    """`ddsweep plan`: print the expanded sweep."""
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"ddsweep plan: {exc}", file=sys.stderr)
        return 2
    print(format_plan(config))
    return 0


def _run_validate(args: argparse.Namespace) -> int:
    """`ddsweep validate`: check the configuration, say so, and optionally write it out with defaults filled."""
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"ddsweep validate: {exc}", file=sys.stderr)
        return 2
    if args.write:
        write_text_atomic(args.write, yaml.safe_dump(config, sort_keys=False))
    print(f"configuration OK: study {config['study']!r}, {len(expand_points(config))} points")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` and `validate` subcommands."""
    for name, func, text in (("plan", _run_plan, "print the expanded sweep and a GPU-time estimate"),
                             ("validate", _run_validate, "validate a study configuration")):
        parser = subparsers.add_parser(name, help=text, description=text)
        parser.add_argument("--config", "-c", nargs="+", default=["config/config.yaml"],
                            help="configuration file(s); later files update earlier ones")
        parser.add_argument("--config-json", help="the configuration as one JSON document (used by the workflow)")
        if name == "validate":
            parser.add_argument("--write", metavar="FILE", help="write the validated configuration (defaults filled)")
        parser.set_defaults(func=func)
