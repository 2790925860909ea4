"""Per-request records of the benchmark: one streamed request, its record, and the figures of a cell."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from ddsweep.bench import metrics
from ddsweep.bench.transport import ProtocolError, _HttpError, _StreamState, _Transport


@dataclass
class RequestRecord:
    """One benchmark request, as one line of requests.jsonl (see docs/results-schema.md)."""

    context: int
    concurrency: int
    repeat: int
    index: int
    warmup: bool
    workload: str = ""
    prompt_source: str | None = None
    max_new_tokens: int | None = None
    ignore_eos: bool | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    start_ts: float | None = None
    end_ts: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    decode_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    spec_verify_ct: int | None = None
    acceptance_length: float | None = None
    error: str | None = None
    simulated: bool = False

    @property
    def ok(self) -> bool:
        """Whether the request completed without error."""
        return self.error is None

# --------------------------------------------------------------------------- one request
async def run_request(transport: _Transport, url: str, prompt: str | list[int], max_new_tokens: int,
                      record: RequestRecord, ignore_eos: bool = False) -> RequestRecord:
    """Send one streaming greedy /generate request (text, or token ids) and fill `record` with its timings.

    The end is the arrival of [DONE]. The asyncio client starts the clock when the request is written to an open
    connection (the server sees nothing before) and times each chunk in `data_received`, as its bytes arrive;
    aiohttp and httpx start it when the call is made and time a chunk when its line is handed over.
    """
    payload = {"text" if isinstance(prompt, str) else "input_ids": prompt, "stream": True,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": ignore_eos}}
    record.max_new_tokens, record.ignore_eos = max_new_tokens, ignore_eos
    clock = time.perf_counter
    wall0, perf0 = time.time(), clock()
    record.start_ts = wall0
    state = _StreamState(record.itl_s)
    try:
        await transport.request(url + "/generate", payload, state)
    except _HttpError as exc:
        record.error = str(exc)
    except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, ProtocolError) as exc:
        record.error = f"{type(exc).__name__}: {exc or 'connection error'}"
    except Exception as exc:  # aiohttp's errors, without importing it when unused
        if type(exc).__module__.split(".")[0] != "aiohttp":
            raise
        record.error = f"{type(exc).__name__}: {exc or 'connection error'}"
    end = state.end if state.end is not None else clock()
    t0 = state.t0 if state.t0 is not None else perf0
    record.start_ts = wall0 + (t0 - perf0)
    record.end_ts = wall0 + (end - perf0)
    record.error = record.error or state.error
    meta: dict = {}
    if state.final:
        try:
            meta = json.loads(state.final)["meta_info"]
            if not isinstance(meta, dict):
                raise TypeError("meta_info is not an object")
        except (ValueError, KeyError, TypeError):
            meta = {}
            record.error = record.error or f"malformed stream chunk: {state.final[:80].decode('utf-8', 'replace')!r}"
    if record.error is None and not state.done:
        record.error = "stream ended without [DONE] (connection closed mid-stream)"
    _fill_from_meta(record, meta, t0, state.first, end)
    return record


def _fill_from_meta(record: RequestRecord, meta: dict, t0: float, first: float | None, end: float) -> None:
    record.e2e_s = end - t0
    if first is not None:
        record.ttft_s = first - t0
        record.decode_s = end - first
    if meta:
        record.prompt_tokens = meta.get("prompt_tokens")
        record.completion_tokens = meta.get("completion_tokens")
        reason = meta.get("finish_reason")
        record.finish_reason = reason.get("type") if isinstance(reason, dict) else reason
        verify = meta.get("spec_verify_ct")
        if verify is not None:
            record.spec_verify_ct = int(verify)
            if verify and record.completion_tokens:
                record.acceptance_length = record.completion_tokens / verify


# --------------------------------------------------------------------------- figures
def cell_figures(records: list[RequestRecord]) -> dict:
    """Figures of one cell from its measured (non-warmup) requests, per docs/results-schema.md."""
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    starts = [r.start_ts for r in measured if r.start_ts is not None]
    ends = [r.end_ts for r in measured if r.end_ts is not None]
    wall = (max(ends) - min(starts)) if starts and ends else None
    tokens = sum(r.completion_tokens or 0 for r in done)
    decode = [(r.completion_tokens - 1) / r.decode_s for r in done
              if r.completion_tokens and r.completion_tokens > 1 and r.decode_s]
    tpot = [r.decode_s / (r.completion_tokens - 1) for r in done
            if r.completion_tokens and r.completion_tokens > 1 and r.decode_s is not None]
    verify = [r for r in done if r.spec_verify_ct]
    return {
        "requests": len(measured), "completed": len(done), "failed": len(measured) - len(done),
        "wall_s": wall, "output_tokens": tokens,
        "output_throughput_tok_s": tokens / wall if wall else None,
        "decode_tok_s": {"median": metrics.median(decode) if decode else None,
                         "p10": metrics.percentile(decode, 10) if decode else None,
                         "p90": metrics.percentile(decode, 90) if decode else None},
        "ttft_s": metrics.percentiles([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_s": metrics.percentiles(tpot),
        "itl_s": metrics.percentiles([g for r in done for g in r.itl_s]),
        "e2e_s": metrics.percentiles([r.e2e_s for r in done if r.e2e_s is not None]),
        "acceptance_length": (sum(r.completion_tokens or 0 for r in verify) / sum(r.spec_verify_ct or 0
                                                                                    for r in verify))
        if verify else None,
        "prompt_tokens_mean": (sum(r.prompt_tokens or 0 for r in done) / len(done)) if done else None,
        "output_tokens_per_request": _lengths([r.completion_tokens for r in done if r.completion_tokens is not None]),
        "finish_reasons": dict(Counter(str(r.finish_reason) for r in done)),
        "at_concurrency_fraction": _at_concurrency_fraction(measured),
        "steady_state": steady_state_figures(measured),
    }


def _lengths(values: list[int]) -> dict:
    """Mean, min, median and max of per-request output lengths (they differ when requests stop naturally)."""
    if not values:
        return {"mean": None, "min": None, "p50": None, "max": None}
    return {"mean": sum(values) / len(values), "min": min(values), "p50": metrics.median(values),
            "max": max(values)}


def _in_flight_steps(records: list[RequestRecord]) -> list[tuple[float, int]]:
    """(time, requests in flight from then on) after every send and every completion, in time order."""
    events = sorted([(r.start_ts, 1) for r in records if r.start_ts is not None and r.end_ts is not None] +
                    [(r.end_ts, -1) for r in records if r.start_ts is not None and r.end_ts is not None])
    steps, level = [], 0
    for ts, delta in events:
        level += delta
        steps.append((ts, level))
    return steps


def _at_concurrency_fraction(records: list[RequestRecord]) -> float | None:
    """Fraction of the cell's wall time with the full concurrency C in flight."""
    if not records:
        return None
    conc, steps = records[0].concurrency, _in_flight_steps(records)
    if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
        return None
    full = sum(b[0] - a[0] for a, b in zip(steps, steps[1:], strict=False) if a[1] >= conc)
    return full / (steps[-1][0] - steps[0][0])


