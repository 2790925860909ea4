"""Study configuration: loading, schema and semantic validation, point records and `ddsweep validate`."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ddsweep.config.defaults import load_schema, schema_default
from ddsweep.config.knobs import (
    FUNCTIONS,
    KIND_KNOBS,
    SERVER_PLACEHOLDERS,
    ExpressionError,
    check_tree_rule,
    compile_expression,
    effective_tree,
    placeholders,
    unverified_knobs,
)
from ddsweep.config.plan import plan_points
from ddsweep.config.points import ConfigError, Point, compile_constraint, expand_points, grid_combinations
from ddsweep.config.presets import PresetLibraryError, with_library
from ddsweep.figures import METRICS
from ddsweep.storage import write_text_atomic

if TYPE_CHECKING:
    from jsonschema import ValidationError

CODING_PROBLEMS = 164
# The Snakefile's `configfile:`, which every `--configfile` given to Snakemake updates.
WORKFLOW_CONFIG = Path("config/config.yaml")
DEMO_HINT = "to try the pipeline without a GPU, run the demo: snakemake --cores all --configfile .test/config.yaml"


def _key_path(parts: Any) -> str:
    """Render a jsonschema path such as ['engine', 'presets', 'ar'] as `engine.presets.ar`."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


class _DefaultFillingValidator:
    """A Draft 2020-12 validator that also fills in schema defaults, like snakemake.utils.validate."""

    def __init__(self, schema: dict) -> None:
        import jsonschema  # here: the point jobs read validated records and need not import it (30 ms a process)

        base = jsonschema.Draft202012Validator

        def set_defaults(validator, properties, instance, schema):  # noqa: ANN001
            if isinstance(instance, dict):
                for name, sub in properties.items():
                    if isinstance(sub, dict) and "default" in sub and name not in instance:
                        instance[name] = copy.deepcopy(sub["default"])
            yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

        cls = jsonschema.validators.extend(base, {"properties": set_defaults})
        self.validator = cls(schema)

    def errors(self, instance: dict) -> list[ValidationError]:
        """All schema violations, sorted so the first names the outermost key."""
        return sorted(self.validator.iter_errors(instance), key=lambda e: (len(e.path), list(map(str, e.path))))


def validate_config(raw: Mapping[str, Any]) -> dict:
    """Validate a configuration against the schema and the semantic rules; returns it with defaults filled."""
    if not isinstance(raw, Mapping):
        raise ConfigError("the configuration must be a mapping of keys to values")
    config = copy.deepcopy(dict(raw))
    if isinstance(config.get("engine"), dict):
        config["engine"].setdefault("failure_patterns", schema_default("engine.failure_patterns"))
        try:
            with_library(config)
        except PresetLibraryError as exc:
            raise ConfigError(f"preset library: {exc}") from exc
    schema = load_schema()
    errors = [_innermost(e) for e in _DefaultFillingValidator(schema).errors(config)]
    if errors:
        lines = [f"{_key_path(e.absolute_path)}: {_describe_schema_error(e)}" for e in errors[:10]]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    _check_presets(config)
    _check_constraints(config)
    points = expand_points(config)
    _check_trees(config, points)
    _check_analysis(config)
    _check_resources(config)
    _check_stall(config)
    _check_coding(config)
    _check_reference(config, points)
    if not points:
        raise ConfigError("sweep: the sweep expands to no points (empty grid, constraints remove every point, "
                          "and no baselines); nothing would run")
    return config


