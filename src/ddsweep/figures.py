"""The one definition of every benchmark figure, computed from raw request records (docs/results-schema.md).

A request record (one line of bench/requests.jsonl, or the same fields as a mapping) keeps its stream as it
arrived: `chunks`, a list of `[seconds since the request was sent, cumulative completion tokens]` per streamed
event, `e2e_s` (send to the end of the stream), `completion_tokens` as the server reported it, and `error` (None
for a request that completed). The benchmark, the analysis and the adaptive screening all take their figures from
here, so a figure means the same thing wherever it is printed. This module imports nothing from the package.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

Record = Mapping[str, Any]


# --------------------------------------------------------------------------- percentiles
def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    return _interpolate(sorted(values), q)


def _interpolate(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile of already sorted values, so several percentiles need one sort."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count)."""
    return percentile(values, 50.0)


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    """{"p50": ..., "p90": ..., "p99": ...} for `values`, with None entries when there are no values."""
    ordered = sorted(values)
    return {f"p{q}": (_interpolate(ordered, q) if ordered else None) for q in qs}


# --------------------------------------------------------------------------- one request
def failed(record: Record) -> bool:
    """Whether a request failed: any recorded error (HTTP error, abort, cut or malformed stream, timeout)."""
    return record.get("error") is not None


@dataclass(frozen=True)
class RequestTimes:
    """The latency figures of one request, all from its `chunks`, `e2e_s` and `completion_tokens`.

    `chunk_gaps_s` are the inter-chunk latencies a streaming user sees (one per chunk after the first that brought
    tokens); `token_gaps_s` are per-token times (each gap divided by the tokens its chunk brought, once per token).
    Under speculative decoding a chunk carries several accepted tokens, so the two differ.
    """

    ttft_s: float | None
    e2e_s: float | None
    decode_s: float | None
    tpot_s: float | None
    chunk_gaps_s: tuple[float, ...]
    token_gaps_s: tuple[float, ...]
    arrivals: tuple[tuple[float, int], ...]  # (seconds since send, tokens it brought) of each token chunk


def _token_chunks(record: Record) -> list[tuple[float, int]]:
    """(seconds since send, new tokens) of every chunk that raised the cumulative completion count."""
    out, seen = [], 0
    for entry in record.get("chunks") or ():
        t, tokens = float(entry[0]), int(entry[1])
        if tokens > seen:
            out.append((t, tokens - seen))
            seen = tokens
    return out


# Within `one_cell()`: each record's RequestTimes by id(record), with the record kept so that the id stays its own.
_CELL_TIMES: ContextVar[dict[int, tuple[Record, RequestTimes]] | None] = ContextVar("cell_times", default=None)


@contextmanager
def one_cell() -> Iterator[None]:
    """Inside the block, a record's times are worked out once: a cell's figures ask for them five or six times each
    (a long answer streams hundreds of chunks). Only for records that do not change inside the block."""
    token = _CELL_TIMES.set({})
    try:
        yield
    finally:
        _CELL_TIMES.reset(token)


def request_times(record: Record) -> RequestTimes:
    """The latency figures of a request (docs/results-schema.md, "Figures"): TTFT is the first chunk with a token,
    TPOT is (e2e - TTFT) / (completion_tokens - 1)."""
    known = _CELL_TIMES.get()
    if known is None:
        return _request_times(record)
    if id(record) not in known:
        known[id(record)] = (record, _request_times(record))
    return known[id(record)][1]


def _request_times(record: Record) -> RequestTimes:
    """request_times, worked out."""
    arrivals = _token_chunks(record)
    e2e = record.get("e2e_s")
    ttft = arrivals[0][0] if arrivals else None
    decode = e2e - ttft if e2e is not None and ttft is not None else None
    tokens = record.get("completion_tokens")
    tpot = decode / (tokens - 1) if decode is not None and tokens and tokens > 1 else None
    chunk_gaps = tuple(b[0] - a[0] for a, b in zip(arrivals, arrivals[1:], strict=False))
    token_gaps = tuple(g / n for g, (_, n) in zip(chunk_gaps, arrivals[1:], strict=True) for _ in range(n))
    return RequestTimes(ttft, e2e, decode, tpot, chunk_gaps, token_gaps, tuple(arrivals))


def decode_speed(record: Record) -> float | None:
    """Output tokens after the first per second of decoding: (completion_tokens - 1) / (e2e - TTFT)."""
    times = request_times(record)
    return 1.0 / times.tpot_s if times.tpot_s else None


