"""The knob registry and the effective draft tree: one place that knows the four knobs and how a preset's
tree rule turns them into the tree the engine really builds.

A knob's name, type and kinds live here; how it reaches the server (a `{placeholder}` in the preset's
arguments or environment) and how it is verified (`verify.server_args` / `verify.log_patterns`) are read from
the preset by :func:`knob_routes`, so a build with other flag names changes the preset, not code. The tree
rule is data in the preset (`tree:` with expressions over the knobs, see config/README.md)."""

from __future__ import annotations

import ast
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("ddtree", "dflash", "ar")


@dataclass(frozen=True)
class Knob:
    """One sweep knob: its name, type, the kinds of point it applies to, and whether None is a value."""

    name: str
    kinds: tuple[str, ...]
    meaning: str
    optional: bool = False  # None is a value ("off"), not "missing"
    type: type = int


REGISTRY: tuple[Knob, ...] = (
    Knob("budget", ("ddtree",), "node budget of the draft tree (verify width = budget + 1)"),
    Knob("topk", ("ddtree",), "branches per tree depth (a cap on the width under PR #29907)"),
    Knob("block_size", ("ddtree", "dflash"), "tokens the drafter predicts in one forward pass"),
    Knob("window", ("ddtree", "dflash"), "sliding-window size of the drafter's KV cache (None: off)",
         optional=True),
)
KNOBS: tuple[str, ...] = tuple(k.name for k in REGISTRY)
BY_NAME: dict[str, Knob] = {k.name: k for k in REGISTRY}
# Knobs each kind of point uses; the others are None for that kind.
KIND_KNOBS: dict[str, tuple[str, ...]] = {kind: tuple(k.name for k in REGISTRY if kind in k.kinds) for kind in KINDS}
# Placeholders a command template, environment value or verify value may use besides the knobs.
SERVER_PLACEHOLDERS = ("model_path", "served_model_name", "drafter_path", "host", "port", "python", "nnodes",
                       "node_rank", "dist_init_addr")
# Keys of a preset that describe the engine for ddsweep and never reach the server.
DESCRIPTIVE_PRESET_KEYS = ("tree", "failure_patterns", "build")


class ExpressionError(ValueError):
    """A constraint or tree expression that does not parse or uses something not allowed; names where."""


def placeholders(template: str) -> list[str]:
    """Names used as `{name}` in a template string."""
    return [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]


@dataclass(frozen=True)
class KnobRoute:
    """How one knob reaches a preset's server and which checks can see it."""

    args: tuple[str, ...]
    env: tuple[str, ...]
    verify_server_args: tuple[str, ...]
    verify_log_patterns: tuple[int, ...]
    verify_launch_command: tuple[int, ...]

    @property
    def verified(self) -> bool:
        """Whether any configured check (server_args, a log pattern, a launch_command fragment) reads this knob."""
        return bool(self.verify_server_args or self.verify_log_patterns or self.verify_launch_command)


def knob_routes(preset: Mapping[str, Any]) -> dict[str, KnobRoute]:
    """For each knob of the preset's kind: where it is placed (args, env) and which verify entries use it."""
    routes = {}
    args = [(f"args[{i}]", a) for i, a in enumerate(preset.get("args", []))]
    for knob_name, extra in preset.get("args_if_set", {}).items():
        args += [(f"args_if_set.{knob_name}[{i}]", a) for i, a in enumerate(extra)]
    verify = preset.get("verify", {})
    derived = preset.get("derived") or {}
    for name in KIND_KNOBS[preset["kind"]]:
        # a template uses a knob directly or through a derived placeholder whose expression reads it
        through = {d for d, expression in derived.items()
                   if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(ast.parse(str(expression),
                                                                                               mode="eval")))}

        def uses(value: Any, names: set[str] = {name} | through) -> bool:  # noqa: B006
            return isinstance(value, str) and bool(names & set(placeholders(value)))
        routes[name] = KnobRoute(
            args=tuple(where for where, a in args if uses(a)),
            env=tuple(k for k, v in preset.get("env", {}).items() if uses(v)),
            verify_server_args=tuple(k for k, v in verify.get("server_args", {}).items() if uses(v)),
            verify_log_patterns=tuple(i for i, p in enumerate(verify.get("log_patterns", [])) if uses(p)),
            verify_launch_command=tuple(i for i, p in enumerate(verify.get("launch_command", [])) if uses(p)),
        )
    return routes


