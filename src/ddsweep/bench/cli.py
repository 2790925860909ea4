"""`ddsweep bench`: the benchmark matrix against any running SGLang server, from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

from ddsweep import storage
from ddsweep.bench.cells import BenchmarkError, BenchSettings, run_benchmark_async, run_coroutine
from ddsweep.bench.hangs import ServerHang
from ddsweep.bench.transport import HTTP_CLIENTS
from ddsweep.config.defaults import schema_default
from ddsweep.console import ProgressLine


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _workload(text: str) -> dict:
    """A workload entry from `KIND[:PATH][+eos]` (for example `prose+eos` or `jsonl:traffic.jsonl`)."""
    ignore_eos = text.endswith("+eos")
    kind, _, path = text.removesuffix("+eos").partition(":")
    return {"name": kind + ("-eos" if ignore_eos else ""), "kind": kind, "path": path or None, "ignore_eos": ignore_eos}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bench` subcommand."""
    parser = subparsers.add_parser(
        "bench", help="benchmark a running SGLang server (native streaming /generate)",
        description="Benchmark a running server. --out is the cells JSON; the per-request records go next to it "
                    "as <stem>.requests.jsonl.")
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--out", required=True, type=Path, help="cells JSON file to write")
    parser.add_argument("--contexts", type=_ints, default=[128, 4096], help="prompt lengths in tokens")
    parser.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 32], help="closed-loop concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=BenchSettings.max_new_tokens)
    parser.add_argument("--requests", type=int,
                        default=BenchSettings.requests_per_cell, help="measured requests per cell (default 4*C, >= 8)")
    parser.add_argument("--workload", action="append", type=_workload, dest="workloads", metavar="KIND[:PATH]",
                        help="coding (default), prose or jsonl:FILE; repeat for several; add +eos to ignore_eos")
    parser.add_argument("--repeats", type=int, default=BenchSettings.repeats)
    parser.add_argument("--warmup", type=int,
                        default=BenchSettings.warmup_requests, help="warmup requests per (context, concurrency)")
    parser.add_argument("--seed", type=int, default=BenchSettings.seed)
    parser.add_argument("--request-rate", type=float,
                        default=BenchSettings.request_rate, help="Poisson arrivals (requests/s)")
    parser.add_argument("--timeout", type=float,
                        default=BenchSettings.request_timeout_s, help="per-request timeout in seconds")
    parser.add_argument("--stall-timeout", type=float, default=BenchSettings.stall_timeout_s,
                        help="seconds without a token before a one-token probe; no answer stops the run as a hang "
                             "(default: a tenth of --timeout)")
    parser.add_argument("--max-failure-fraction", type=float, default=BenchSettings.max_failure_fraction)
    parser.add_argument("--min-window-s", type=float, default=schema_default("benchmark.min_window_s"),
                        help="least steady-state seconds per cell (0: exactly --requests requests)")
    parser.add_argument("--warmup-window-s", type=float, default=schema_default("benchmark.warmup_window_s"),
                        help="least seconds of settled throughput per warm-up (0: exactly --warmup requests)")
    parser.add_argument("--max-window-s", type=float, default=BenchSettings.max_window_s,
                        help="cap of a cell's window; an unsettled cell is then recorded as unstable")
    parser.add_argument("--http-client", choices=HTTP_CLIENTS, default=BenchSettings.http_client)
    parser.set_defaults(func=main)


def detect_simulated(url: str) -> bool:
    """Whether the server at `url` is the stand-in (top-level "simulated": true in /get_server_info)."""
    try:
        return bool(httpx.get(url.rstrip("/") + "/get_server_info", timeout=30.0).json().get("simulated", False))
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def format_table(doc: dict) -> str:
    """A short text table of the groups in a cells.json document."""
    lines = [f"{'workload':>10} {'context':>8} {'conc':>5} {'tok/s':>10} {'steady tok/s':>13} {'decode tok/s':>13} "
             f"{'ttft p50 s':>11} {'accept':>7}"]
    for g in doc["groups"]:
        def med(key: str, g: dict = g) -> str:
            value = g[key]["median"]
            return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"
        lines.append(f"{g['workload']:>10} {g['context']:>8} {g['concurrency']:>5} "
                     f"{med('output_throughput_tok_s'):>10} {med('steady_output_throughput_tok_s'):>13} "
                     f"{med('decode_tok_s'):>13} {med('ttft_p50_s'):>11} {med('acceptance_length'):>7}")
    if doc.get("simulated"):
        lines.append("(simulated: measured against the stand-in server)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Entry point of `ddsweep bench`."""
    settings = BenchSettings(contexts=args.contexts, concurrency=args.concurrency, max_new_tokens=args.max_tokens,
                             requests_per_cell=args.requests, repeats=args.repeats, warmup_requests=args.warmup,
                             max_failure_fraction=args.max_failure_fraction, request_timeout_s=args.timeout,
                             stall_timeout_s=args.stall_timeout,
                             seed=args.seed, request_rate=args.request_rate, http_client=args.http_client,
                             min_window_s=args.min_window_s, warmup_window_s=args.warmup_window_s,
                             max_window_s=args.max_window_s,
                             **({"workloads": args.workloads} if args.workloads else {}))
    out: Path = args.out
    requests_path = out.parent / f"{out.stem}.requests.jsonl"
    simulated = detect_simulated(args.url)

    progress = ProgressLine()
    try:
        doc = run_coroutine(run_benchmark_async(args.url, requests_path, out, settings, simulated, progress))
    except (BenchmarkError, ServerHang, httpx.HTTPError, OSError) as exc:
        progress.close()
        what = str(exc) if isinstance(exc, (BenchmarkError, ServerHang)) else f"{type(exc).__name__}: {exc}"
        print(f"ddsweep bench: the benchmark against {args.url} failed: {what}", file=sys.stderr)
        if out.exists():  # the cells finished before the failure
            print(format_table(storage.read_json(out)))
            print(f"(cells finished before the failure: {out}; requests: {requests_path})", file=sys.stderr)
        return 1
    progress.close()
    print(format_table(doc))
    for cell in doc.get("failed_cells") or []:
        print(f"failed cell (left out of the figures): {cell['failure_reason']}", file=sys.stderr)
    return 0
