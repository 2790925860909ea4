"""The benchmark's cell runner: workloads x contexts x concurrency against SGLang's native streaming /generate.

For each (workload, context, concurrency) it sends warmup requests (recorded, flagged, excluded from every
figure) right before the first of its cells, and `repeats` cells of measured greedy requests, each with its own
prompt (bench/workloads.py: token ids rendered by the server's chat template, sent as `input_ids`). A cell has
`requests_per_cell` requests, by default 4·C so that C requests are in flight for most of it; its figures are
computed over the whole cell and over the steady-state window (records.py). The measured cells of a point run
in an order shuffled with a recorded seed, so drift during a point spreads over all cells instead of biasing
the last ones. The requests of a cell are appended to requests.jsonl in the order they finished as soon as
the cell is over (or fails, or is interrupted): serializing a record costs ~0.2 ms, and doing it while other
streams are in flight delays their timestamps. cells.json is rewritten atomically after each cell.
Acceptance is always the ratio of per-request sums, never a server counter.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ddsweep import storage
from ddsweep.bench import metrics
from ddsweep.bench.closed_loop import LoopState, StopRule, run_cell, window_record
from ddsweep.bench.feasibility import feasible_workloads, over_context_cells, unbuildable_cells
from ddsweep.bench.gpu_sampler import GpuSampler
from ddsweep.bench.hangs import HangWatch, ServerHang, stall_timeout
from ddsweep.bench.records import RequestRecord, cache_check, cell_figures, group_figures
from ddsweep.bench.transport import Transport, make_transport
from ddsweep.bench.workloads import Prompt, PromptBuilder, Workload, WorkloadError
from ddsweep.config.defaults import schema_default
from ddsweep.config.plan import cell_requests
from ddsweep.figures import median

PROGRESS_INTERVAL_S = 2.0
EXTRA_SEQUENCES = 1_000_000  # prompt numbers reserved per measured cell for what it sends beyond its planned ones
PREBUILD_MARGIN = 1.2  # prompts built before a windowed cell: the expected rate x min_window_s x this, plus 2C
TOKENIZE_TIMEOUT_S = 30.0


@dataclass
class BenchSettings:
    """What to measure: workloads, the (context, concurrency) matrix, request counts, limits and the seeds."""

    contexts: list[int]
    concurrency: list[int]
    max_new_tokens: int = schema_default("benchmark.max_new_tokens")
    requests_per_cell: int | None = schema_default("benchmark.requests_per_cell")
    repeats: int = schema_default("benchmark.repeats")
    warmup_requests: int = schema_default("benchmark.warmup_requests")
    max_failure_fraction: float = schema_default("benchmark.max_failure_fraction")
    request_timeout_s: float = schema_default("benchmark.request_timeout_s")
    stall_timeout_s: float | None = schema_default("benchmark.stall_timeout_s")  # None: a fraction of the above
    seed: int = schema_default("benchmark.seed")
    request_rate: float | None = schema_default("benchmark.request_rate")
    http_client: str = "asyncio"
    workloads: list[dict] = field(default_factory=lambda: schema_default("benchmark.workloads"))
    cell_order: str = schema_default("benchmark.cell_order")
    cell_order_seed: int | None = schema_default("benchmark.cell_order_seed")
    context_tolerance: float = schema_default("benchmark.context_tolerance")
    # Absent from a benchmark section (a record written by hand or before windows): counted cells, as then; every
    # validated config carries the schema's default (20 s).
    min_window_s: float = 0.0
    warmup_window_s: float = 0.0
    max_window_s: float = schema_default("benchmark.max_window_s")
    stability_subwindows: int = schema_default("benchmark.stability_subwindows")
    stability_tolerance: float = schema_default("benchmark.stability_tolerance")
    stall_factor: float = schema_default("benchmark.stall_factor")
    stall_floor_s: float = schema_default("benchmark.stall_floor_s")


class BenchmarkError(RuntimeError):
    """The benchmark cannot go on: a cell whose every request failed, or prompts that could not be built (raised
    after the result files are written). A cell with some but too many failed requests is marked `failed`."""


# --------------------------------------------------------------------------- the run

class TokenizeError(Exception):
    """SGLang's `/tokenize` could not be reached or answered something else than token ids."""