def unverified_knobs(preset: Mapping[str, Any]) -> list[str]:
    """Knobs of the preset's kind that no verify entry checks (e.g. topk passed only in an env variable)."""
    return [name for name, route in knob_routes(preset).items() if not route.verified]


def server_preset(preset: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a preset that reaches the server (without descriptive keys such as `tree`)."""
    return {k: v for k, v in preset.items() if k not in DESCRIPTIVE_PRESET_KEYS}


# --- expressions over the knobs (sweep constraints and tree rules) -------------------------------------------

_ALLOWED_NODES = (ast.Expression, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Name, ast.Load,
                  ast.Constant, ast.And, ast.Or, ast.Not, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
                  ast.Is, ast.IsNot, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.USub,
                  ast.In, ast.NotIn, ast.Tuple, ast.List, ast.IfExp)
FUNCTIONS = {"min": min, "max": max}


def compile_expression(expression: str, where: str, names: tuple[str, ...] = KNOBS,
                       functions: tuple[str, ...] = ()) -> Any:
    """Parse an expression into a code object, allowing only comparisons, arithmetic and `functions` over
    `names`; an ExpressionError names `where`."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"{where}: not a valid expression: {expression!r} ({exc.msg})") from exc
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in functions and not node.keywords):
                allowed = f"only {', '.join(functions)} may be called" if functions else "no function calls"
                raise ExpressionError(f"{where}: Call is not allowed in {expression!r} ({allowed})")
            continue
        if not isinstance(node, _ALLOWED_NODES):
            raise ExpressionError(f"{where}: {type(node).__name__} is not allowed in {expression!r}; use "
                                  f"comparisons and arithmetic over {', '.join(names)}")
        if isinstance(node, ast.Name) and node.id not in names and node.id not in functions:
            raise ExpressionError(f"{where}: unknown name {node.id!r} in {expression!r}; "
                                  f"known: {', '.join(names)}, None")
    return compile(tree, where, "eval")


def evaluate(code: Any, knobs: Mapping[str, Any]) -> Any:
    """Evaluate a compiled expression with the knobs (and min/max) as its only names."""
    return eval(code, {"__builtins__": {}, **FUNCTIONS}, dict(knobs))  # noqa: S307


# --- the effective draft tree ---------------------------------------------------------------------------------

TREE_SHAPES = ("tree", "chain", "none")
# Expressions each shape needs (chain_if, when given, turns a tree into a chain of chain_length tokens).
TREE_EXPRESSIONS = {"tree": ("width", "depth_limit", "nodes", "verify_width"),
                    "chain": ("chain_length", "verify_width"), "none": ()}
TREE_KEYS = ("chain_if", "chain_length", "width", "depth_limit", "nodes", "verify_width")


def tree_capacity(width: int, depth: int) -> int:
    """Most nodes a tree of this width (children per node) and depth can hold: width + width² + … + width^depth;
    a width-1 tree is a chain of `depth` nodes."""
    return depth if width == 1 else width * (width ** depth - 1) // (width - 1)