def steady_state_window(records: list[RequestRecord]) -> tuple[float, float] | None:
    """(start, end) wall times of the steady state: from when C requests are first in flight until the first of
    the last C completions; None when the cell never reaches C in flight or has no such window."""
    if not records:
        return None
    conc = records[0].concurrency
    steps = _in_flight_steps(records)
    start = next((ts for ts, level in steps if level >= conc), None)
    ends = sorted(r.end_ts for r in records if r.start_ts is not None and r.end_ts is not None)
    if start is None or len(ends) < conc:
        return None
    end = ends[len(ends) - conc]
    return (start, end) if end > start else None


def _token_times(record: RequestRecord) -> list[float]:
    """Wall arrival time of each output token, from the send time, TTFT and the per-token gaps."""
    if record.start_ts is None or record.ttft_s is None:
        return []
    times = [record.start_ts + record.ttft_s]
    for gap in record.itl_s:
        times.append(times[-1] + gap)
    return times


def steady_state_figures(records: list[RequestRecord]) -> dict:
    """Figures over the steady-state window only (see `steady_state_window`); all None without a window."""
    window = steady_state_window(records)
    if window is None:
        return {"start_ts": None, "end_ts": None, "duration_s": None, "output_tokens": None,
                "output_throughput_tok_s": None, "completed": None, "requests_per_s": None,
                "ttft_s": metrics.percentiles([]), "tpot_s": metrics.percentiles([]), "in_flight_mean": None}
    start, end = window
    done = [r for r in records if r.ok]
    tokens = sum(1 for r in done for t in _token_times(r) if start <= t <= end)
    completed = sum(1 for r in done if r.end_ts is not None and start < r.end_ts <= end)
    inside = [r for r in done if r.start_ts is not None and r.end_ts is not None and start <= r.start_ts
              and r.end_ts <= end]
    steps = _in_flight_steps(records)
    area = 0.0
    for (t0, level), (t1, _) in zip(steps, steps[1:], strict=False):
        lo, hi = max(t0, start), min(t1, end)
        if hi > lo:
            area += level * (hi - lo)
    duration = end - start
    return {
        "start_ts": start, "end_ts": end, "duration_s": duration, "output_tokens": tokens,
        "output_throughput_tok_s": tokens / duration, "completed": completed, "requests_per_s": completed / duration,
        "ttft_s": metrics.percentiles([r.ttft_s for r in inside if r.ttft_s is not None]),
        "tpot_s": metrics.percentiles([r.decode_s / (r.completion_tokens - 1) for r in inside
                                       if r.completion_tokens and r.completion_tokens > 1 and r.decode_s]),
        "in_flight_mean": area / duration,
    }


def group_figures(cells: list[dict]) -> list[dict]:
    """Per (workload, context, concurrency): median and 95% CI across repeats of the headline figures."""
    keys: dict[tuple[str, int, int], list[dict]] = {}
    for cell in cells:
        keys.setdefault((cell.get("workload", ""), cell["context"], cell["concurrency"]), []).append(cell)
    groups = []
    for (workload, context, conc), members in keys.items():
        groups.append({
            "workload": workload, "context": context, "concurrency": conc, "repeats": len(members),
            "output_throughput_tok_s": metrics.summarize_repeats([c["output_throughput_tok_s"] for c in members]),
            "decode_tok_s": metrics.summarize_repeats([c["decode_tok_s"]["median"] for c in members]),
            "acceptance_length": metrics.summarize_repeats([c["acceptance_length"] for c in members]),
            "ttft_p50_s": metrics.summarize_repeats([c["ttft_s"]["p50"] for c in members]),
            "tpot_p50_s": metrics.summarize_repeats([c["tpot_s"]["p50"] for c in members]),
            "steady_output_throughput_tok_s": metrics.summarize_repeats(
                [c["steady_state"]["output_throughput_tok_s"] for c in members]),
        })
    return groups

