"""The benchmark's cell runner: the (context, concurrency) matrix against SGLang's native streaming /generate.

For each (context, concurrency) it sends warmup requests (recorded, flagged, excluded from every figure), then
`repeats` cells of `requests_per_cell` greedy requests with `ignore_eos`, each with its own prompt. The requests
of a cell are appended to requests.jsonl in the order they finished as soon as the cell is over (or fails, or is
interrupted): serializing a record costs ~0.2 ms, and doing it while other streams are in flight delays their
timestamps. cells.json (per cell and per group across repeats) is rewritten atomically after each cell.
Acceptance is always the ratio of per-request sums, never a server counter.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from ddsweep import storage
from ddsweep.bench import prompts
from ddsweep.bench.records import RequestRecord, cell_figures, group_figures, run_request
from ddsweep.bench.transport import _Transport, _transport

PROGRESS_INTERVAL_S = 2.0


@dataclass
class BenchSettings:
    """What to measure: the (context, concurrency) matrix, request counts, limits and the seed."""

    contexts: list[int]
    concurrency: list[int]
    max_new_tokens: int = 512
    requests_per_cell: int = 32
    repeats: int = 3
    warmup_requests: int = 2
    max_failure_fraction: float = 0.1
    request_timeout_s: float = 600.0
    seed: int = 0
    request_rate: float | None = None
    http_client: str = "asyncio"


class BenchmarkError(RuntimeError):
    """A cell had more failed requests than allowed (raised after the result files are written)."""


# --------------------------------------------------------------------------- the run
class _Counter:
    """Token counter for prompts: the server's own tokenizer through SGLang's `/tokenize` (`prompt` body)."""

    def __init__(self, url: str) -> None:
        """An HTTP client for `url` (CA certificates are loaded for https only: ~25 ms CPU)."""
        self.url = url
        self.client = httpx.Client(timeout=30.0, verify=url.startswith("https:"))

    def __call__(self, text: str) -> int:
        """Tokens in `text`, without special tokens; any other answer than SGLang's is an error naming it."""
        resp = self.client.post(self.url + "/tokenize", json={"prompt": text, "add_special_tokens": False})
        try:
            count = resp.json().get("count") if resp.status_code == 200 else None
        except ValueError:
            count = None
        if not isinstance(count, int):
            raise ValueError(f"POST {self.url}/tokenize answered HTTP {resp.status_code}: {resp.text[:300]!r}")
        return count

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()


@dataclass
class _RunState:
    """Mutable progress of a run, for the progress reporter."""

    in_flight: int = 0
    done: int = 0
    tokens: int = 0
    label: str = ""


