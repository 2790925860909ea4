"""`ddsweep sim-server`: a stand-in SGLang server for tests and demos (every output is labelled simulated).

It accepts the same command-line flags as `python -m sglang.launch_server` (unknown ones are echoed into
`server_args`), plus `--sim-*` flags for its timing model, seed and fault injection.
"""

from __future__ import annotations

import argparse
import math
import os
import random
from typing import Any

from ddsweep.config.knobs import KNOBS
from ddsweep.sim.model import Knobs, ModelParams, stable_hash
from ddsweep.sim.server import FAULT_KINDS, Fault, SimSettings, log, run

DEFAULT_BUDGET = 16
DEFAULT_TOPK = 8


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `sim-server` subcommand."""
    parser = subparsers.add_parser("sim-server", help="run the stand-in SGLang server (simulated)",
                                   add_help=False, prefix_chars="\0")
    parser.add_argument("sim_argv", nargs=argparse.REMAINDER, help="SGLang and --sim-* flags (see --help)")
    parser.set_defaults(func=main)


def build_parser() -> argparse.ArgumentParser:
    """The full flag parser of the stand-in (used on the arguments after `sim-server`)."""
    parser = argparse.ArgumentParser(prog="ddsweep sim-server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare SGLang's own flags that the stand-in understands, and the `--sim-*` flags."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model-path", "--model", dest="model_path", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--speculative-algorithm", choices=["DDTREE", "DFLASH"], type=str.upper, default=None)
    parser.add_argument("--speculative-draft-model-path", default=None)
    parser.add_argument("--speculative-dflash-block-size", "--speculative-num-draft-tokens",
                        dest="block_size", type=int, default=None)
    parser.add_argument("--speculative-ddtree-budget", dest="budget", type=int, default=None)
    parser.add_argument("--speculative-draft-window-size", "--speculative-dflash-draft-window-size",
                        dest="window", type=int, default=None)
    sim = parser.add_argument_group("stand-in only")
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
    sim.add_argument("--sim-launch-seed", type=int, default=None,
                     help="seed of the launch's draw (default: a fresh random seed per launch, logged)")
    sim.add_argument("--sim-fault", action="append", default=[], metavar="KIND[:ARG]",
                     help=f"inject a fault (repeatable): {', '.join(FAULT_KINDS)}")


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


def build_settings(args: argparse.Namespace, unknown: dict[str, Any], env: dict[str, str]) -> SimSettings:
    """Resolve the knobs the stand-in applies (honouring ignore-knob faults) and the echoed server_args."""
    faults = parse_faults(args.sim_fault)
    ignored = {f.arg for f in faults if f.kind == "ignore-knob"}
    algo = args.speculative_algorithm
    kind = {"DDTREE": "ddtree", "DFLASH": "dflash"}.get(algo or "", "ar")
    block = args.block_size if args.block_size and "block_size" not in ignored else args.sim_trained_block_size
    window = args.window if "window" not in ignored else None
    budget = args.budget if args.budget and "budget" not in ignored else DEFAULT_BUDGET
    env_topk = env.get("SGLANG_DDTREE_MAX_TOPK")
    topk = int(env_topk) if env_topk and "topk" not in ignored else DEFAULT_TOPK
    if kind == "ar":
        knobs = Knobs("ar", None, None, None, None)
    elif kind == "dflash":
        knobs = Knobs("dflash", None, None, block, window)
    else:
        knobs = Knobs("ddtree", budget, topk, block, window)
    if knobs.window is not None and knobs.block_size and knobs.window < knobs.block_size:
        raise ValueError(f"draft window size {knobs.window} must be >= block size {knobs.block_size}")
    step_ms = args.sim_step_ms * launch_factor(args.sim_launch_noise, args.sim_launch_seed)
    params = ModelParams(step_ms=step_ms, token_cost=args.sim_token_cost, draft_frac=args.sim_draft_frac,
                         draft_batch_frac=args.sim_draft_batch_frac, prefill_ms_per_1k=args.sim_prefill_ms_per_1k,
                         trained_block_size=args.sim_trained_block_size, trained_window=args.sim_trained_window,
                         accept_fixed=args.sim_accept_fixed)
    served = args.served_model_name or args.model_path
    server_args: dict[str, Any] = {
        "model_path": args.model_path, "served_model_name": served, "host": args.host, "port": args.port,
        "speculative_algorithm": algo,
        "speculative_draft_model_path": args.speculative_draft_model_path,
        "speculative_num_draft_tokens": knobs.block_size,
        "speculative_dflash_block_size": knobs.block_size,
        "speculative_ddtree_budget": knobs.budget,
        "speculative_draft_window_size": knobs.window,
        "speculative_dflash_draft_window_size": knobs.window,
        "random_seed": args.sim_seed,
    }
    server_args.update({k: v for k, v in unknown.items() if k not in server_args})
    return SimSettings(host=args.host, port=args.port, model_path=args.model_path, served_model_name=served,
                       knobs=knobs, params=params, seed=args.sim_seed, startup_delay_s=args.sim_startup_delay,
                       faults=faults, server_args=server_args)


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
    if knobs.kind == "ddtree":
        return (f"DDTree config: budget={knobs.budget} max_topk={knobs.topk} block_size={knobs.block_size} "
                f"draft_window_size={knobs.window} compact_cache={compact} [simulated]")
    if knobs.kind == "dflash":
        return (f"DFlash config: block_size={knobs.block_size} draft_window_size={knobs.window} "
                f"compact_cache={compact} [simulated]")
    return "Speculative decoding disabled: autoregressive decoding [simulated]"


def main(args: argparse.Namespace) -> int:
    """Entry point of `ddsweep sim-server`: parse SGLang-style flags, log like SGLang, serve."""
    known, rest = build_parser().parse_known_args(args.sim_argv)
    try:
        settings = build_settings(known, parse_unknown(rest), dict(os.environ))
    except ValueError as exc:
        log(f"ValueError: {exc} [simulated]")
        return 2
    fields = ", ".join(f"{k}={v!r}" for k, v in settings.server_args.items())
    log(f"server_args=ServerArgs({fields}) [simulated]")
    log(config_line(settings.knobs))
    return run(settings)