# --------------------------------------------------------------------------- one cell
def wall_s(records: Sequence[Record]) -> float | None:
    """Seconds from the first send to the last end among a cell's measured requests (failed ones included)."""
    starts = [r["start_ts"] for r in records if r.get("start_ts") is not None]
    ends = [r["end_ts"] for r in records if r.get("end_ts") is not None]
    return (max(ends) - min(starts)) if starts and ends else None


def whole_output_throughput(records: Sequence[Record]) -> float | None:
    """Completed requests' output tokens over the cell's wall time."""
    wall = wall_s(records)
    tokens = sum(r.get("completion_tokens") or 0 for r in records if not failed(r))
    return tokens / wall if wall else None


def acceptance_length(records: Sequence[Record]) -> float | None:
    """Completion tokens over verify steps, summed over completed requests that report verify steps."""
    verify = [r for r in records if not failed(r) and r.get("spec_verify_ct")]
    steps = sum(r["spec_verify_ct"] for r in verify)
    return sum(r.get("completion_tokens") or 0 for r in verify) / steps if steps else None


def _in_flight_steps(records: Sequence[Record]) -> list[tuple[float, int]]:
    """(time, requests in flight from then on) after every send and every completion, in time order."""
    timed = [r for r in records if r.get("start_ts") is not None and r.get("end_ts") is not None]
    events = sorted([(r["start_ts"], 1) for r in timed] + [(r["end_ts"], -1) for r in timed])
    steps, level = [], 0
    for ts, delta in events:
        level += delta
        steps.append((ts, level))
    return steps


def at_concurrency_fraction(records: Sequence[Record]) -> float | None:
    """Fraction of the cell's wall time with the full concurrency C in flight."""
    steps = _in_flight_steps(records)
    if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
        return None
    conc = records[0]["concurrency"]
    full = sum(b[0] - a[0] for a, b in zip(steps, steps[1:], strict=False) if a[1] >= conc)
    return full / (steps[-1][0] - steps[0][0])


def steady_state_window(records: Sequence[Record]) -> tuple[float, float] | None:
    """(start, end) wall times of the steady state: from when C requests are first in flight until the first of
    the last C completions; None when the cell never reaches C in flight or has no such window."""
    steps = _in_flight_steps(records)
    if not steps:
        return None
    conc = records[0]["concurrency"]
    start = next((ts for ts, level in steps if level >= conc), None)
    ends = sorted(r["end_ts"] for r in records if r.get("start_ts") is not None and r.get("end_ts") is not None)
    if start is None or len(ends) < conc:
        return None
    end = ends[len(ends) - conc]
    return (start, end) if end > start else None


def steady_state(records: Sequence[Record]) -> dict[str, Any]:
    """Figures over the steady-state window (see `steady_state_window`); every figure None without a window.
    Tokens count when the chunk that brought them arrived inside the window."""
    window = steady_state_window(records)
    if window is None:
        return {"start_ts": None, "end_ts": None, "duration_s": None, "output_tokens": None,
                "output_throughput_tok_s": None, "completed": None, "requests_per_s": None,
                "ttft_s": percentiles([]), "tpot_s": percentiles([]), "in_flight_mean": None}
    start, end = window
    done = [r for r in records if not failed(r) and r.get("start_ts") is not None]
    tokens = sum(n for r in done for t, n in request_times(r).arrivals if start <= r["start_ts"] + t <= end)
    completed = sum(1 for r in done if r.get("end_ts") is not None and start < r["end_ts"] <= end)
    inside = [request_times(r) for r in done if r.get("end_ts") is not None and start <= r["start_ts"]
              and r["end_ts"] <= end]
    steps = _in_flight_steps(records)
    area = sum(level * (min(t1, end) - max(t0, start)) for (t0, level), (t1, _) in zip(steps, steps[1:], strict=False)
               if min(t1, end) > max(t0, start))
    duration = end - start
    return {
        "start_ts": start, "end_ts": end, "duration_s": duration, "output_tokens": tokens,
        "output_throughput_tok_s": tokens / duration, "completed": completed, "requests_per_s": completed / duration,
        "ttft_s": percentiles([t.ttft_s for t in inside if t.ttft_s is not None]),
        "tpot_s": percentiles([t.tpot_s for t in inside if t.tpot_s is not None]),
        "in_flight_mean": area / duration,
    }


