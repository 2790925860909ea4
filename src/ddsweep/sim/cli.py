"""`ddsweep sim-server`: a stand-in SGLang server for tests and demos (every output is labelled simulated).

Strict (when the sglang package imports, see ddsweep.sim.contract): it parses the command line with SGLang's
own parser plus PR #29907's `--speculative-ddtree-budget`, so an unknown or malformed flag fails as it does on
SGLang. Lenient otherwise: it declares the flags it uses and echoes unknown ones into the server arguments.
Both add `--sim-*` flags for its timing model, seed, fault injection and strictness.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ddsweep.config.knobs import KNOBS
from ddsweep.sim import contract as sglang_contract
from ddsweep.sim.model import Knobs, ModelParams, stable_hash, verify_slots
from ddsweep.sim.records import Fault, SimSettings
from ddsweep.sim.server import FAULT_KINDS, log, run

DEFAULT_BUDGET = 16
DEFAULT_TOPK = 8
SPEC_MAX_RUNNING = 48  # SGLang's max_running_requests for DFLASH when unset (arg_groups/speculative_hook.py)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `sim-server` subcommand."""
    parser = subparsers.add_parser("sim-server", help="run the stand-in SGLang server (simulated)",
                                   add_help=False, prefix_chars="\0")
    parser.add_argument("sim_argv", nargs=argparse.REMAINDER, help="SGLang and --sim-* flags (see --help)")
    parser.set_defaults(func=main)


def build_parser(contract: sglang_contract.Contract | None = None) -> argparse.ArgumentParser:
    """The full flag parser of the stand-in (used on the arguments after `sim-server`): SGLang's own when strict."""
    parser = argparse.ArgumentParser(prog="ddsweep sim-server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if contract is not None and contract.strict:
        sglang_contract.add_server_args(parser, contract)
        add_sim_arguments(parser)
    else:
        add_arguments(parser)
    return parser


def strict_mode(argv: list[str]) -> str:
    """The value of --sim-strict in `argv` (auto when absent), read before the parser is built."""
    for i, token in enumerate(argv):
        if token == "--sim-strict" and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith("--sim-strict="):
            return token.split("=", 1)[1]
    return "auto"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The lenient stand-in's flags (what `ddsweep preflight` checks a stand-in command line against)."""
    add_lenient_server_arguments(parser)
    add_sim_arguments(parser)


def add_lenient_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare SGLang's own flags that the lenient stand-in understands (dests as in SGLang's ServerArgs)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model-path", "--model", dest="model_path", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--speculative-algorithm", choices=["DDTREE", "DFLASH", "STANDALONE", "NGRAM"],
                        type=str.upper, default=None)
    parser.add_argument("--speculative-draft-model-path", default=None)
    parser.add_argument("--speculative-dflash-block-size", type=int, default=None)
    parser.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    parser.add_argument("--speculative-num-steps", type=int, default=None)  # STANDALONE (EAGLE's tree search)
    parser.add_argument("--speculative-eagle-topk", type=int, default=None)
    parser.add_argument("--speculative-ngram-max-bfs-breadth", type=int, default=10)
    parser.add_argument("--speculative-ddtree-budget", type=int, default=None)
    parser.add_argument("--speculative-ddtree-block-size", type=int, default=None)  # the ddtree-v2 build
    parser.add_argument("--speculative-draft-window-size", type=int, default=None)
    parser.add_argument("--disable-overlap-schedule", action="store_true")  # DDTree's scheduling, for DFLASH too
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--context-length", type=int, default=None)


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """The stand-in's own `--sim-*` flags."""
    sim = parser.add_argument_group("stand-in only")
    sim.add_argument("--sim-strict", choices=["auto", "on", "off"], default="auto",
                     help="validate with SGLang's own parser and request classes: auto = when sglang imports")
    sim.add_argument("--sim-startup-delay", type=float, default=0.0, help="seconds /health answers 503")
    sim.add_argument("--sim-seed", type=int, default=0)
    sim.add_argument("--sim-trained-block-size", type=int, default=8)
    sim.add_argument("--sim-trained-window", type=int, default=2048)
    sim.add_argument("--sim-step-ms", type=float, default=ModelParams.step_ms,
                     help="decode step time at batch 1 without speculation")
    sim.add_argument("--sim-token-cost", type=float, default=ModelParams.token_cost,
                     help="extra step time per additional verified token in the batch, as a fraction of step-ms")
    sim.add_argument("--sim-draft-frac", type=float, default=ModelParams.draft_frac,
                     help="drafting time per step at batch 1, as a fraction of step-ms")
    sim.add_argument("--sim-draft-batch-frac", type=float, default=ModelParams.draft_batch_frac,
                     help="extra drafting time per additional request, as a fraction of step-ms")
    sim.add_argument("--sim-prefill-ms-per-1k", type=float, default=ModelParams.prefill_ms_per_1k)
    sim.add_argument("--sim-accept-fixed", type=int, default=None,
                     help="every verify step accepts exactly this many tokens (for measuring clients)")
    sim.add_argument("--sim-launch-noise", type=float, default=0.0, metavar="CV",
                     help="variation between launches: every step time is scaled by exp(N(0, CV)), drawn once "
                          "per launch (the variation a fresh server start brings on real hardware)")
    sim.add_argument("--sim-drift", type=float, default=ModelParams.drift, metavar="FRACTION",
                     help="GPU-like drift: under sustained load every step slows down by up to FRACTION, with time "
                          "constant --sim-drift-s of load, and recovers as fast while idle (as a GPU's clocks fall "
                          "as it heats): cells early in a launch do not settle until they have run several time "
                          "constants")
    sim.add_argument("--sim-drift-s", type=float, default=ModelParams.drift_s, metavar="SECONDS",
                     help="time constant of --sim-drift")
    sim.add_argument("--sim-launch-seed", type=int, default=None,
                     help="seed of the launch's draw (default: a fresh random seed per launch, logged)")
    sim.add_argument("--sim-prompt-log", default=None, metavar="PATH",
                     help="append every /generate prompt as the model received it to this JSONL file (tests)")
    sim.add_argument("--sim-fault", action="append", default=[], metavar="KIND[:ARG]",
                     help=f"inject a fault (repeatable): {', '.join(FAULT_KINDS)}")
    sim.add_argument("--sim-state-dir", default=None, metavar="DIR",
                     help="where faults that span launches (never-healthy-first:N) count this configuration's launches")


