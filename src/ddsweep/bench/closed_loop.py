"""One cell's load: C requests in flight (a new one as soon as one finishes), or Poisson arrivals, until the cell's
stopping rule holds.

A counted cell (a warmup, or `min_window_s` 0) sends exactly its planned requests. A windowed cell keeps sending
until at least `min_requests` requests have ended (a floor no cap cuts) and it has a steady-state window (from the
moment C requests are first in flight) of at least `min_window_s` whose sub-windows agree on output throughput
within the stability tolerance; a cell that has not settled at its window goes on, within the same launch, until it
does or until `max_window_s`, where it stops and is recorded as unstable. The in-flight requests are then allowed
to finish, so the window ends where ddsweep.figures' steady state ends. The stopping check runs on 50 ms bins and,
before it stops a cell as settled, on the requests themselves as the record computes it (figures.stability, the
requests in flight taken as ending now), so that a cell the record would call unsettled is extended rather than
stopped. A windowed cell also stops early once more than `max_failure_fraction` of at least `min_requests`
requests failed. Any cell given a HangWatch stops at once, raising
ServerHang, when the server stays silent and does not answer a probe (bench/hangs.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ddsweep import figures
from ddsweep.bench.hangs import HangWatch, Probe, ServerHang, probe
from ddsweep.bench.records import RequestRecord, run_request
from ddsweep.bench.transport import Transport
from ddsweep.bench.workloads import Prompt, Workload

BIN_S = 0.05


@dataclass(frozen=True)
class StopRule:
    """When a cell stops sending: `min_window_s` 0 means after exactly `min_requests` requests."""

    min_requests: int
    min_window_s: float = 0.0
    max_window_s: float = 0.0
    subwindows: int = figures.STABILITY_SUBWINDOWS
    tolerance: float = figures.STABILITY_TOLERANCE
    max_failure_fraction: float = 1.0

    @property
    def counted(self) -> bool:
        """Whether the cell is a fixed number of requests."""
        return self.min_window_s <= 0


@dataclass
class LoopState:
    """Mutable progress of a run, for the progress reporter."""

    in_flight: int = 0
    done: int = 0
    tokens: int = 0
    label: str = ""


@dataclass
class _Watch:
    """What the stopping check knows of a running windowed cell: token arrivals in BIN_S bins (completed requests),
    the in-flight records, and when C requests were first in flight."""

    origin: float
    bins: dict[int, int] = field(default_factory=dict)
    running: set[int] = field(default_factory=set)
    window_start: float | None = None
    completed: int = 0
    failed: int = 0
    answered: int = 0  # requests that ended with the server's answer (not the client's timeout)
    stopped_by: str | None = None
    hang: ServerHang | None = None

    def add(self, record: RequestRecord, bins: dict[int, int]) -> None:
        """Count a record's token arrivals into `bins`."""
        if record.start_ts is None:
            return
        for t, n in figures.request_times(vars(record)).arrivals:
            key = int((record.start_ts + t - self.origin) / BIN_S)
            bins[key] = bins.get(key, 0) + n

    def spread(self, records: list[RequestRecord], now: float, parts: int) -> float | None:
        """Throughput spread of `parts` sub-windows of [window_start, now], in-flight tokens included."""
        assert self.window_start is not None
        bins = dict(self.bins)
        for i in self.running:
            self.add(records[i], bins)
        first = int((self.window_start - self.origin) / BIN_S)
        last = int((now - self.origin) / BIN_S)
        edges = [first + round((last - first) * k / parts) for k in range(parts + 1)]
        values = [sum(bins.get(b, 0) for b in range(lo, hi)) / max(BIN_S, (hi - lo) * BIN_S)
                  for lo, hi in zip(edges, edges[1:], strict=False)]
        return figures.spread(values)

    def recorded_settled(self, records: list[RequestRecord], now: float, rule: StopRule) -> bool:
        """Whether the record would call the cell settled were it to end now: figures.stability over the requests
        sent so far, those in flight taken as ending now."""
        rows = [{**vars(r), "end_ts": now} if i in self.running else vars(r)
                for i, r in enumerate(records) if r.start_ts is not None]
        return bool(figures.stability(rows, rule.subwindows, rule.tolerance)["stable"])


def _decide(watch: _Watch, rule: StopRule, records: list[RequestRecord], now: float, started: float) -> str | None:
    """Why a windowed cell stops now (stable, cap, failures), or None to go on. No cell stops for its window
    before `min_requests` requests have ended: the count is a floor the cap never cuts (request timeouts bound it)."""
    ended = watch.completed + watch.failed
    if ended < rule.min_requests:
        return None
    if watch.failed > rule.max_failure_fraction * ended:
        return "failures"
    if watch.window_start is None:
        return "cap" if now - started >= rule.max_window_s else None
    elapsed = now - watch.window_start
    # one bin of margin: the recorded window starts at the C-th request's own start, a little after this one
    if watch.completed < rule.min_requests or elapsed < rule.min_window_s + BIN_S:
        return "cap" if now - started >= rule.max_window_s + rule.min_window_s else None
    figure = watch.spread(records, now, rule.subwindows)
    if figure is not None and figure <= rule.tolerance and watch.recorded_settled(records, now, rule):
        return "stable"
    return "cap" if elapsed >= rule.max_window_s else None


