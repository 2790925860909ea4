"""Measure the benchmark client (`ddsweep.bench`) against the stand-in server's own ground truth.

Starts `ddsweep sim-server` in a separate process with a fixed rate (exactly 4 tokens per 10 ms verify step,
whatever the batch size), runs `run_benchmark` at several concurrency levels with each HTTP client, and prints
the client's relative error against the server-side timestamps from GET /sim/stats for aggregate output
throughput, median per-request decode speed and acceptance length, plus CPU seconds per request of the client thread
that runs the event loop.

Both throughputs are tokens / (last token − first request start) over the same requests (every request since
/sim/reset; the run has no warmup): on the server from its arrival and last-token timestamps, on the client the
cell's `output_throughput_tok_s`, from the first request written to the socket to the last [DONE] received.
`lead ms` (server's first arrival − client's first send) and `lag ms` (client's last [DONE] − server's last
token) are the two ends of that window where the client can differ; their sum over the window is the error.

`bench_serving` runs SGLang's own request function (`async_request_sglang_generate`, taken from the installed
`sglang.benchmark.serving` source, whose module needs `transformers` to import) the way its benchmark does:
asyncio.gather under a semaphore, throughput = output tokens / (perf_counter after − before the gather).

`--server uvicorn` replaces the stand-in by a FastAPI app on uvicorn (the HTTP stack SGLang serves with), in its
own process: every request streams 4 tokens per 10 ms step from its own timer (no batching), as SGLang's
`/generate` event stream, and the app records the same per-request timestamps for /sim/stats; so the accuracy
figures do not rest on the stand-in's own HTTP code.

Usage: python benchmarks/bench_client.py [--levels 1,16,64,256] [--clients asyncio,aiohttp,httpx,bench_serving]
       [--max-tokens 256] [--server standin|uvicorn]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.util
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Union

import httpx

from ddsweep import figures, storage
from ddsweep.bench import prompts
from ddsweep.bench.cells import BenchSettings, run_benchmark
from ddsweep.sim import tokenizer as sim_tokenizer

BENCH_SERVING_NAMES = ("RequestFuncInput", "RequestFuncOutput", "_create_bench_client_session", "get_auth_headers",
                       "get_request_headers", "_record_server_prompt_len", "_ROUTING_KEY_HEADER",
                       "async_request_sglang_generate")


def free_port() -> int:
    """An unused TCP port on localhost."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, kind: str = "standin") -> subprocess.Popen:
    """Start the stand-in (or the uvicorn app) at 4 tokens per 10 ms step and wait until it is healthy."""
    if kind == "uvicorn":
        cmd = [sys.executable, str(Path(__file__).with_name("uvicorn_server.py")), str(port)]
    else:
        cmd = [sys.executable, "-m", "ddsweep", "sim-server", "--model-path", "sim/model", "--port", str(port),
               "--sim-strict", "off", "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8",
               "--sim-step-ms", "10", "--sim-token-cost", "0", "--sim-draft-frac", "0",
               "--sim-draft-batch-frac", "0", "--sim-prefill-ms-per-1k", "0", "--sim-accept-fixed", "4"]
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
    """Throughput, median decode speed, acceptance and the window ends from the server's per-request timestamps."""
    rows = [r for r in httpx.get(url + "/sim/stats", timeout=30).json()["requests"] if r["finished"]]
    tokens = sum(r["completion_tokens"] for r in rows)
    first, last = min(r["arrival_ts"] for r in rows), max(r["last_token_ts"] for r in rows)
    decode = [(r["completion_tokens"] - 1) / (r["last_token_ts"] - r["first_token_ts"]) for r in rows]
    return {"throughput": tokens / (last - first), "decode": figures.median(decode),
            "acceptance": tokens / sum(r["spec_verify_ct"] for r in rows), "requests": len(rows),
            "first": first, "last": last}


def _cpu() -> float:
    """CPU seconds (user + system) of the calling thread: the one running the client's event loop."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def run_ddsweep(url: str, client: str, level: int, n: int, max_tokens: int) -> dict:
    """One `run_benchmark` cell; returns the client's figures and its window ends."""
    settings = BenchSettings(contexts=[128], concurrency=[level], max_new_tokens=max_tokens, requests_per_cell=n,
                             repeats=1, warmup_requests=0, http_client=client,
                             workloads=[{"name": "prose", "kind": "prose", "ignore_eos": True}])
    with tempfile.TemporaryDirectory() as tmp:
        doc = run_benchmark(url, Path(tmp), settings, simulated=True)
        records = storage.read_jsonl(Path(tmp) / "requests.jsonl")
    cell = doc["cells"][0]
    return {"throughput": cell["output_throughput_tok_s"], "decode": cell["decode_tok_s"]["median"],
            "acceptance": cell["acceptance_length"], "failed": cell["failed"],
            "first": min(r["start_ts"] for r in records), "last": max(r["end_ts"] for r in records)}