def parse_faults(specs: list[str]) -> list[Fault]:
    """Parse `KIND[:ARG]` fault specifications, rejecting unknown kinds and knob names."""
    faults = []
    for spec in specs:
        kind, _, arg = spec.partition(":")
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown --sim-fault kind {kind!r}; choose from {', '.join(FAULT_KINDS)}")
        if kind == "ignore-knob" and arg not in KNOBS:
            raise ValueError(f"--sim-fault ignore-knob needs one of {', '.join(KNOBS)}, got {arg!r}")
        faults.append(Fault(kind, arg or None))
    return faults


def parse_unknown(tokens: list[str]) -> dict[str, Any]:
    """Turn unrecognised `--flag value` pairs and bare `--flag`s into server_args entries."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            continue
        key, eq, value = token[2:].partition("=")
        if not eq:
            if i < len(tokens) and not tokens[i].startswith("--"):
                value = tokens[i]
                i += 1
            else:
                out[key.replace("-", "_")] = True
                continue
        out[key.replace("-", "_")] = _scalar(value)
    return out


def _scalar(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def resolve_args(args: argparse.Namespace, unknown: dict[str, Any]) -> dict[str, Any]:
    """The server arguments after the resolutions SGLang 0.5.23 makes for the knobs the stand-in models.

    `_handle_dflash` (arg_groups/speculative_hook.py) sets `speculative_num_draft_tokens` from
    `--speculative-dflash-block-size` and rejects the two when they differ, or a draft window below the block
    size, and sets `max_running_requests` to 48 when unset; `_handle_eagle_family` sets it to
    `speculative_num_steps + 1` at top-k 1 (a chain); `served_model_name` defaults to the model path."""
    resolved = {k: v for k, v in vars(args).items() if not k.startswith("sim_")}
    for key, value in unknown.items():
        resolved.setdefault(key, value)
    algo = resolved.get("speculative_algorithm")
    resolved["speculative_algorithm"] = algo.upper() if isinstance(algo, str) else algo
    resolved["served_model_name"] = resolved.get("served_model_name") or resolved["model_path"]
    block, tokens = resolved.get("speculative_dflash_block_size"), resolved.get("speculative_num_draft_tokens")
    algo = resolved["speculative_algorithm"]
    if algo == "DDTREE" and resolved.get("speculative_ddtree_block_size") is not None:
        # the ddtree-v2 build: its own block-size flag wins, and DFLASH's is cleared (speculative_hook.py)
        block, tokens = resolved["speculative_ddtree_block_size"], None
        resolved["speculative_dflash_block_size"] = None
    if algo in ("STANDALONE", "NGRAM"):
        if algo == "NGRAM":  # _handle_ngram: top-k is the BFS breadth, 12 draft tokens when unset
            resolved["speculative_eagle_topk"] = resolved.get("speculative_ngram_max_bfs_breadth")
            resolved["speculative_num_draft_tokens"] = tokens or 12
        steps = resolved.get("speculative_num_steps")
        if algo == "STANDALONE" and resolved.get("speculative_eagle_topk") == 1 and steps is not None \
                and tokens != steps + 1:
            log("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                "speculative_eagle_topk == 1 [simulated]")
            resolved["speculative_num_draft_tokens"] = steps + 1
        _spec_admission(resolved)
    if algo in ("DFLASH", "DDTREE"):
        if block is not None and tokens is not None and int(block) != int(tokens):
            raise ValueError("Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but "
                             f"they differ. speculative_num_draft_tokens={tokens}, "
                             f"speculative_dflash_block_size={block}.")
        resolved["speculative_num_draft_tokens"] = block if block is not None else tokens
        _spec_admission(resolved)
    return resolved


def _spec_admission(resolved: dict[str, Any]) -> None:
    """SGLang's 48 running requests for speculative decoding when --max-running-requests is unset."""
    if resolved.get("max_running_requests") is None:
        log("Max running requests is reset to 48 for speculative decoding. You can override this by "
            "explicitly setting --max-running-requests. [simulated]")
        resolved["max_running_requests"] = SPEC_MAX_RUNNING