def output_throughput(records: Sequence[Record]) -> tuple[float | None, str]:
    """The decision's throughput figure and its window: over the steady state where the cell has one
    ("steady"), else over the whole cell ("whole")."""
    steady = steady_state(records)["output_throughput_tok_s"]
    return (steady, "steady") if steady is not None else (whole_output_throughput(records), "whole")


@dataclass(frozen=True)
class CellSamples:
    """The per-request values a cell's percentile figures are taken over (completed requests only)."""

    ttft_s: list[float]
    tpot_s: list[float]
    e2e_s: list[float]
    decode_tok_s: list[float]
    chunk_gaps_s: list[float]
    token_gaps_s: list[float]


def cell_samples(records: Sequence[Record]) -> CellSamples:
    """Per-request latency values of a cell's completed requests."""
    times = [request_times(r) for r in records if not failed(r)]
    return CellSamples(
        ttft_s=[t.ttft_s for t in times if t.ttft_s is not None],
        tpot_s=[t.tpot_s for t in times if t.tpot_s is not None],
        e2e_s=[t.e2e_s for t in times if t.e2e_s is not None],
        decode_tok_s=[1.0 / t.tpot_s for t in times if t.tpot_s],
        chunk_gaps_s=[g for t in times for g in t.chunk_gaps_s],
        token_gaps_s=[g for t in times for g in t.token_gaps_s],
    )


def cached_share(records: Sequence[Record]) -> float | None:
    """Prompt tokens the server served from its prefix cache, as a share of all prompt tokens (completed requests
    that report both)."""
    done = [r for r in records if not failed(r) and r.get("cached_tokens") is not None and r.get("prompt_tokens")]
    total = sum(r["prompt_tokens"] for r in done)
    return sum(r["cached_tokens"] for r in done) / total if total else None


# --------------------------------------------------------------------------- the metrics a study ranks on
@dataclass(frozen=True)
class Metric:
    """A cell figure a study can rank points on: how it is computed from a cell's records, what one request
    contributes to it (for a within-launch error; None when a request alone says nothing), its direction."""

    name: str
    label: str
    lower_is_better: bool
    cell: Callable[[Sequence[Record]], float | None]
    per_request: Callable[[Record], float | None] | None
    quantile: float | None = None  # the percentile a latency metric takes over requests
    windowed: bool = True  # a time or rate: only as steady as the cell's window (acceptance does not vary with it)

    @property
    def screenable(self) -> bool:
        """Whether one brief launch gives this figure with a standard error (from its requests' spread): a
        median does; a tail percentile of a few requests is their slowest one, with no error to rank on."""
        return self.quantile is None or self.quantile == 50


def _latency(field: str, q: float) -> Callable[[Sequence[Record]], float | None]:
    def value(records: Sequence[Record]) -> float | None:
        values = getattr(cell_samples(records), field)
        return percentile(values, q) if values else None
    return value


def _request(field: str) -> Callable[[Record], float | None]:
    def value(record: Record) -> float | None:
        return None if failed(record) else getattr(request_times(record), field)
    return value


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("decode_tok_s", "single-request decode speed (tok/s)", False, _latency("decode_tok_s", 50),
           lambda r: None if failed(r) else decode_speed(r), 50),
    Metric("output_throughput_tok_s", "aggregate output throughput (tok/s, steady state)", False,
           lambda records: output_throughput(records)[0], None),
    Metric("acceptance_length", "mean acceptance length (tokens/verify step)", False, acceptance_length,
           lambda r: r["completion_tokens"] / r["spec_verify_ct"]
           if not failed(r) and r.get("spec_verify_ct") and r.get("completion_tokens") else None, windowed=False),
    Metric("ttft_p50_s", "median time to first token (s)", True, _latency("ttft_s", 50), _request("ttft_s"), 50),
    Metric("ttft_p99_s", "99th-percentile time to first token (s)", True, _latency("ttft_s", 99), _request("ttft_s"),
           99),
    Metric("tpot_p50_s", "median time per output token (s)", True, _latency("tpot_s", 50), _request("tpot_s"), 50),
    Metric("tpot_p99_s", "99th-percentile time per output token (s)", True, _latency("tpot_s", 99),
           _request("tpot_s"), 99),
)}

# The metrics where a smaller figure wins (the latencies): a regime on one of them ranks the smallest first.
LOWER_IS_BETTER: frozenset[str] = frozenset(name for name, m in METRICS.items() if m.lower_is_better)


# --------------------------------------------------------------------------- how far a cell can be trusted
STABILITY_SUBWINDOWS = 3
STABILITY_TOLERANCE = 0.10
STALL_FACTOR = 10.0
STALL_FLOOR_S = 0.25
MIN_SATURATION_STEPS = 8
LISTED_STALLS = 10