_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def _exchange(conn: http.client.HTTPConnection, payload: bytes) -> tuple[int, bytes]:
    """POST a JSON body to /tokenize on `conn` (reopened by http.client when closed): (status, body)."""
    conn.request("POST", "/tokenize", body=payload, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


class TokenizeClient:
    """The server's own tokenizer and chat template through SGLang's `/tokenize` (`messages` or `prompt`).

    Prompts are sized in threads, several round trips each: every thread keeps one keep-alive connection of the
    standard library's http.client, which costs about a third of an httpx request's CPU per call.
    """

    def __init__(self, url: str, known: dict[bytes, tuple[int, ...]] | None = None) -> None:
        """Connections to `url` are opened per thread on first use. `known`: the answers of this server so far, by
        request body, shared by the clients of one server (the contexts' check and the benchmark size the same
        prompts)."""
        self.url = url
        self.known = {} if known is None else known
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port
        self._local = threading.local()
        self._open: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = self._local.conn = cls(self._host, self._port, timeout=TOKENIZE_TIMEOUT_S)
            with self._lock:
                self._open.append(conn)
        return conn

    def _post(self, payload: bytes) -> tuple[int, bytes]:
        """One POST /tokenize: (status, body)."""
        conn = self._connection()
        try:
            try:
                return _exchange(conn, payload)
            except _STALE:  # the server closed the idle keep-alive connection: once more on a new one
                conn.close()
                return _exchange(conn, payload)
        except (http.client.HTTPException, OSError) as exc:
            conn.close()
            raise TokenizeError(f"POST {self.url}/tokenize failed: {type(exc).__name__}: {exc}") from exc

    def context_length(self) -> int | None:
        """The server's context length as SGLang's `/v1/models` gives it (the served model's `max_model_len`), or
        None where it does not say."""
        conn = self._connection()
        try:
            conn.request("GET", "/v1/models")
            response = conn.getresponse()
            status, body = response.status, response.read()
        except (http.client.HTTPException, OSError):
            conn.close()
            return None
        try:
            value = json.loads(body)["data"][0]["max_model_len"] if status == 200 else None
        except (ValueError, KeyError, IndexError, TypeError):
            return None
        return value if isinstance(value, int) and value > 0 else None

    def __call__(self, body: dict) -> list[int]:
        """Token ids of a /tokenize body (from `known` when asked before); any other answer than SGLang's is an
        error naming it."""
        payload = json.dumps(body).encode()
        if payload in self.known:
            return list(self.known[payload])
        status, raw = self._post(payload)
        try:
            tokens = json.loads(raw).get("tokens") if status == 200 else None
        except (ValueError, AttributeError):
            tokens = None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            text = raw.decode("utf-8", "replace")
            raise TokenizeError(f"POST {self.url}/tokenize answered HTTP {status}: {text[:300]!r}")
        self.known[payload] = tuple(tokens)
        return tokens

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            for conn in self._open:
                conn.close()
            self._open.clear()


def infeasible_cells(url: str, settings: BenchSettings,
                     known: dict[bytes, tuple[int, ...]] | None = None) -> list[dict[str, Any]]:
    """The cells no prompt can be sized to (bench.feasibility) as the server at `url` counts tokens (its
    `/tokenize`; `known` as for TokenizeClient), then those whose prompts and new tokens do not fit its context
    length (`/v1/models`)."""
    tokenizer = TokenizeClient(url, known)
    matrix = {"workloads": settings.workloads, "contexts": settings.contexts, "seed": settings.seed,
              "max_new_tokens": settings.max_new_tokens}
    try:
        cells = unbuildable_cells(tokenizer, matrix)
        length = tokenizer.context_length()
        seen = {(cell["workload"], cell["context"]) for cell in cells}
        over = over_context_cells(matrix, length, "the server's /v1/models") if length else []
        return cells + [cell for cell in over if (cell["workload"], cell["context"]) not in seen]
    except (TokenizeError, KeyError) as exc:
        raise BenchmarkError(f"could not count prompt tokens with {url}/tokenize while checking which contexts "
                             f"the workloads can build: {type(exc).__name__}: {exc}") from exc
    except WorkloadError as exc:
        raise BenchmarkError(str(exc)) from exc
    finally:
        tokenizer.close()


def without_cells(settings: BenchSettings, infeasible: list[dict[str, Any]]) -> BenchSettings | None:
    """`settings` without the infeasible (workload, context) cells; None when no cell is left."""
    if not infeasible:
        return settings
    workloads = feasible_workloads(settings.workloads, settings.contexts, infeasible)
    return replace(settings, workloads=workloads) if workloads else None


class PromptSupply:
    """A cell's prompts: the `planned` ones built before it starts, then more on demand for a windowed cell, built
    `ahead` at a time in threads before the running requests run out of them (numbers from `extra_base` on)."""

    def __init__(self, builder: PromptBuilder, context: int, planned: list[Prompt], fixed: int, extra_base: int,
                 ahead: int) -> None:
        """`planned` prompts are ready; prompt i >= `fixed` (the cell's planned numbers) is sequence
        extra_base + i - fixed."""
        self.builder, self.context, self.extra_base, self.ahead = builder, context, extra_base, ahead
        self.planned, self.fixed = planned, fixed
        self.tasks: dict[int, asyncio.Future[Prompt]] = {}
        self.given: list[Prompt] = []

    def _start(self, i: int) -> None:
        if i >= len(self.planned) and i not in self.tasks:
            self.tasks[i] = asyncio.ensure_future(asyncio.to_thread(
                self.builder.build, self.context, self.extra_base + i - self.fixed))

    async def __call__(self, i: int) -> Prompt:
        """The i-th prompt; asking near the end of what is built starts building the next `ahead`."""
        if i + self.ahead >= len(self.planned):
            for j in range(max(i, len(self.planned)), i + 2 * self.ahead):
                self._start(j)
        self.given.append(self.planned[i] if i < len(self.planned) else await self.tasks.pop(i))
        return self.given[-1]

    def cancel(self) -> None:
        """Stop building prompts no request will use."""
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()


@dataclass(frozen=True)
class _Cell:
    """One batch of requests: the warmup of a (workload, context, concurrency) or one measured repeat."""

    workload: Workload
    context: int
    concurrency: int
    repeat: int
    warmup: bool
    sequences: tuple[int, ...]
    extra_base: int = 0  # the first prompt number of the prompts a windowed batch sends beyond `sequences`


def plan_cells(settings: BenchSettings, order_seed: int) -> list[_Cell]:
    """Every batch of the run in the order it runs: measured cells shuffled (when `cell_order` is random) and
    each group's warmup right before its first cell. Prompt numbers follow the unshuffled order, so the same
    cell gets the same prompts whatever the order; so do a windowed cell's further prompts (from `extra_base`)."""
    measured: list[_Cell] = []
    warmups: dict[tuple[str, int, int], _Cell] = {}
    for entry in settings.workloads:
        workload = Workload.from_config(entry)
        sequence = 0
        for context in workload.contexts or settings.contexts:
            for conc in workload.concurrency or settings.concurrency:
                warm = tuple(range(sequence, sequence + settings.warmup_requests))
                sequence += len(warm)
                warmups[(workload.name, context, conc)] = _Cell(workload, context, conc, 0, True, warm)
                n = cell_requests(conc, settings.requests_per_cell)
                for rep in range(settings.repeats):
                    extra = EXTRA_SEQUENCES * (1 + sum(c.workload.name == workload.name for c in measured))
                    measured.append(_Cell(workload, context, conc, rep, False, tuple(range(sequence, sequence + n)),
                                          extra))
                    sequence += n
    # a warm-up's further prompts (a settling warm-up) come from ranges after its workload's measured cells'
    ranges = {name: 1 + sum(c.workload.name == name for c in measured) for name, _, _ in warmups}
    for key, warm in warmups.items():
        warmups[key] = replace(warm, extra_base=EXTRA_SEQUENCES * ranges[key[0]])
        ranges[key[0]] += 1
    if settings.cell_order == "random":
        random.Random(order_seed).shuffle(measured)
    plan: list[_Cell] = []
    for cell in measured:
        warm = warmups.pop((cell.workload.name, cell.context, cell.concurrency), None)
        if warm is not None and warm.sequences:
            plan.append(warm)
        plan.append(cell)
    return plan


def stop_rule(settings: BenchSettings, cell: _Cell) -> StopRule:
    """A batch's stopping rule: a measured cell runs its window (`min_window_s`), a warm-up until its throughput
    settles over `warmup_window_s`, both capped at `max_window_s`; a window of 0 sends exactly the planned requests."""
    window = settings.warmup_window_s if cell.warmup else settings.min_window_s
    return StopRule(len(cell.sequences), window, settings.max_window_s, settings.stability_subwindows,
                    settings.stability_tolerance, settings.max_failure_fraction)


def prebuilt_extra(rule: StopRule, rate: float | None, concurrency: int) -> int:
    """Prompts to build before a windowed cell beyond its planned ones: what `rate` (requests/s, from the last
    batch of the same cell) sends in the minimum window, with a margin; the rest are built while it runs."""
    if rule.counted or not rate:
        return 0
    expected = math.ceil(rate * rule.min_window_s * PREBUILD_MARGIN) + 2 * concurrency
    return max(0, min(expected, math.ceil(rate * rule.max_window_s)) - rule.min_requests)


def _numbers(cell: _Cell, count: int) -> list[int]:
    """The prompt numbers of a cell's first `count` prompts."""
    return [*cell.sequences, *range(cell.extra_base, cell.extra_base + count - len(cell.sequences))]


def _request_rate(records: list[RequestRecord], concurrency: int) -> float | None:
    """Requests per second a cell's requests suggest for the next cell like it (C over their median duration)."""
    e2e = [r.e2e_s for r in records if r.ok and r.e2e_s]
    return concurrency / median(e2e) if e2e else None


async def run_benchmark_async(url: str, requests_path: Path, cells_path: Path, settings: BenchSettings, simulated: bool,
                     progress: Callable[[str], None], known: dict[bytes, tuple[int, ...]] | None = None) -> dict:
    url = url.rstrip("/")
    requests_path.parent.mkdir(parents=True, exist_ok=True)
    order_seed = settings.cell_order_seed if settings.cell_order_seed is not None else secrets.randbelow(2**31)
    config = asdict(settings)
    doc: dict[str, Any] = {"simulated": simulated, "config": config, "cell_order_seed": order_seed,
                           "workloads": [], "warmups": [], "cells": [], "groups": [], "failed_cells": []}
    try:
        plan = plan_cells(settings, order_seed)
    except WorkloadError as exc:
        raise BenchmarkError(str(exc)) from exc
    tokenizer = TokenizeClient(url, known)
    transport = make_transport(settings.http_client)
    await transport.open(max(c.concurrency for c in plan) if plan else 1)
    with open(requests_path, "w", encoding="utf-8") as handle:
        await _run_matrix(url, cells_path, settings, plan, doc, handle, tokenizer, transport, progress)
    storage.write_json_atomic(cells_path, doc)
    return doc


def workload_summaries(settings: BenchSettings, cells: list[dict]) -> list[dict]:
    """Per workload: its stopping rule and its acceptance length over every measured request (ratio of sums)."""
    out = []
    for entry in settings.workloads:
        workload = Workload.from_config(entry)
        mine = [c for c in cells if c["workload"] == workload.name]
        tokens = sum(c["accepted_tokens"] for c in mine)
        verify = sum(c["verify_steps"] for c in mine)
        out.append({"name": workload.name, "kind": workload.kind, "path": workload.path,
                    "ignore_eos": workload.ignore_eos,
                    "max_new_tokens": workload.max_new_tokens or settings.max_new_tokens,
                    "cells": len(mine), "requests": sum(c["completed"] for c in mine),
                    "acceptance_length": tokens / verify if verify else None})
    return out


def gpu_fields(sampler: GpuSampler | None, steady: dict[str, Any]) -> dict[str, Any]:
    """A measured cell's `gpu`, `gpu_reason` and `energy_j_per_output_token`: stops `sampler` (None in a simulated
    study) and summarises it over the cell's steady-state window, whose output tokens the energy is divided by."""
    if sampler is None:
        return {"gpu": None, "gpu_reason": "simulated study: the stand-in server has no GPU",
                "energy_j_per_output_token": None}
    if steady["start_ts"] is None:
        sampler.stop()
        gpu, reason = None, "the cell has no steady-state window"
    else:
        gpu, reason = sampler.stop(steady["start_ts"], steady["end_ts"]), sampler.reason
    energy, tokens = (gpu or {}).get("energy_j"), steady["output_tokens"]
    return {"gpu": gpu, "gpu_reason": reason,
            "energy_j_per_output_token": energy / tokens if energy is not None and tokens else None}


async def _run_matrix(url: str, cells_path: Path, settings: BenchSettings, plan: list[_Cell], doc: dict,
                      handle: Any, tokenizer: TokenizeClient, transport: Transport,
                      progress: Callable[[str], None]) -> None:
    simulated = doc["simulated"]
    state = LoopState()
    rates: dict[tuple[str, int, int], float | None] = {}
    finished: list[RequestRecord] = []
    builders: dict[str, PromptBuilder] = {}

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
            if state.label:  # nothing to report while the cell's prompts are still being sized
                progress(f"  {state.label}: {state.done} done, {state.in_flight} in flight, {rate:.0f} tok/s")

    # NVML is opened once per run, never against the stand-in (its study has no GPU to measure).
    sampler = None if simulated else GpuSampler()
    reporter_task = asyncio.get_running_loop().create_task(reporter())
    n_cells = sum(not c.warmup for c in plan)
    try:
        for cell in plan:
            workload, context, conc = cell.workload, cell.context, cell.concurrency
            where = f"workload={workload.name} context={context} concurrency={conc}"
            try:
                if workload.name not in builders:
                    builders[workload.name] = await asyncio.to_thread(PromptBuilder, workload, tokenizer,
                                                                      settings.seed)
                builder = builders[workload.name]
                rule = stop_rule(settings, cell)
                count = len(cell.sequences) + prebuilt_extra(rule, rates.get((workload.name, context, conc)), conc)
                # Concurrent /tokenize round trips (a prompt depends only on its number, not on the others).
                texts = list(await asyncio.gather(*(asyncio.to_thread(builder.build, context, seq)
                                                    for seq in _numbers(cell, count))))
            except WorkloadError as exc:
                raise BenchmarkError(f"cells of {where}: {exc}") from exc
            except (TokenizeError, KeyError) as exc:
                raise BenchmarkError(f"could not count prompt tokens with {url}/tokenize for the cells of {where}: "
                                     f"{type(exc).__name__}: {exc}") from exc
            supply = PromptSupply(builder, context, texts, len(cell.sequences), cell.extra_base, conc)
            state.label = f"{workload.name} ctx={context} C={conc} " + (
                "warmup" if cell.warmup else f"repeat {cell.repeat}")
            state.done = 0
            recs: list[RequestRecord] = []
            if sampler is not None and not cell.warmup:
                sampler.start()
            hangs = HangWatch(stall_timeout(settings.stall_timeout_s, settings.request_timeout_s))
            try:
                recs, stopped_by = await run_cell(
                    transport, url, supply, lambda i, cell=cell: RequestRecord(
                        cell.context, cell.concurrency, cell.repeat, i, cell.warmup, workload=cell.workload.name,
                        simulated=simulated),
                    rule, conc, workload, workload.max_new_tokens or settings.max_new_tokens,
                    settings.request_timeout_s, settings.request_rate, settings.seed * 1_000_003 + conc,
                    finished.append, state, hangs)
            except ServerHang as exc:
                doc["hang"] = {"workload": workload.name, "context": context, "concurrency": conc,
                               "repeat": None if cell.warmup else cell.repeat, "warmup": cell.warmup,
                               **exc.record(), "stall_probes": hangs.records()}
                storage.write_json_atomic(cells_path, doc)
                raise
            except WorkloadError as exc:
                raise BenchmarkError(f"cells of {where}: {exc}") from exc
            except (TokenizeError, KeyError) as exc:
                raise BenchmarkError(f"could not count prompt tokens with {url}/tokenize for the cells of {where}: "
                                     f"{type(exc).__name__}: {exc}") from exc
            finally:
                supply.cancel()
                flush()
            rates[(workload.name, context, conc)] = _request_rate(recs, conc)
            for found in hangs.probes:
                progress(f"{state.label}: no token for {found.silent_s:.1f} s with {found.in_flight} request(s) in "
                         f"flight; a one-token probe was answered in {found.probe_s:.1f} s, the cell went on")
            if cell.warmup:
                window = window_record(recs, rule, stopped_by)
                doc["warmups"].append({"workload": workload.name, "context": context, "concurrency": conc,
                                       "requests": len(recs), "completed": sum(r.ok for r in recs),
                                       "window": window, "stall_probes": hangs.records()})
                if not rule.counted:
                    progress(f"warm-up {workload.name} ctx={context} C={conc}: {len(recs)} requests, "
                             + (f"settled over {window['duration_s']:.1f} s" if window["stable"] else
                                f"NOT settled at the {rule.max_window_s:g} s cap (spread {window['spread']})"))
                continue
            figures = cell_figures(recs, settings.stall_factor, settings.stall_floor_s)
            figures.update(cache_check(recs, [p.input_ids for p in supply.given]),
                           window=window_record(recs, rule, stopped_by), stall_probes=hangs.records())
            figures.update(gpu_fields(sampler, figures["steady_state"]))
            verify = [r for r in recs if r.ok and r.spec_verify_ct]
            doc["cells"].append({"workload": workload.name, "context": context, "concurrency": conc,
                                 "repeat": cell.repeat, "ignore_eos": workload.ignore_eos, **figures,
                                 **metrics.context_check([r.prompt_tokens for r in recs if r.ok], context,
                                                         settings.context_tolerance),
                                 "accepted_tokens": sum(r.completion_tokens or 0 for r in verify),
                                 "verify_steps": sum(r.spec_verify_ct or 0 for r in verify)})
            doc["groups"] = group_figures(doc["cells"])
            doc["workloads"] = workload_summaries(settings, doc["cells"])
            storage.write_json_atomic(cells_path, doc)
            done = doc["cells"][-1]
            tput = done["output_throughput_tok_s"] or 0.0
            progress(f"cell {len(doc['cells'])}/{n_cells} {workload.name} ctx={context} C={conc} "
                     f"rep={cell.repeat}: {done['completed']}/{done['requests']} ok, {tput:.1f} tok/s")
            if done["requests"] and done["failed"] > settings.max_failure_fraction * done["requests"]:
                errors = sorted({r.error for r in recs if r.error})
                reason = (f"{workload.name} cell context={context} concurrency={conc} repeat={cell.repeat}: "
                          f"{done['failed']} of {done['requests']} requests failed (allowed fraction "
                          f"{settings.max_failure_fraction:g}); errors: {'; '.join(errors[:3])}")
                if done["failed"] == done["requests"]:  # the server answers nothing: the point cannot go on
                    raise BenchmarkError(reason)
                # A partial point: this cell is failed, the others (and the regimes they serve) still count.
                done.update(cell_failed=True, failure_reason=reason)
                doc["failed_cells"] = [c for c in doc["cells"] if c.get("cell_failed")]
                storage.write_json_atomic(cells_path, doc)
                progress(f"cell FAILED, the point goes on without it: {reason}")
    finally:
        reporter_task.cancel()
        if sampler is not None:
            sampler.close()
        tokenizer.close()
        await transport.close()


def run_benchmark(url: str, out_dir: Path, settings: BenchSettings, simulated: bool,
                  progress: Callable[[str], None] | None = None,
                  known: dict[bytes, tuple[int, ...]] | None = None) -> dict:
    """Run the whole matrix against `url`, write requests.jsonl and cells.json into `out_dir`, return cells.json
    (`known`: the server's /tokenize answers so far, as for TokenizeClient)."""
    out_dir = Path(out_dir)
    return run_coroutine(run_benchmark_async(url, out_dir / "requests.jsonl", out_dir / "cells.json", settings,
                                             simulated, progress or (lambda _: None), known))


def run_coroutine(coro: Any) -> Any:
    """Run a coroutine on uvloop when it is installed (less client CPU per streamed chunk), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)