def _innermost(error: ValidationError) -> ValidationError:
    """For a value that matches none of a key's alternatives (oneOf, anyOf), the error of the alternative that got
    furthest into the value, which names the rule broken (`[0]`: "0 is less than the minimum of 1", not "[0] is
    not of type 'null'")."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        return _innermost(max(error.context, key=lambda e: (len(e.absolute_path), e.validator != "type")))
    return error


def _describe_schema_error(error: ValidationError) -> str:
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
    """Update `base` in place as Snakemake's `update_config` merges config files: a mapping is merged key by key
    into what is there (a non-mapping there is replaced by it), any other value replaces; returns `base`."""
    for key, value in update.items():
        if isinstance(value, Mapping):
            current = base.get(key, {})
            if value or key not in base:  # an empty mapping leaves the key as it is, whatever it holds
                base[key] = merge_config(current if isinstance(current, dict) else {}, value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def workflow_config_files(paths: list[str]) -> list[str]:
    """The files Snakemake reads for `--configfile PATHS`: the Snakefile's own `configfile:` (WORKFLOW_CONFIG,
    relative to the directory it runs in) first when it exists there, then PATHS in order."""
    if not WORKFLOW_CONFIG.is_file():
        return list(paths)
    if paths and Path(paths[0]).resolve() == WORKFLOW_CONFIG.resolve():
        return list(paths)
    return [str(WORKFLOW_CONFIG), *paths]


def _check_presets(config: dict) -> None:
    """Every template placeholder must be known and apply to the preset's kind."""
    for name, preset in config["engine"]["presets"].items():
        kind = preset["kind"]
        derived = set(preset.get("derived") or {})
        clash = sorted(derived & (set(SERVER_PLACEHOLDERS) | set(KIND_KNOBS[kind])))
        if clash:
            raise ConfigError(f"engine.presets.{name}.derived: {', '.join(clash)} already name a knob or placeholder")
        for field, expression in (preset.get("derived") or {}).items():
            try:
                compile_expression(str(expression), f"engine.presets.{name}.derived.{field}", KIND_KNOBS[kind],
                                   tuple(FUNCTIONS))
            except ExpressionError as exc:
                raise ConfigError(str(exc)) from exc
        allowed = set(SERVER_PLACEHOLDERS) | set(KIND_KNOBS[kind]) | derived
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
                fields = placeholders(template)
            except ValueError as exc:
                raise ConfigError(f"engine.presets.{name}.{where}: malformed template {template!r}: {exc}") from exc
            for field in fields:
                if field not in allowed:
                    raise ConfigError(
                        f"engine.presets.{name}.{where}: unknown placeholder {{{field}}} in {template!r}; "
                        f"a {kind} preset may use {', '.join('{' + a + '}' for a in sorted(allowed))}")
        try:
            check_tree_rule(preset, f"engine.presets.{name}")
        except ExpressionError as exc:
            raise ConfigError(str(exc)) from exc
        port_used = any("{port}" in a for a in preset["args"])
        if not port_used:
            raise ConfigError(f"engine.presets.{name}.args: the command must pass the port with {{port}}, "
                              "so that every job listens on a port of its own")
    for i, part in enumerate(config["engine"]["launcher"]):
        for field in placeholders(part):
            if field != "python":
                raise ConfigError(f"engine.launcher[{i}]: unknown placeholder {{{field}}}; only {{python}} "
                                  "(the interpreter running ddsweep) is allowed here")


def _check_constraints(config: dict) -> None:
    """Constraints must parse (checked before expansion, so the error names the constraint)."""
    for i, expression in enumerate(config["sweep"]["constraints"]):
        compile_constraint(expression, f"sweep.constraints[{i}]")


def _check_trees(config: dict, points: list[Point]) -> None:
    """Every point's preset tree rule must give a valid tree for its knobs (the error names the point)."""
    for point in points:
        try:
            effective_tree(config["engine"]["presets"][point.preset], point.knobs, f"point {point.point_id}")
        except ExpressionError as exc:
            raise ConfigError(f"engine.presets.{point.preset}.tree: {exc}") from exc