def build_settings(args: argparse.Namespace, unknown: dict[str, Any], env: dict[str, str],
                   strict: bool = False) -> SimSettings:
    """Resolve the knobs the stand-in applies (honouring ignore-knob faults) and the reported server arguments."""
    faults = parse_faults(args.sim_fault)
    ignored = {f.arg for f in faults if f.kind == "ignore-knob"}
    resolved = resolve_args(args, unknown)
    algo = resolved["speculative_algorithm"]
    kind = {"DDTREE": "ddtree", "DFLASH": "dflash", "STANDALONE": "ddtree", "NGRAM": "dflash"}.get(algo or "", "ar")
    asked_block = resolved.get("speculative_num_draft_tokens")
    block = asked_block if asked_block and "block_size" not in ignored else args.sim_trained_block_size
    window = resolved.get("speculative_draft_window_size") if "window" not in ignored else None
    asked_budget = resolved.get("speculative_ddtree_budget")
    budget = asked_budget if asked_budget and "budget" not in ignored else DEFAULT_BUDGET
    env_topk = env.get("SGLANG_DDTREE_MAX_TOPK")
    topk = int(env_topk) if env_topk and "topk" not in ignored else DEFAULT_TOPK
    if kind == "ar":
        knobs = Knobs("ar", None, None, None, None)
    elif algo == "STANDALONE":  # a tree of num_steps depths, eagle_topk wide, num_draft_tokens - 1 nodes
        steps, tokens = resolved.get("speculative_num_steps") or 3, resolved.get("speculative_num_draft_tokens")
        knobs = Knobs("ddtree", (tokens or steps + 1) - 1, resolved.get("speculative_eagle_topk") or 1, steps + 1,
                      None, algo)
    elif kind == "dflash":
        knobs = Knobs("dflash", None, None, block, window if algo == "DFLASH" else None, algo)
    else:
        knobs = Knobs("ddtree", budget, topk, block, window, algo)
    if knobs.window is not None and knobs.block_size and knobs.window < knobs.block_size:
        raise ValueError(f"--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). "
                         f"window_size={knobs.window}, block_size={knobs.block_size}.")
    step_ms = args.sim_step_ms * launch_factor(args.sim_launch_noise, args.sim_launch_seed)
    params = ModelParams(step_ms=step_ms, token_cost=args.sim_token_cost, draft_frac=args.sim_draft_frac,
                         draft_batch_frac=args.sim_draft_batch_frac, prefill_ms_per_1k=args.sim_prefill_ms_per_1k,
                         trained_block_size=args.sim_trained_block_size, trained_window=args.sim_trained_window,
                         accept_fixed=args.sim_accept_fixed, drift=args.sim_drift, drift_s=args.sim_drift_s)
    # What the stand-in really applies (an ignore-knob fault shows here, as a server ignoring a flag would).
    if algo in (None, "DFLASH", "DDTREE"):
        v2 = resolved.get("speculative_ddtree_block_size") is not None
        resolved.update({"speculative_num_draft_tokens": knobs.block_size,
                         "speculative_dflash_block_size": None if v2 else knobs.block_size,
                         "speculative_ddtree_budget": knobs.budget,
                         "speculative_draft_window_size": knobs.window})
        if v2:
            resolved["speculative_ddtree_block_size"] = knobs.block_size
    if resolved.get("random_seed") is None:
        resolved["random_seed"] = args.sim_seed
    return SimSettings(host=resolved["host"], port=resolved["port"], model_path=resolved["model_path"],
                       served_model_name=resolved["served_model_name"], knobs=knobs, params=params,
                       seed=args.sim_seed, startup_delay_s=args.sim_startup_delay, faults=faults,
                       server_args=resolved, strict=strict, prompt_log=args.sim_prompt_log)


