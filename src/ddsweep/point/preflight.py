"""`ddsweep preflight`: check a study on the submit host before any GPU job is submitted.

It checks that the configuration is valid, that the model and drafter paths exist (unless the study is
simulated or the paths exist only on the compute nodes), that the Slurm partition exists, and that every flag of
every point's server command is one the installed server accepts: it asks the launcher's own Python to build
the server's argument parser (SGLang's `ServerArgs.add_cli_args`, or the stand-in's parser for
`ddsweep sim-server`) and parse each rendered command, so that a misspelled flag costs seconds instead of a
server start per point.
"""

from __future__ import annotations

import argparse
import difflib
import fcntl
import hashlib
import json
import os
import re
import shutil
import string
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ddsweep.bench.feasibility import describe as describe_cells
from ddsweep.bench.feasibility import matrix_check
from ddsweep.config.presets import Build, library_builds
from ddsweep.config.records import point_record
from ddsweep.config.study import (
    DEMO_HINT,
    ConfigError,
    Point,
    config_from_args,
    expand_points,
)
from ddsweep.point.lifecycle import render_server
from ddsweep.point.marks import STORE_ENV
from ddsweep.storage import read_json, write_json_atomic
from ddsweep.store import StoreError, StudyStore, push_file

# The port placeholder's value in rendered commands: any valid port does, nothing listens on it.
PROBE_PORT = 30000
PROBE_TIMEOUT_S = 600.0
PROBE_MARKER = "DDSWEEP-PREFLIGHT-RESULT "
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# How long a check one preset's preflight made (`--shared`) answers another's: the preflights of one invocation run
# within seconds of each other; an older answer is asked again, in case the installed server changed since.
SHARED_FOR_S = 600.0
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

# Runs under the launcher's Python (which need not have ddsweep): builds the server's parser with $setup,
# parses every argument list read as JSON from stdin, and prints one marked JSON line.
PROBE_TEMPLATE = string.Template(r"""
import argparse, json, sys

class ParseError(Exception):
    pass

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ParseError(message)

    def exit(self, status=0, message=None):
        raise ParseError(message or "the parser exited with status %s" % status)

def report(payload):
    print($marker + json.dumps(payload), flush=True)

parser = Parser(prog=$prog)
try:
    $setup
except ImportError as exc:
    report({"import_error": "%s: %s" % (type(exc).__name__, exc)})
    sys.exit(0)
results = []
for args in json.load(sys.stdin):
    try:
        _, unknown = parser.parse_known_args(args)
        results.append({"unknown": unknown, "error": None})
    except ParseError as exc:
        results.append({"unknown": [], "error": str(exc).strip()})
report({"options": sorted(parser._option_string_actions), "results": results})
""")

SGLANG_SETUP = "from sglang.srt.server_args import ServerArgs\nServerArgs.add_cli_args(parser)"
STAND_IN_SETUP = "from ddsweep.sim.cli import add_arguments\nadd_arguments(parser)"


class PreflightError(RuntimeError):
    """The argument parser of the server could not be asked (interpreter missing, probe crashed)."""


@dataclass(frozen=True)
class Finding:
    """One preflight result: an error stops the workflow, a notice says what was not checked and why."""

    level: str
    message: str
    preset: str | None = None
    points: tuple[str, ...] = ()

    def render(self, shown: int = 6) -> str:
        """One line for the log, naming the preset and the points it concerns."""
        where = f"[preset {self.preset}] " if self.preset else ""
        if not self.points:
            return f"{self.level.upper()}: {where}{self.message}"
        listed = ", ".join(self.points[:shown])
        more = f", ... ({len(self.points)} points)" if len(self.points) > shown else ""
        label = "point" if len(self.points) == 1 else "points"
        return f"{self.level.upper()}: {where}{self.message} ({label}: {listed}{more})"


@dataclass(frozen=True)
class ServerParser:
    """How to ask a launcher's server for its argument parser: which Python, which setup code, from which token."""

    name: str
    python: str
    setup: str
    args_start: int


@dataclass
class ProbeResult:
    """What the server's parser said: its option strings and, per argument list, unknown tokens or an error."""

    options: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    import_error: str | None = None