def load_bench_serving() -> dict | None:
    """SGLang's request function and its helpers, compiled from the installed source (None if not installed)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations)), "benchmark", "serving.py")
    if not source.exists():
        return None
    tree = ast.parse(source.read_text())
    nodes = [n for n in tree.body if getattr(n, "name", None) in BENCH_SERVING_NAMES or
             (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in BENCH_SERVING_NAMES for t in n.targets))]
    import aiohttp
    import orjson

    args = SimpleNamespace(temperature=0.0, disable_ignore_eos=False, top_p=1.0, disable_stream=False,
                           return_logprob=False, return_routed_experts=False, logprob_start_len=-1,
                           top_logprobs_num=0, token_ids_logprob=None, cache_report=False, header=None)
    namespace: dict[str, Any] = {
        "aiohttp": aiohttp, "orjson": orjson, "json": json, "os": os, "sys": sys, "time": time,
        "traceback": traceback, "dataclass": dataclass, "field": field, "Any": Any, "Dict": dict, "List": list,
        "Optional": Optional, "Union": Union, "tqdm": object, "args": args}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(source), "exec"), namespace)
    return namespace


def run_bench_serving(ns: dict, url: str, texts: list[str], level: int, max_tokens: int) -> dict:
    """Run SGLang's request function like its benchmark() does: gather under a semaphore, asyncio's own loop."""
    n = len(texts)
    inputs = [ns["RequestFuncInput"](prompt=t, api_url=url + "/generate", prompt_len=128, output_len=max_tokens,
                                     model="sim", lora_name="", image_data=None, extra_request_body={})
              for t in texts]

    async def main() -> tuple[list, float, float, float]:
        semaphore = asyncio.Semaphore(level)

        async def limited(item: Any) -> Any:
            async with semaphore:
                return await ns["async_request_sglang_generate"](item, None)

        wall, start = time.time(), time.perf_counter()
        outputs = await asyncio.gather(*(limited(item) for item in inputs))
        return outputs, wall, start, time.perf_counter()

    outputs, wall, start, end = asyncio.run(main())
    done = [o for o in outputs if o.success]
    tokens = sum(o.output_len for o in done)
    verify = sum(o.output_len / o.spec_accept_length for o in done if o.spec_accept_length)
    decode = [(o.output_len - 1) / (o.latency - o.ttft) for o in done if o.latency > o.ttft]
    return {"throughput": tokens / (end - start), "decode": figures.median(decode) if decode else float("nan"),
            "acceptance": tokens / verify if verify else float("nan"), "failed": n - len(done),
            "first": wall, "last": wall + (end - start)}


def measure(url: str, client: str, level: int, max_tokens: int, bench_serving: dict | None) -> dict:
    """One run at one concurrency level; returns client figures, server truth and client CPU per request.

    The CPU figure is that of the thread running the event loop, so prompt building is left out on both sides:
    `run_benchmark` builds prompts in worker threads, bench_serving's are built before the clock starts.
    """
    n = max(2 * level, 16)
    if client == "bench_serving":
        assert bench_serving is not None
        texts = [prompts.build_prompt(128, i, sim_tokenizer.count) for i in range(n)]
        httpx.post(url + "/sim/reset", timeout=30)
        before = _cpu()
        result = run_bench_serving(bench_serving, url, texts, level, max_tokens)
    else:
        httpx.post(url + "/sim/reset", timeout=30)
        before = _cpu()
        result = run_ddsweep(url, client, level, n, max_tokens)
    cpu = _cpu() - before
    return {"client": result, "truth": server_truth(url), "cpu_per_request": cpu / n, "requests": n}


def main() -> int:
    """Run the matrix and print one line per (client, level)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,16,64,256")
    parser.add_argument("--clients", default="asyncio,aiohttp,httpx,bench_serving")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--server", choices=["standin", "uvicorn"], default="standin")
    args = parser.parse_args()
    clients = args.clients.split(",")
    bench_serving = load_bench_serving() if "bench_serving" in clients else None
    if "bench_serving" in clients and bench_serving is None:
        print("sglang is not installed: skipping bench_serving", file=sys.stderr)
        clients.remove("bench_serving")
    port = free_port()
    proc = start_server(port, args.server)
    url = f"http://127.0.0.1:{port}"
    print(f"{args.server}: 4 tokens per 10 ms step (400 tok/s per request), max_tokens={args.max_tokens}")
    print(f"{'client':>13} {'C':>4} {'reqs':>5} {'tput client':>12} {'tput server':>12} {'err %':>7} {'lead ms':>8} "
          f"{'lag ms':>7} {'decode cl':>10} {'decode srv':>10} {'err %':>7} {'accept cl/srv':>14} {'cpu s/req':>10} "
          f"{'failed':>6}")
    try:
        for client in clients:
            for level in (int(x) for x in args.levels.split(",")):
                r = measure(url, client, level, args.max_tokens, bench_serving)
                c, t = r["client"], r["truth"]
                print(f"{client:>13} {level:>4} {r['requests']:>5} {c['throughput']:>12.1f} {t['throughput']:>12.1f} "
                      f"{100 * (c['throughput'] / t['throughput'] - 1):>+7.2f} {1e3 * (t['first'] - c['first']):>8.1f} "
                      f"{1e3 * (c['last'] - t['last']):>7.1f} {c['decode']:>10.1f} {t['decode']:>10.1f} "
                      f"{100 * (c['decode'] / t['decode'] - 1):>+7.2f} {c['acceptance']:>6.3f}/{t['acceptance']:<7.3f} "
                      f"{r['cpu_per_request']:>10.4f} {c['failed']:>6}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