def launch_factor(cv: float, seed: int | None) -> float:
    """This launch's step-time factor exp(N(0, cv)); a seed of None draws a fresh one (logged) per launch."""
    if cv <= 0:
        return 1.0
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    factor = math.exp(random.Random(stable_hash("launch", seed)).gauss(0.0, cv))
    log(f"launch noise: seed {seed}, step-time factor {factor:.4f} [simulated]")
    return factor


def config_line(knobs: Knobs) -> str:
    """The log line that states the applied speculative configuration, as SGLang prints it."""
    compact = knobs.window is not None
    if knobs.algorithm in ("STANDALONE", "NGRAM"):
        return f"{knobs.algorithm} config: verify width {verify_slots(knobs)} [simulated]"
    if knobs.kind == "ddtree":
        return (f"DDTree config: budget={knobs.budget} max_topk={knobs.topk} block_size={knobs.block_size} "
                f"draft_window_size={knobs.window} compact_cache={compact} [simulated]")
    if knobs.kind == "dflash":
        return (f"DFlash config: block_size={knobs.block_size} draft_window_size={knobs.window} "
                f"compact_cache={compact} [simulated]")
    return "Speculative decoding disabled: autoregressive decoding [simulated]"


def main(args: argparse.Namespace) -> int:
    """Entry point of `ddsweep sim-server`: parse SGLang-style flags, log like SGLang, serve."""
    argv = list(args.sim_argv)
    try:
        contract = sglang_contract.load(strict_mode(argv))
    except RuntimeError as exc:
        log(f"RuntimeError: {exc} [simulated]")
        return 2
    parser = build_parser(contract)
    if contract.strict:
        known, unknown = parser.parse_args(argv), {}
    else:
        known, rest = parser.parse_known_args(argv)
        unknown = parse_unknown(rest)
    try:
        settings = build_settings(known, unknown, dict(os.environ), strict=contract.strict)
    except ValueError as exc:
        log(f"ValueError: {exc} [simulated]")
        return 2
    settings.contract = contract
    if settings.fault("refuse-flags"):
        # what SGLang's argument parser prints for a flag its build does not know, with its exit code
        log("launch_server.py: error: unrecognized arguments: "
            f"{settings.fault('refuse-flags').arg or '--speculative-ddtree-budget'} [simulated fault refuse-flags]")
        return 2
    flaky = settings.fault("never-healthy-first")
    if flaky:
        launch = count_launch(known.sim_state_dir, settings)
        if launch <= int(flaky.arg or 1):
            log(f"launch {launch} of this configuration never becomes healthy [simulated fault never-healthy-first]")
            settings.faults.append(Fault("never-healthy"))
    settings.launch_command = " ".join(argv)  # SGLang records its argv joined by spaces
    log(f"Stand-in contract: {contract.label()} [simulated]")
    fields = ", ".join(f"{k}={v!r}" for k, v in settings.server_args.items() if v is not None)
    log(f"server_args=ServerArgs({fields}) [simulated]")
    log(config_line(settings.knobs))
    knobs = settings.knobs
    if knobs.algorithm == "DDTREE" and settings.server_args.get("speculative_ddtree_block_size") is not None:
        log(f"Initialized DDTREE v2 worker. block_size={knobs.block_size}, tree_budget={knobs.budget}, "
            f"max_tree_nodes={int(knobs.budget or 0) + 1}, prune=False, tree_attention=False, cpu_build=False, "
            f"cpu_follow=False, graph_buckets=[{int(knobs.budget or 0) + 1}] [simulated]")
    elif knobs.algorithm == "DDTREE":
        log(f"Initialized DDTree worker. block_size={knobs.block_size}, tree_budget={knobs.budget}, "
            f"max_tree_nodes={int(knobs.budget or 0) + 1} [simulated]")
    group = settings.server_args
    nnodes, rank = int(group.get("nnodes") or 1), int(group.get("node_rank") or 0)
    if nnodes > 1:
        try:
            members = join_group(str(group.get("dist_init_addr") or ""), nnodes, rank)
        except (OSError, ValueError) as exc:
            log(f"RuntimeError: node {rank} of {nnodes} could not join the group: {exc} [simulated]")
            return 1
        if rank > 0:
            return 0
        try:
            return run(settings)
        finally:
            for member in members:
                member.close()
    return run(settings)