def identify_parser(command: list[str], launcher_length: int) -> ServerParser | None:
    """Recognise `PYTHON -m sglang.launch_server` and the stand-in (`PYTHON -m ddsweep sim-server`) in a command."""
    head = command[:launcher_length]
    for i, token in enumerate(head[:-1]):
        if token != "-m" or i == 0:
            continue
        module = head[i + 1]
        if module == "sglang.launch_server":
            return ServerParser("SGLang", command[i - 1], SGLANG_SETUP, i + 2)
        if module == "ddsweep" and i + 2 < len(head) and head[i + 2] == "sim-server":
            return ServerParser("the stand-in server", command[i - 1], STAND_IN_SETUP, i + 3)
    if len(head) >= 2 and Path(head[0]).name == "ddsweep" and head[1] == "sim-server":
        return ServerParser("the stand-in server", sys.executable, STAND_IN_SETUP, 2)
    return None


def probe_arguments(python: str, setup: str, arg_lists: list[list[str]], prog: str = "server",
                    timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Run `python -c` with the probe: build the parser with `setup`, parse each argument list, return the verdicts."""
    code = PROBE_TEMPLATE.substitute(marker=repr(PROBE_MARKER), prog=repr(prog),
                                     setup=textwrap.indent(setup, "    ").strip())
    try:
        done = subprocess.run([python, "-c", code], input=json.dumps(arg_lists), capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise PreflightError(f"the launcher's Python {python!r} was not found on this host") from exc
    except subprocess.TimeoutExpired as exc:
        raise PreflightError(f"building the server's argument parser with {python!r} took longer than "
                             f"{timeout_s:g} s") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith(PROBE_MARKER)]
    if not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise PreflightError(f"{python!r} could not build the server's argument parser (exit code "
                             f"{done.returncode}): {tail or 'no output'}")
    payload = json.loads(lines[-1][len(PROBE_MARKER):])
    return ProbeResult(options=payload.get("options", []), results=payload.get("results", []),
                       import_error=payload.get("import_error"))


def flag_tokens(unknown: Iterable[str]) -> list[str]:
    """The option-like tokens among a parser's leftovers (values of unknown flags and negative numbers dropped)."""
    flags = []
    for token in unknown:
        if token.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?", token):
            flags.append(token.split("=", 1)[0])
    return flags


def suggest(flag: str, options: Iterable[str]) -> str | None:
    """The closest known option to a misspelled flag, or None when nothing is close."""
    matches = difflib.get_close_matches(flag, [o for o in options if o.startswith("--")], n=1, cutoff=0.75)
    return matches[0] if matches else None


def representative_point(point: Point, preset: Mapping[str, Any]) -> Point:
    """The point with every optional knob of its preset set, so that every `args_if_set` flag gets checked."""
    values = {k: v for k, v in point.knobs.items() if v is not None}
    filler = max(values.values(), default=1)
    missing = {k: filler for k in preset.get("args_if_set", {}) if getattr(point, k) is None}
    return replace(point, **missing)


def _commands(config: dict, points: list[Point]) -> list[tuple[str, Point, list[str]]]:
    """(label, point, rendered server command) of every point, plus one per preset with every optional argument."""
    commands: list[tuple[str, Point, list[str]]] = []
    seen_full: set[str] = set()
    for point in points:
        commands.append((point.point_id, point, render_server(point_record(config, point), PROBE_PORT).command))
        full = representative_point(point, config["engine"]["presets"][point.preset])
        if full != point and point.preset not in seen_full:
            seen_full.add(point.preset)
            commands.append((f"{point.point_id} with every optional argument of its preset", full,
                             render_server(point_record(config, full), PROBE_PORT).command))
    return commands


def shared_check(directory: Path | None, what: str, key: object, compute: Callable[..., Any], *args: Any) -> Any:
    """`compute(*args)`, or its JSON answer that another preflight of the study saved in `directory` for the same `key`
    less than SHARED_FOR_S ago. Under a lock: the preflights of one invocation run side by side, and the first to
    ask builds the server's parser (or loads the tokenizer) once for all presets."""
    if directory is None:
        return compute(*args)
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(json.dumps([what, key], sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = directory / f"{what}-{digest}.json"
    with open(directory / f"{what}-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists() and time.time() - path.stat().st_mtime < SHARED_FOR_S:
            saved = read_json(path)
            if isinstance(saved, dict) and "answer" in saved:
                return saved["answer"]
        answer = compute(*args)
        write_json_atomic(path, {"what": what, "answer": answer})
        return answer


def check_flags(config: dict, points: list[Point], shared: Path | None = None) -> list[Finding]:
    """Ask each launcher's server parser about every point's command; unknown flags are errors, with a suggestion.
    With `shared`, every preset's commands are asked at once and the answer is shared with the other presets'
    preflights (`shared_check`); the findings are those of `points`' presets."""
    launcher_length = len(config["engine"]["launcher"])
    groups: dict[ServerParser, list[tuple[str, Point, list[str]]]] = {}
    findings: list[Finding] = []
    presets = {point.preset for point in points}
    for label, point, command in _commands(config, expand_points(config) if shared else points):
        parser = identify_parser(command, launcher_length)
        if parser is None:
            findings.append(Finding("notice", "engine.launcher " + " ".join(config["engine"]["launcher"])
                                    + " is neither `PYTHON -m sglang.launch_server` nor the stand-in; server flags "
                                    "were not checked"))
            break
        groups.setdefault(parser, []).append((label, point, command))
    for parser, asked in groups.items():
        arg_lists = [c[parser.args_start:] for _, _, c in asked]
        prog = " ".join(asked[0][2][:parser.args_start])
        answer = shared_check(shared, "flags", [asdict(parser), prog, arg_lists], _probe_answer, parser, arg_lists,
                              prog)
        if "unanswered" in answer:
            findings.append(Finding("notice", f"{answer['unanswered']}; server flags were not checked here (they are "
                                    "checked when the server starts on the compute node)"))
            continue
        probe = ProbeResult(**answer)
        if probe.import_error:
            findings.append(Finding("notice", f"{parser.name} is not installed for {parser.python!r} on this host "
                                    f"({probe.import_error}); server flags were not checked here (they are "
                                    "checked when the server starts on the compute node)"))
            continue
        answered = [(item, verdict) for item, verdict in zip(asked, probe.results, strict=True)
                    if item[1].preset in presets]
        if parser.setup == SGLANG_SETUP:  # the stand-in takes the flags of every build it models
            findings += check_build(config, [point for (_, point, _), _ in answered], probe.options)
        ids = {point.point_id for point in points}
        by_problem: dict[tuple[str, str], list[str]] = {}
        for (label, point, _), verdict in answered:
            problems = [f"{parser.name} rejects the server command: {verdict['error']}"] if verdict.get("error") else []
            for flag in flag_tokens(verdict.get("unknown", [])):
                hint = suggest(flag, probe.options)
                problems.append(f"{parser.name} ({parser.python}) does not accept the flag {flag}"
                                + (f"; did you mean {hint}?" if hint else ""))
            for problem in problems:
                by_problem.setdefault((point.preset, problem), []).append(label)
        for (preset, problem), labels in by_problem.items():
            real = tuple(label for label in labels if label in ids)
            findings.append(Finding("error", problem, preset=preset, points=real or tuple(labels)))
    return findings


def _probe_answer(parser: ServerParser, arg_lists: list[list[str]], prog: str) -> dict[str, Any]:
    """probe_arguments with `parser`, as JSON; why it could not ask (`unanswered`), so that the other presets'
    preflights do not wait for a parser that did not answer once."""
    try:
        return asdict(probe_arguments(parser.python, parser.setup, arg_lists, prog=prog))
    except PreflightError as exc:
        return {"unanswered": str(exc)}


def check_build(config: dict, points: list[Point], options: Iterable[str]) -> list[Finding]:
    """Each preset written for a recognisable engine build must match the installed parser's options; an error
    names the installed build and the library presets that fit it."""
    options = set(options)
    builds = library_builds()
    installed = [b for b in builds.values() if b.detectable and b.matches(options)]
    presets = config["engine"]["presets"]
    findings = []
    for name in sorted({p.preset for p in points}):
        build = builds.get(presets[name].get("build") or "")
        if build is None or not build.detectable or build.matches(options):
            continue
        fits = sorted(n for n, preset in presets.items() if preset["kind"] == presets[name]["kind"]
                      and any(preset.get("build") == b.name for b in installed))
        found = (f"the installed server is {installed[0].description} ({installed[0].name})" if installed
                 else "the installed server matches no build of the preset library (config/presets/)")
        advice = (f"; use preset {' or '.join(fits)} (sweep.preset, or the points' preset)" if fits else "")
        findings.append(Finding("error", f"preset {name} is written for {build.description} ({build.name}: "
                                f"{_describe_options(build)}), but {found}{advice}", preset=name,
                                points=tuple(p.point_id for p in points if p.preset == name)))
    return findings


def _describe_options(build: Build) -> str:
    """The options that identify a build, as a phrase."""
    parts = [f"has {', '.join(build.options_present)}"] if build.options_present else []
    parts += [f"lacks {', '.join(build.options_absent)}"] if build.options_absent else []
    return " and ".join(parts)


def _uses(preset: Mapping[str, Any], placeholder: str) -> bool:
    """Whether a preset's arguments or environment use `{placeholder}`."""
    templates = list(preset.get("args", [])) + [a for extra in preset.get("args_if_set", {}).values() for a in extra]
    templates += list(preset.get("env", {}).values())
    return any(f"{{{placeholder}}}" in str(t) for t in templates)


def check_paths(config: dict, points: list[Point]) -> list[Finding]:
    """The model and drafter paths the points use must exist here, unless simulated or only on the compute nodes."""
    if config.get("simulated"):
        return [Finding("notice", "simulated study: model and drafter paths are not checked")]
    if not config.get("resources", {}).get("paths_on_submit_host", True):
        return [Finding("notice", "resources.paths_on_submit_host is false: model and drafter paths exist only "
                        "on the compute nodes and are not checked here")]
    findings = []
    presets = config["engine"]["presets"]
    for key, section, placeholder in (("target.model_path", "target", "model_path"),
                                      ("drafter.model_path", "drafter", "drafter_path")):
        users = sorted({p.preset for p in points if _uses(presets[p.preset], placeholder)})
        path = config[section]["model_path"]
        if not users or Path(os.path.expanduser(path)).exists():
            continue
        if HUB_ID.match(path):
            findings.append(Finding("notice", f"{key} {path!r} is not a path on this host; taken as a model id the "
                                    "server resolves itself (a compute node without network access cannot "
                                    "download it)"))
            continue
        findings.append(Finding("error", f"{key}: {path} does not exist on this host (used by preset(s) "
                                f"{', '.join(users)}); if it exists only on the compute nodes, set "
                                "resources.paths_on_submit_host: false"))
    return findings


def check_host(config: dict) -> list[Finding]:
    """Say so when servers will listen on an address other machines can reach."""
    host = config["engine"]["host"]
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return []
    return [Finding("notice", f"engine.host is {host}: every point's server is reachable from other machines "
                    "while it runs")]


def check_partition(config: dict) -> list[Finding]:
    """The configured Slurm partition must exist, where this host can ask Slurm."""
    partition = config.get("resources", {}).get("partition")
    if not partition or shutil.which("sinfo") is None:
        return []
    try:
        done = subprocess.run(["sinfo", "--noheader", "--format=%R"], capture_output=True, text=True, timeout=30,
                              check=False)
    except subprocess.TimeoutExpired:
        return [Finding("notice", "sinfo did not answer within 30 s; resources.partition was not checked")]
    if done.returncode != 0:
        return [Finding("notice", f"sinfo failed ({done.stderr.strip()}); resources.partition was not checked")]
    known = sorted(set(done.stdout.split()))
    if partition in known:
        return []
    return [Finding("error", f"resources.partition: Slurm has no partition {partition!r}; partitions: "
                    f"{', '.join(known) or 'none'}")]


def run_preflight(config: dict, presets: Iterable[str] | None = None, shared: Path | None = None) -> list[Finding]:
    """All checks of a validated configuration, for every point or only those of the given presets; with `shared`,
    the server's parser and the tokenizer are asked once for all presets' preflights (`shared_check`)."""
    points = expand_points(config)
    if presets is not None:
        wanted = set(presets)
        unknown = sorted(wanted - {p.preset for p in points})
        if unknown:
            raise ConfigError(f"no point of this configuration uses preset(s) {', '.join(unknown)}")
        points = [p for p in points if p.preset in wanted]
    return (check_paths(config, points) + check_host(config) + check_partition(config)
            + check_flags(config, points, shared) + check_matrix(config, shared))


def check_matrix(config: dict, shared: Path | None = None) -> list[Finding]:
    """The benchmark cells no prompt can be sized to with the model's tokenizer: every point records them as
    infeasible and measures the rest (a notice each; a notice when no tokenizer loads here)."""
    cells, source = shared_check(shared, "matrix", [config["target"], config["benchmark"]], matrix_check, config)
    if not cells and source.startswith("benchmark contexts"):
        return [Finding("notice", source)]
    return [Finding("notice", f"benchmark cell not measurable ({source}), recorded as infeasible by every point: "
                    f"{describe_cells([cell])}") for cell in cells]


def store_result(path: str) -> bool:
    """With a study store (DDSWEEP_STORE), copy the written result to it before the job ends, so that every point
    that ran finds its preflight there on a fresh machine (ddsweep.store); False, after saying why, if it cannot."""
    url = os.environ.get(STORE_ENV)
    if not url:
        return True
    unit = Path(os.path.relpath(path)).as_posix()
    try:
        push_file(StudyStore.open(url), Path("."), unit)
    except StoreError as exc:
        print(f"ddsweep preflight: cannot copy {unit} to the study store: {exc}; no point of this preset starts "
              "before it is there", file=sys.stderr)
        return False
    return True


def _run_preflight_command(args: argparse.Namespace) -> int:
    """`ddsweep preflight`: print every finding; exit 1 on any error, 2 on an invalid configuration."""
    try:
        config = config_from_args(args)
        findings = run_preflight(config, args.preset, Path(args.shared) if args.shared else None)
    except ConfigError as exc:
        print(f"ddsweep preflight: {exc}", file=sys.stderr)
        return 2
    for finding in findings:
        print(finding.render(), file=sys.stderr)
    errors = [f for f in findings if f.level == "error"]
    scope = f"preset(s) {', '.join(args.preset)}" if args.preset else "all points"
    record = config["sweep"]["on_preflight_error"] == "record"
    if errors and not (record and args.write):
        print(f"ddsweep preflight: {len(errors)} error(s) in study {config['study']!r} ({scope}); no point was "
              "started", file=sys.stderr)
        if not config.get("simulated"):
            print(f"ddsweep preflight: {DEMO_HINT}", file=sys.stderr)
        return 1
    if args.write:
        write_json_atomic(args.write, {"study": config["study"], "scope": scope, "ok": not errors,
                                       "findings": [asdict(f) for f in findings]})
        if not store_result(args.write):
            return 1
    if errors:
        print(f"ddsweep preflight: {len(errors)} error(s) in study {config['study']!r} ({scope}); "
              "sweep.on_preflight_error is record: its points are recorded as failed (error kind preflight) "
              f"without a server start, from {args.write}", file=sys.stderr)
        return 0
    print(f"preflight OK: study {config['study']!r}, {scope}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `preflight` subcommand."""
    text = "check a study before any GPU job: configuration, model paths, partition, every server flag"
    parser = subparsers.add_parser("preflight", help=text, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", "-c", nargs="+", default=["config/config.yaml"],
                        help="configuration file(s); later files update earlier ones")
    source.add_argument("--config-json", help="the configuration as one JSON document (used by the workflow)")
    parser.add_argument("--preset", action="append", help="check only the points of this preset (repeatable)")
    parser.add_argument("--write", metavar="FILE",
                        help="on success (or on errors under sweep.on_preflight_error: record), write the findings "
                             "as JSON to FILE")
    parser.add_argument("--shared", metavar="DIR",
                        help="ask the server's parser about every preset's commands and load the tokenizer once for "
                             "all presets' preflights that give the same DIR within 10 minutes (used by the workflow)")
    parser.set_defaults(func=_run_preflight_command)