async def run_cell(transport: Transport, url: str, prompt: Callable[[int], Awaitable[Prompt]],
                   make_record: Callable[[int], RequestRecord], rule: StopRule, concurrency: int,
                   workload: Workload, max_new_tokens: int, timeout_s: float, request_rate: float | None, seed: int,
                   sink: Callable[[RequestRecord], None], state: LoopState,
                   hangs: HangWatch | None = None) -> tuple[list[RequestRecord], str]:
    """Run one cell; returns its records (in send order) and why it stopped: `count` (a counted cell), `stable`,
    `cap` (max_window_s reached unsettled) or `failures`. `prompt(i)` gives the i-th prompt of the cell. With
    `hangs`, a server silent for its stall timeout is probed; if the probe gets nothing either, the requests in
    flight are recorded as failed by the hang and ServerHang is raised."""
    records: list[RequestRecord] = []
    rng = random.Random(seed)
    gate = asyncio.Lock()
    next_send = [time.perf_counter()]
    started = time.time()
    watch = _Watch(origin=started)
    stop = asyncio.Event()
    probe_ids: list[list[int]] = []  # the cell's first prompt: what a probe asks one token for

    async def one(i: int) -> None:
        rec = records[i]
        source = await prompt(i)
        probe_ids[:] = probe_ids or [source.input_ids]
        state.in_flight += 1
        watch.running.add(i)
        if watch.window_start is None and state.in_flight >= concurrency:
            watch.window_start = time.time()
        try:
            rec.prompt_source, rec.prompt_fingerprint = source.label, source.fingerprint
            await asyncio.wait_for(run_request(transport, url, source.input_ids, max_new_tokens, rec,
                                               ignore_eos=workload.ignore_eos), timeout_s)
            watch.answered += 1
        except asyncio.TimeoutError:
            rec.error = f"timeout after {timeout_s:g} s"
            rec.end_ts = time.time()
            rec.e2e_s = rec.end_ts - (rec.start_ts or rec.end_ts)
        except asyncio.CancelledError:
            state.in_flight -= 1
            watch.running.discard(i)
            if watch.hang is not None:  # stopped by the hang: recorded, as every request that was sent
                rec.error = f"server hang: no answer for {watch.hang.probe.silent_s:.1f} s, the cell was stopped"
                rec.end_ts = time.time()
                rec.e2e_s = rec.end_ts - (rec.start_ts or rec.end_ts)
                sink(rec)
            raise
        state.in_flight -= 1
        state.done += 1
        watch.running.discard(i)
        if rec.ok:
            state.tokens += rec.completion_tokens or 0
            watch.completed += 1
            watch.add(rec, watch.bins)
        else:
            watch.failed += 1
        sink(rec)

    def take() -> int | None:
        """The next request number, or None when the cell sends no more."""
        if stop.is_set() or (rule.counted and len(records) >= rule.min_requests):
            return None
        records.append(make_record(len(records)))
        return len(records) - 1

    async def worker() -> None:
        while (i := take()) is not None:
            if request_rate:
                async with gate:
                    next_send[0] += rng.expovariate(request_rate)
                    await asyncio.sleep(max(0.0, next_send[0] - time.perf_counter()))
            await one(i)

    async def monitor() -> None:
        interval = max(0.1, min(1.0, rule.min_window_s / 20))
        while not stop.is_set():
            await asyncio.sleep(interval)
            watch.stopped_by = _decide(watch, rule, records, time.time(), started)
            if watch.stopped_by:
                stop.set()

    async def watchdog(hangs: HangWatch, tasks: list[asyncio.Task]) -> None:
        """Probe a server that sent nothing for the stall timeout; cancel the cell when the probe gets nothing."""
        def progress() -> int:
            return watch.answered + sum(len(records[i].chunks) for i in watch.running)

        while True:
            await asyncio.sleep(hangs.interval_s)
            silent = hangs.observe(progress(), state.in_flight, time.perf_counter())
            if silent is None or not probe_ids:
                continue
            before, in_flight = progress(), state.in_flight
            answered, took, error = await probe(transport, url, probe_ids[0], hangs.probe_timeout_s)
            found = Probe(at_ts=time.time(), silent_s=round(silent, 3), in_flight=in_flight,
                          answered=answered or progress() != before, probe_s=round(took, 3), error=error)
            hangs.probes.append(found)
            if found.answered:
                hangs.heard = time.perf_counter()  # alive: the silence starts again from now
                continue
            watch.hang = ServerHang(found, hangs.stall_timeout_s, hangs.probe_timeout_s)
            stop.set()
            for task in tasks:
                task.cancel()
            return

    workers = concurrency if not rule.counted else min(concurrency, rule.min_requests)
    await transport.warm(url + "/generate", workers)
    loop = asyncio.get_running_loop()
    checker = None if rule.counted else loop.create_task(monitor())
    tasks = [loop.create_task(worker()) for _ in range(workers)]
    guard = loop.create_task(watchdog(hangs, tasks)) if hangs is not None else None
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        if watch.hang is None:
            raise
        raise watch.hang from None
    finally:
        for task in (checker, guard, *tasks):
            if task is not None:
                task.cancel()
    return records, "count" if rule.counted else (watch.stopped_by or "cap")


def window_record(records: list[RequestRecord], rule: StopRule, stopped_by: str) -> dict[str, Any]:
    """What a cell records of its window: the steady-state window, the requests measured in it, the sub-window
    agreement and why the cell stopped (docs/results-schema.md, `window`)."""
    rows = [vars(r) for r in records]
    steady = figures.steady_state(rows)
    settled = figures.stability(rows, rule.subwindows, rule.tolerance)
    return {"start_ts": steady["start_ts"], "end_ts": steady["end_ts"], "duration_s": steady["duration_s"],
            "requests_measured": steady["completed"], "requests_sent": len(records),
            "min_window_s": rule.min_window_s, "max_window_s": rule.max_window_s, "stopped_by": stopped_by,
            **settled}