def count_launch(state_dir: str | None, settings: SimSettings) -> int:
    """This launch's number (1, 2, ...) among the launches of the same configuration (model and applied knobs),
    counted in a file under `state_dir`, which a fault spanning launches needs."""
    if not state_dir:
        raise SystemExit("--sim-fault never-healthy-first needs --sim-state-dir")
    key = hashlib.sha256(f"{settings.model_path}|{settings.knobs}".encode()).hexdigest()[:16]
    path = Path(state_dir) / f"launches-{key}.count"
    path.parent.mkdir(parents=True, exist_ok=True)
    count = int(path.read_text() or 0) + 1 if path.exists() else 1
    path.write_text(str(count))
    return count


def join_group(address: str, nnodes: int, rank: int, timeout_s: float = 120.0) -> list[socket.socket]:
    """Multi-node start-up as the stand-in of SGLang's: rank 0 listens on --dist-init-addr and waits for the other
    ranks before it serves; a rank above 0 connects, then stays until rank 0 closes the connection or SIGTERM."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--dist-init-addr must be HOST:PORT, got {address!r}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        listener = socket.create_server(("", int(port)), reuse_port=False)
        listener.settimeout(timeout_s)
        members = []
        with listener:
            while len(members) < nnodes - 1:
                member, _ = listener.accept()
                members.append(member)
                log(f"node rank {member.recv(16).decode().strip() or '?'} joined ({len(members) + 1} of {nnodes}) "
                    "[simulated]")
        return members
    while True:
        try:
            member = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    member.sendall(f"{rank}\n".encode())
    member.settimeout(None)
    log(f"node rank {rank} of {nnodes} joined {address} [simulated]")
    member.recv(1)  # returns when rank 0 closes the connection (or exits)
    log(f"node rank {rank}: rank 0 is gone; shutting down [simulated]")
    return [member]