@dataclass(frozen=True)
class EffectiveTree:
    """The draft tree the engine builds for a point: shape, width, depth limit, node count, verify width."""

    rule: str
    shape: str  # tree, chain or none
    width: int | None = None
    depth_limit: int | None = None
    nodes: int | None = None
    verify_width: int | None = None

    def describe(self) -> str:
        """Short text for tables, e.g. `tree w2 d7 n8 v9`, `chain 7 v8`, `none`, `unknown` (v: verify width)."""
        if self.shape == "tree":
            return f"tree w{self.width} d{self.depth_limit} n{self.nodes} v{self.verify_width}"
        if self.shape == "chain":
            return f"chain {self.depth_limit} v{self.verify_width}"
        return self.shape

    def drafted(self) -> tuple:
        """The drafted tokens' structure without the verify width: points with equal drafted trees accept alike
        (a width-1 tree is the chain of its nodes)."""
        if self.shape == "chain" or (self.shape == "tree" and self.width == 1):
            return ("chain", self.nodes)
        return (self.shape, self.width, self.depth_limit, self.nodes)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for plan.json and tables."""
        return {"rule": self.rule, "shape": self.shape, "width": self.width, "depth_limit": self.depth_limit,
                "nodes": self.nodes, "verify_width": self.verify_width}


UNKNOWN_TREE = EffectiveTree(rule="unknown", shape="unknown")


def check_tree_rule(preset: Mapping[str, Any], where: str) -> None:
    """A preset's `tree` must have the expressions its shape needs, each valid over the preset's knobs."""
    tree = preset.get("tree")
    if tree is None:
        return
    kind = preset["kind"]
    shape = tree["shape"]
    needed = TREE_EXPRESSIONS[shape] + (("chain_length",) if "chain_if" in tree else ())
    for key in needed:
        if key not in tree:
            raise ExpressionError(f"{where}.tree.{key}: a {shape} rule needs {key}")
    for key in TREE_KEYS:
        if key in tree and key not in needed and key != "chain_if":
            raise ExpressionError(f"{where}.tree.{key}: not used by a {shape} rule (it needs "
                                  f"{', '.join(needed) or 'no expressions'})")
        if key in tree:
            compile_expression(str(tree[key]), f"{where}.tree.{key}", KIND_KNOBS[kind], tuple(FUNCTIONS))
    for knob in tree.get("absorbs", []):
        if knob not in KIND_KNOBS[kind]:
            raise ExpressionError(f"{where}.tree.absorbs: knob {knob!r} does not apply to a {kind} preset")


def effective_tree(preset: Mapping[str, Any], knobs: Mapping[str, Any], where: str = "point") -> EffectiveTree:
    """The tree a preset's rule builds for these knobs (UNKNOWN_TREE when the preset has no `tree`)."""
    tree = preset.get("tree")
    if tree is None:
        return UNKNOWN_TREE
    kind_knobs = KIND_KNOBS[preset["kind"]]
    values = {k: knobs.get(k) for k in kind_knobs}

    def value(key: str) -> Any:
        code = compile_expression(str(tree[key]), f"{where}: tree.{key}", kind_knobs, tuple(FUNCTIONS))
        try:
            return evaluate(code, values)
        except (TypeError, ZeroDivisionError, ValueError) as exc:
            raise ExpressionError(f"{where}: tree.{key} = {tree[key]!r} fails for {values}: {exc}") from exc

    def count(key: str) -> int:
        result = value(key)
        if isinstance(result, bool) or not isinstance(result, int) or result < 1:
            raise ExpressionError(f"{where}: tree.{key} = {tree[key]!r} gives {result!r} for {values}; "
                                  "expected a positive integer")
        return result

    shape = tree["shape"]
    if shape == "none":
        return EffectiveTree(rule=tree["rule"], shape="none")
    if shape == "chain" or ("chain_if" in tree and bool(value("chain_if"))):
        length = count("chain_length")
        return EffectiveTree(rule=tree["rule"], shape="chain", width=1, depth_limit=length, nodes=length,
                             verify_width=count("verify_width"))
    width, depth = count("width"), count("depth_limit")
    # The rule's `nodes` is an upper bound (the budget); the tree's shape bounds it too.
    return EffectiveTree(rule=tree["rule"], shape="tree", width=width, depth_limit=depth,
                         nodes=min(count("nodes"), tree_capacity(width, depth)), verify_width=count("verify_width"))


def absorbed_knobs(preset: Mapping[str, Any]) -> tuple[str, ...]:
    """Knobs that reach the engine only through the tree and its verify width (`tree.absorbs`): points with equal
    trees and verify widths differ in them only in name."""
    tree = preset.get("tree")
    return tuple(tree.get("absorbs", [])) if tree else ()


def tree_rule_confirmed(preset: Mapping[str, Any]) -> bool:
    """Whether alias groups may rest on the preset's tree rule: the user trusts it (`tree.trusted`), or a
    `verify.log_patterns` entry checks, in the engine's own log, a knob the rule reads (the engine states the tree
    settings it applied, so a build with another rule for these knobs fails verification instead of passing)."""
    tree = preset.get("tree")
    if not tree:
        return False
    if tree.get("trusted"):
        return True
    used = {node.id for key in TREE_KEYS if key in tree for node in ast.walk(ast.parse(str(tree[key]), mode="eval"))
            if isinstance(node, ast.Name)}
    return any(route.verify_log_patterns for name, route in knob_routes(preset).items() if name in used)