def _check_analysis(config: dict) -> None:
    """Regimes must name cells of the benchmark matrix; priorities must name regimes."""
    analysis = config["analysis"]
    bench = config["benchmark"]
    workload_names = [w["name"] for w in bench.get("workloads") or []]
    if len(set(workload_names)) != len(workload_names):
        raise ConfigError(f"benchmark.workloads: names must be unique, got {workload_names}")
    for i, workload in enumerate(bench.get("workloads") or []):
        if workload["kind"] == "jsonl" and not workload.get("path"):
            raise ConfigError(f"benchmark.workloads[{i}] ({workload['name']}): kind jsonl needs a path")
    names = []
    for i, regime in enumerate(analysis.get("regimes", [])):
        where = f"analysis.regimes[{i}]"
        if regime["context"] not in bench["contexts"]:
            raise ConfigError(f"{where}.context: {regime['context']} is not in benchmark.contexts {bench['contexts']}")
        if regime["concurrency"] not in bench["concurrency"]:
            raise ConfigError(f"{where}.concurrency: {regime['concurrency']} is not in "
                              f"benchmark.concurrency {bench['concurrency']}")
        metric = METRICS[regime["metric"]]
        if config["sweep"]["strategy"] == "adaptive" and not metric.screenable:
            median = regime["metric"].replace(f"_p{metric.quantile:g}_", "_p50_")
            raise ConfigError(
                f"{where}.metric: {regime['metric']} cannot rank an adaptive study's screening: it measures each "
                f"point once, briefly, and the {metric.quantile:g}th percentile of that launch's few requests is its "
                f"slowest one, with no standard error to drop points on; use {median} or sweep.strategy: grid")
        names.append(regime["name"])
    if len(set(names)) != len(names):
        raise ConfigError("analysis.regimes: regime names must be unique")
    for priority, weights in analysis.get("priorities", {}).items():
        if not any(weight > 0 for regime, weight in weights.items() if regime not in ("slo", "slo_cell")):
            raise ConfigError(f"analysis.priorities.{priority}: weighs no regime (every weight is 0 or none is "
                              "given); a priority ranks points by the regimes it weighs")
        cell = weights.get("slo_cell")
        if cell and (cell["context"] not in bench["contexts"] or cell["concurrency"] not in bench["concurrency"]):
            raise ConfigError(f"analysis.priorities.{priority}.slo_cell: context {cell['context']}, concurrency "
                              f"{cell['concurrency']} is not a cell of the benchmark matrix")
    if names:
        for priority, weights in analysis.get("priorities", {}).items():
            for regime in weights:
                if regime not in names and regime not in ("slo", "slo_cell"):
                    raise ConfigError(f"analysis.priorities.{priority}.{regime}: no regime named {regime!r}; "
                                      f"regimes: {', '.join(names)}")


SIGNAL_MARGIN_S = 10  # seconds run-point needs after stopping the server to write failure.json


def _check_resources(config: dict) -> None:
    """The server's startup timeout must fit inside the job's runtime, with room for the measurements."""
    runtime_s = config["resources"]["runtime_min"] * 60
    startup_s = config["engine"]["startup_timeout_s"]
    if startup_s >= runtime_s:
        raise ConfigError(f"engine.startup_timeout_s: {startup_s:g} s does not fit inside resources.runtime_min "
                          f"({runtime_s / 60:g} min); the job would be killed before the server is up")
    lead_s = config["resources"]["signal_lead_s"]
    shutdown_s = config["engine"]["shutdown_timeout_s"]
    if lead_s and lead_s >= runtime_s:
        raise ConfigError(f"resources.signal_lead_s: {lead_s} s is not shorter than resources.runtime_min "
                          f"({runtime_s / 60:g} min)")
    if lead_s and shutdown_s + SIGNAL_MARGIN_S > lead_s:
        raise ConfigError(f"engine.shutdown_timeout_s: {shutdown_s:g} s plus {SIGNAL_MARGIN_S} s to record the "
                          f"interruption does not fit inside resources.signal_lead_s ({lead_s} s): at the time "
                          "limit Slurm would kill the server before run-point has stopped it")


def _check_stall(config: dict) -> None:
    """A hang must be named before every silent request times out: the stall timeout below the request timeout;
    a cell's window must fit under its cap."""
    bench = config["benchmark"]
    if bench["min_window_s"] > bench["max_window_s"]:
        raise ConfigError(f"benchmark.min_window_s: {bench['min_window_s']:g} s is longer than "
                          f"benchmark.max_window_s ({bench['max_window_s']:g} s), the cap of a cell's window")
    stall, request = bench["stall_timeout_s"], bench["request_timeout_s"]
    if stall is not None and stall >= request:
        raise ConfigError(f"benchmark.stall_timeout_s: {stall:g} s is not shorter than benchmark.request_timeout_s "
                          f"({request:g} s): every request of a hung server would time out before the hang is "
                          "named; leave it null (a tenth of the request timeout) or lower it")


