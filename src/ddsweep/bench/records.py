"""Per-request records of the benchmark: one streamed request, its record, and the figures of a cell."""

from __future__ import annotations

import asyncio
import json
import time
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
async def run_request(transport: _Transport, url: str, prompt: str, max_new_tokens: int,
                      record: RequestRecord) -> RequestRecord:
    """Send one streaming greedy /generate request and fill `record` with its timings and counts.

    The end is the arrival of [DONE]. The asyncio client starts the clock when the request is written to an open
    connection (the server sees nothing before) and times each chunk in `data_received`, as its bytes arrive;
    aiohttp and httpx start it when the call is made and time a chunk when its line is handed over.
    """
    payload = {"text": prompt, "stream": True,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
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
    }


def group_figures(cells: list[dict]) -> list[dict]:
    """Per (context, concurrency): median and 95% CI across repeats of the headline figures."""
    keys: dict[tuple[int, int], list[dict]] = {}
    for cell in cells:
        keys.setdefault((cell["context"], cell["concurrency"]), []).append(cell)
    groups = []
    for (context, conc), members in keys.items():
        groups.append({
            "context": context, "concurrency": conc, "repeats": len(members),
            "output_throughput_tok_s": metrics.summarize_repeats([c["output_throughput_tok_s"] for c in members]),
            "decode_tok_s": metrics.summarize_repeats([c["decode_tok_s"]["median"] for c in members]),
            "acceptance_length": metrics.summarize_repeats([c["acceptance_length"] for c in members]),
            "ttft_p50_s": metrics.summarize_repeats([c["ttft_s"]["p50"] for c in members]),
            "tpot_p50_s": metrics.summarize_repeats([c["tpot_s"]["p50"] for c in members]),
        })
    return groups

