"""Measure the benchmark client (`ddsweep.loadgen`) against the stand-in server's own ground truth.

Starts `ddsweep sim-server` in a separate process with a fixed rate (exactly 4 tokens per 10 ms verify step,
whatever the batch size), runs `run_benchmark` at several concurrency levels with each HTTP client, and prints
the client's relative error against the server-side timestamps from GET /sim/stats for aggregate output
throughput, median per-request decode speed and acceptance length, plus client CPU seconds per request.

Usage: python benchmarks/bench_client.py [--levels 1,16,64,256] [--clients httpx,aiohttp] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from ddsweep import metrics
from ddsweep.loadgen import BenchSettings, run_benchmark


def free_port() -> int:
    """An unused TCP port on localhost."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    """Start the stand-in at 4 tokens per 10 ms step and wait until it is healthy."""
    cmd = [sys.executable, "-m", "ddsweep", "sim-server", "--model-path", "sim/model", "--port", str(port),
           "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8", "--sim-step-ms", "10",
           "--sim-token-cost", "0", "--sim-draft-frac", "0", "--sim-draft-batch-frac", "0",
           "--sim-prefill-ms-per-1k", "0", "--sim-accept-fixed", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("stand-in did not become healthy")


def server_truth(url: str) -> dict:
    """Throughput, median decode speed and acceptance computed from the server's per-request timestamps."""
    rows = [r for r in httpx.get(url + "/sim/stats", timeout=30).json()["requests"] if r["finished"]]
    tokens = sum(r["completion_tokens"] for r in rows)
    wall = max(r["last_token_ts"] for r in rows) - min(r["arrival_ts"] for r in rows)
    decode = [(r["completion_tokens"] - 1) / (r["last_token_ts"] - r["first_token_ts"]) for r in rows]
    return {"throughput": tokens / wall, "decode": metrics.median(decode),
            "acceptance": tokens / sum(r["spec_verify_ct"] for r in rows), "requests": len(rows)}


def measure(url: str, client: str, level: int, max_tokens: int) -> dict:
    """One run at one concurrency level; returns client figures, server truth and client CPU per request."""
    httpx.post(url + "/sim/reset", timeout=30)
    n = max(2 * level, 16)
    settings = BenchSettings(contexts=[128], concurrency=[level], max_new_tokens=max_tokens, requests_per_cell=n,
                             repeats=1, warmup_requests=0, http_client=client)
    before = resource.getrusage(resource.RUSAGE_SELF)
    with tempfile.TemporaryDirectory() as tmp:
        doc = run_benchmark(url, Path(tmp), settings, simulated=True)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cell = doc["cells"][0]
    return {"client": {"throughput": cell["output_throughput_tok_s"], "decode": cell["decode_tok_s"]["median"],
                       "acceptance": cell["acceptance_length"]},
            "truth": server_truth(url), "cpu_per_request": cpu / n, "failed": cell["failed"], "requests": n}


def main() -> int:
    """Run the matrix and print one line per (client, level)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,16,64,256")
    parser.add_argument("--clients", default="httpx,aiohttp")
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    port = free_port()
    proc = start_server(port)
    url = f"http://127.0.0.1:{port}"
    print(f"stand-in: 4 tokens per 10 ms step (400 tok/s per request), max_tokens={args.max_tokens}")
    print(f"{'client':>8} {'C':>4} {'reqs':>5} {'tput client':>12} {'tput server':>12} {'err %':>7} "
          f"{'decode cl':>10} {'decode srv':>10} {'err %':>7} {'accept cl/srv':>14} {'cpu s/req':>10} {'failed':>6}")
    try:
        for client in args.clients.split(","):
            for level in (int(x) for x in args.levels.split(",")):
                r = measure(url, client, level, args.max_tokens)
                c, t = r["client"], r["truth"]
                print(f"{client:>8} {level:>4} {r['requests']:>5} {c['throughput']:>12.1f} {t['throughput']:>12.1f} "
                      f"{100 * (c['throughput'] / t['throughput'] - 1):>+7.2f} {c['decode']:>10.1f} "
                      f"{t['decode']:>10.1f} {100 * (c['decode'] / t['decode'] - 1):>+7.2f} "
                      f"{c['acceptance']:>6.3f}/{t['acceptance']:<7.3f} {r['cpu_per_request']:>10.4f} "
                      f"{r['failed']:>6}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