def subwindow_throughputs(records: Sequence[Record], start: float, end: float,
                          parts: int = STABILITY_SUBWINDOWS) -> list[float]:
    """Output tok/s of each of `parts` equal sub-windows of [start, end]; a token counts in the sub-window its
    chunk arrived in (completed requests only)."""
    width = (end - start) / parts
    if width <= 0:
        return []
    tokens = [0] * parts
    for r in records:
        if failed(r) or r.get("start_ts") is None:
            continue
        for t, n in request_times(r).arrivals:
            at = r["start_ts"] + t
            if start <= at <= end:
                tokens[min(parts - 1, int((at - start) / width))] += n
    return [n / width for n in tokens]


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / mean of sub-window figures: 0 when they agree; None without two positive-mean values."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / mean if mean > 0 else None


def stability(records: Sequence[Record], parts: int = STABILITY_SUBWINDOWS,
              tolerance: float = STABILITY_TOLERANCE) -> dict[str, Any]:
    """Whether a cell's throughput settled: its steady-state window (or the whole cell without one) cut in `parts`
    sub-windows, stable when their spread is within `tolerance`. Unstable also when no window exists."""
    window = steady_state_window(records)
    if window is None:
        starts = [r["start_ts"] for r in records if r.get("start_ts") is not None]
        ends = [r["end_ts"] for r in records if r.get("end_ts") is not None]
        window = (min(starts), max(ends)) if starts and ends else None
    values = subwindow_throughputs(records, *window, parts=parts) if window else []
    figure = spread(values)
    return {"subwindow_tok_s": values, "spread": figure, "tolerance": tolerance,
            "stable": figure is not None and figure <= tolerance}


def stalls(records: Sequence[Record], factor: float = STALL_FACTOR, floor_s: float = STALL_FLOOR_S) -> dict[str, Any]:
    """Requests whose time to first token exceeds both `factor` times the cell's median TTFT and `floor_s`: their
    count and each one's TTFT and delay beyond the median (the slowest LISTED_STALLS). Stalled requests stay in
    every figure of the cell; this only reports them."""
    ttfts = [(r.get("index"), request_times(r).ttft_s) for r in records if not failed(r)]
    ttfts = [(i, t) for i, t in ttfts if t is not None]
    if not ttfts:
        return {"count": 0, "median_ttft_s": None, "threshold_s": None, "requests": []}
    middle = median([t for _, t in ttfts])
    threshold = max(factor * middle, floor_s)
    found = sorted(((i, t) for i, t in ttfts if t > threshold), key=lambda it: -it[1])
    return {"count": len(found), "median_ttft_s": middle, "threshold_s": threshold,
            "requests": [{"index": i, "ttft_s": t, "delay_s": t - middle} for i, t in found[:LISTED_STALLS]]}


def saturation(records: Sequence[Record]) -> dict[str, Any]:
    """Whether every verify step of a cell accepted the same, largest number K >= 2 of tokens (all drafts accepted,
    e.g. NGRAM on prompts its shared n-gram store has seen, or a drafter identical to the target): each request
    took the fewest verify steps K tokens per step allow (ceil(completion / K)). K is the smallest token count a
    streamed chunk brought between a request's first and last chunk (the last step may be cut short), and every
    such chunk must bring a multiple of it: SGLang streams only the latest of the outputs queued since its last
    event, so one chunk can carry several steps. Such an acceptance measures the verify width, not the drafter."""
    verified = [r for r in records if not failed(r) and r.get("spec_verify_ct") and r.get("completion_tokens")]
    steps = sum(r["spec_verify_ct"] for r in verified)
    per_chunk = [n for r in verified for _, n in request_times(r).arrivals[1:-1]]
    k = min(per_chunk, default=0)
    saturated = (k >= 2 and steps >= MIN_SATURATION_STEPS and all(n % k == 0 for n in per_chunk)
                 and all(r["spec_verify_ct"] <= math.ceil(r["completion_tokens"] / k) for r in verified))
    reason = (f"every verify step accepted all {k} tokens (acceptance {acceptance_length(records):.2f} over "
              f"{steps} steps): all drafts accepted, as with a workload the server has seen under NGRAM or a drafter "
              "identical to the target; this acceptance measures the verify width, not the drafter"
              if saturated else None)
    return {"saturated": saturated, "tokens_per_step": k or None, "reason": reason}