def context_length_flag(args: list[str]) -> int | None:
    """The value of SGLang's `--context-length` in a server command line, or None where it is not given."""
    for i, token in enumerate(args):
        value = args[i + 1] if token == "--context-length" and i + 1 < len(args) else (
            token.split("=", 1)[1] if token.startswith("--context-length=") else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _check_coding(config: dict) -> None:
    """The coding-eval subset must exist, and its answers' tokens fit a context length the study sets: SGLang
    refuses a request whose prompt and max_tokens exceed it, so every point would fail its coding eval."""
    coding = config["coding_eval"]
    if coding["limit"] and coding["limit"] > CODING_PROBLEMS:
        raise ConfigError(f"coding_eval.limit: {coding['limit']} exceeds the {CODING_PROBLEMS} HumanEval problems")
    known = {f"HumanEval/{n}" for n in range(CODING_PROBLEMS)}
    unknown = [task for task in coding.get("task_ids") or [] if task not in known]
    if unknown:
        raise ConfigError(f"coding_eval.task_ids: unknown HumanEval task id(s) {', '.join(map(repr, unknown))}; "
                          f"the ids are HumanEval/0 to HumanEval/{CODING_PROBLEMS - 1}")
    retry = coding["retry_truncated_max_tokens"]
    if retry is not None and retry <= coding["max_tokens"]:
        raise ConfigError(f"coding_eval.retry_truncated_max_tokens: {retry} must be larger than "
                          f"coding_eval.max_tokens ({coding['max_tokens']})")
    server_args = [str(a) for a in config["target"].get("server_args") or []]
    length = context_length_flag(server_args)
    if not coding["enabled"] or length is None or "--allow-auto-truncate" in server_args:
        return  # with --allow-auto-truncate SGLang lowers max_new_tokens instead of refusing
    why = (f"does not fit --context-length {length} in target.server_args with any prompt: SGLang refuses a request "
           "whose prompt and max_tokens exceed the context length")
    if coding["max_tokens"] >= length:
        raise ConfigError(f"coding_eval.max_tokens: {coding['max_tokens']} {why}, so every point's coding eval would "
                          f"fail; lower it below {length} (leaving room for the prompt) or raise the context length")
    if retry is not None and retry >= length:
        raise ConfigError(f"coding_eval.retry_truncated_max_tokens: {retry} {why}, so every truncated answer's retry "
                          f"would fail; lower it below {length}, set it to null, or raise the context length")


def _check_reference(config: dict, points: list[Point]) -> None:
    """`sweep.reference` must name a configured point that runs, and is for the grid strategy only; `auto` with
    neither a point nor an autoregressive baseline means no reference."""
    reference = config["sweep"]["reference"]
    if reference["enabled"] is False:
        return
    strategy = config["sweep"]["strategy"]
    if strategy != "grid" and reference["enabled"] is True:
        raise ConfigError(f"sweep.reference.enabled: true needs sweep.strategy: grid (not {strategy}, which may run "
                          "adaptive); an adaptive study's confirmation already runs every repeat in a fresh server "
                          "launch, interleaved across points, so it schedules no reference runs (set it to auto or "
                          "false)")
    if strategy == "adaptive":
        return
    ids = [p.point_id for p in points]
    wanted = reference["point"]
    if wanted is None:
        if not config["baselines"]["ar"] and reference["enabled"] is True:  # auto: no reference without one
            raise ConfigError("sweep.reference.point: no point given and no autoregressive baseline to default to "
                              "(baselines.ar is false); name a configured point, or set sweep.reference.enabled: "
                              "false")
        return
    if wanted not in ids:
        raise ConfigError(f"sweep.reference.point: no configured point {wanted!r}; known: {', '.join(ids)}")
    planned = next(p for p in plan_points(config) if p.point.point_id == wanted)
    if not planned.runs:
        raise ConfigError(f"sweep.reference.point: {wanted!r} does not run, it is an alias of {planned.group!r} "
                          f"(one server configuration); name {planned.group!r} instead")


def find_point(config: dict, point_id: str) -> Point:
    """The point with this id, or a ConfigError listing the known ids."""
    points = {p.point_id: p for p in expand_points(config)}
    if point_id not in points:
        raise ConfigError(f"no point {point_id!r} in this configuration; known: {', '.join(points)}")
    return points[point_id]


def configured_point_ids(config: Mapping[str, Any] | None) -> list[str] | None:
    """The point ids of a full study configuration, or None (meaning: every point found) for a partial one."""
    if not config or "sweep" not in config or config["sweep"].get("strategy") in ("adaptive", "auto"):
        return None  # an adaptive study's confirmed points include refinement points outside the grid
    try:
        return [p.point_id for p in expand_points(validate_config(config))]
    except ConfigError:
        return None


def config_from_args(args: argparse.Namespace) -> dict:
    """The validated configuration named on the command line (files, or JSON as the workflow passes it)."""
    if getattr(args, "config_json", None):
        try:
            return validate_config(json.loads(args.config_json))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config-json is not valid JSON: {exc}") from exc
    return load_config(*args.config)


def unverified_swept_knobs(config: dict) -> list[str]:
    """Warnings for knobs that take several values among a preset's points while no verify entry checks them."""
    warnings = []
    points = expand_points(config)
    for name, preset in config["engine"]["presets"].items():
        members = [p for p in points if p.preset == name]
        for knob in unverified_knobs(preset):
            values = sorted({getattr(p, knob) for p in members}, key=lambda v: (v is None, v or 0))
            if len(values) > 1:
                warnings.append(f"engine.presets.{name}: knob {knob} is swept ({', '.join(map(str, values))}) but "
                                "no verify entry checks it; add a verify.log_patterns entry if the engine logs it")
    return warnings


def empty_grid(config: dict) -> list[str]:
    """A warning when the constraints remove every combination of the grid: only the baselines and the explicit
    points run (on purpose where a study sets a constraint no combination meets, by mistake elsewhere)."""
    sweep = config["sweep"]
    if not sweep.get("grid") or grid_combinations(sweep):
        return []
    return [f"sweep.constraints: {' and '.join(sweep['constraints'])} removes every combination of sweep.grid; "
            "only the baselines and sweep.points run"]


def _run_validate(args: argparse.Namespace) -> int:
    """`ddsweep validate`: check the configuration Snakemake would run (the files given merged over the
    workflow's config/config.yaml, as `--configfile` merges them), say so, and optionally write it out."""
    files = [] if args.config_json else workflow_config_files(args.config)
    try:
        config = validate_config(json.loads(args.config_json)) if args.config_json else load_config(*files)
    except json.JSONDecodeError as exc:
        print(f"ddsweep validate: --config-json is not valid JSON: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        merged = (f" (checked: {' merged with '.join(files)}, as snakemake --configfile merges them: mappings "
                  f"merge key by key, so a key of {files[0]} that a later file does not replace stays)"
                  if len(files) > 1 else "")
        print(f"ddsweep validate: {exc}{merged}", file=sys.stderr)
        return 2
    if args.write:
        write_text_atomic(args.write, yaml.safe_dump(config, sort_keys=False))
    for warning in [*unverified_swept_knobs(config), *empty_grid(config)]:
        print(f"ddsweep validate: warning: {warning}", file=sys.stderr)
    checked = f" ({' merged with '.join(files)})" if len(files) > 1 else ""
    print(f"configuration OK: study {config['study']!r}, {len(expand_points(config))} points{checked}")
    return 0


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The options naming a configuration: files, or one JSON document (what the workflow passes)."""
    parser.add_argument("--config", "-c", nargs="+", default=["config/config.yaml"],
                        help="configuration file(s); later files update earlier ones")
    parser.add_argument("--config-json", help="the configuration as one JSON document (used by the workflow)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `validate` subcommand."""
    text = "validate a study configuration"
    parser = subparsers.add_parser("validate", help=text, description=text)
    add_config_arguments(parser)
    parser.add_argument("--write", metavar="FILE", help="write the validated configuration (defaults filled)")
    parser.set_defaults(func=_run_validate)