async def _run_cell(transport: _Transport, url: str, prompt_list: list[str], records: list[RequestRecord],
                    settings: BenchSettings, concurrency: int, sink: Callable[[RequestRecord], None],
                    state: _RunState) -> None:
    """Run `records` (one per prompt) with at most `concurrency` in flight, closed-loop or Poisson arrivals."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(records)):
        queue.put_nowait(i)
    rng = random.Random(settings.seed * 1_000_003 + concurrency)
    gate = asyncio.Lock()
    next_send = [time.perf_counter()]

    async def one(i: int) -> None:
        state.in_flight += 1
        rec = records[i]
        try:
            await asyncio.wait_for(run_request(transport, url, prompt_list[i], settings.max_new_tokens, rec),
                                   settings.request_timeout_s)
        except asyncio.TimeoutError:
            rec.error = f"timeout after {settings.request_timeout_s:g} s"
            rec.end_ts = time.time()
            rec.e2e_s = rec.end_ts - (rec.start_ts or rec.end_ts)
        state.in_flight -= 1
        state.done += 1
        state.tokens += (rec.completion_tokens or 0) if rec.ok else 0
        sink(rec)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if settings.request_rate:
                async with gate:
                    next_send[0] += rng.expovariate(settings.request_rate)
                    await asyncio.sleep(max(0.0, next_send[0] - time.perf_counter()))
            await one(i)

    workers = min(concurrency, len(records))
    await transport.warm(url + "/generate", workers)
    await asyncio.gather(*(worker() for _ in range(workers)))


async def _run_async(url: str, requests_path: Path, cells_path: Path, settings: BenchSettings, simulated: bool,
                     progress: Callable[[str], None]) -> dict:
    url = url.rstrip("/")
    requests_path.parent.mkdir(parents=True, exist_ok=True)
    config = asdict(settings)
    doc: dict[str, Any] = {"simulated": simulated, "config": config, "cells": [], "groups": []}
    counter = _Counter(url)
    transport = _transport(settings.http_client)
    await transport.open(max(settings.concurrency))
    with open(requests_path, "w", encoding="utf-8") as handle:
        await _run_matrix(url, cells_path, settings, doc, handle, counter, transport, progress)
    storage.write_json_atomic(cells_path, doc)
    return doc


async def _run_matrix(url: str, cells_path: Path, settings: BenchSettings, doc: dict, handle: Any,
                      counter: _Counter, transport: _Transport, progress: Callable[[str], None]) -> None:
    simulated = doc["simulated"]
    state = _RunState()
    sequence = 0

    finished: list[RequestRecord] = []

    def flush() -> None:
        handle.write("".join(json.dumps(vars(rec)) + "\n" for rec in finished))
        handle.flush()
        finished.clear()

    async def reporter() -> None:
        last_tokens, last_t = 0, time.perf_counter()
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            now = time.perf_counter()
            rate = (state.tokens - last_tokens) / (now - last_t)
            last_tokens, last_t = state.tokens, now
            progress(f"  {state.label}: {state.done} done, {state.in_flight} in flight, {rate:.0f} tok/s")

    reporter_task = asyncio.get_running_loop().create_task(reporter())
    n_cells = len(settings.contexts) * len(settings.concurrency) * settings.repeats
    try:
        for context in settings.contexts:
            for conc in settings.concurrency:
                plan = [(True, 0, i) for i in range(settings.warmup_requests)]
                plan += [(False, rep, i) for rep in range(settings.repeats) for i in range(settings.requests_per_cell)]
                texts = []
                for _ in plan:
                    try:
                        texts.append(await asyncio.to_thread(prompts.build_prompt, context, sequence,
                                                             counter, settings.seed))
                    except (httpx.HTTPError, ValueError, KeyError) as exc:
                        raise BenchmarkError(f"could not count prompt tokens with {url}/tokenize for the cells of "
                                             f"context={context} concurrency={conc}: {type(exc).__name__}: {exc}"
                                             ) from exc
                    sequence += 1
                batches = [[k for k, p in enumerate(plan) if p[0]]]
                batches += [[k for k, p in enumerate(plan) if not p[0] and p[1] == rep]
                            for rep in range(settings.repeats)]
                for batch in batches:
                    if not batch:
                        continue
                    recs = [RequestRecord(context, conc, plan[k][1], plan[k][2], plan[k][0], simulated=simulated)
                            for k in batch]
                    warm = recs[0].warmup
                    state.label = (f"ctx={context} C={conc} " + ("warmup" if warm else f"repeat {recs[0].repeat}"))
                    state.done = 0
                    try:
                        await _run_cell(transport, url, [texts[k] for k in batch], recs, settings, conc,
                                        finished.append, state)
                    finally:
                        flush()
                    if warm:
                        continue
                    cell = {"context": context, "concurrency": conc, "repeat": recs[0].repeat,
                            **cell_figures(recs)}
                    doc["cells"].append(cell)
                    doc["groups"] = group_figures(doc["cells"])
                    storage.write_json_atomic(cells_path, doc)
                    tput = cell["output_throughput_tok_s"] or 0.0
                    progress(f"cell {len(doc['cells'])}/{n_cells} ctx={context} C={conc} rep={cell['repeat']}: "
                             f"{cell['completed']}/{cell['requests']} ok, {tput:.1f} tok/s")
                    if cell["requests"] and cell["failed"] > settings.max_failure_fraction * cell["requests"]:
                        errors = sorted({r.error for r in recs if r.error})
                        raise BenchmarkError(
                            f"cell context={context} concurrency={conc} repeat={cell['repeat']}: {cell['failed']} of "
                            f"{cell['requests']} requests failed (allowed fraction {settings.max_failure_fraction:g}); "
                            f"errors: {'; '.join(errors[:3])}")
    finally:
        reporter_task.cancel()
        counter.close()
        await transport.close()


def run_benchmark(url: str, out_dir: Path, settings: BenchSettings, simulated: bool,
                  progress: Callable[[str], None] | None = None) -> dict:
    """Run the whole matrix against `url`, write requests.jsonl and cells.json into `out_dir`, return cells.json."""
    out_dir = Path(out_dir)
    return _arun(_run_async(url, out_dir / "requests.jsonl", out_dir / "cells.json", settings, simulated,
                            progress or (lambda _: None)))


def _arun(coro: Any) -> Any:
    """Run a coroutine on uvloop when it is installed (less client CPU per streamed chunk), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)

