"""Per-request records of the benchmark: one streamed request, its record, and the figures of a cell."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from ddsweep import figures
from ddsweep.bench import metrics
from ddsweep.bench.transport import HttpError, ProtocolError, StreamState, Transport


@dataclass
class RequestRecord:
    """One benchmark request, as one line of requests.jsonl (see docs/results-schema.md); its latency figures are
    computed from `chunks`, `e2e_s` and `completion_tokens` by ddsweep.figures."""

    context: int
    concurrency: int
    repeat: int
    index: int
    warmup: bool
    workload: str = ""
    prompt_source: str | None = None
    prompt_fingerprint: str | None = None
    max_new_tokens: int | None = None
    ignore_eos: bool | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    start_ts: float | None = None
    end_ts: float | None = None
    e2e_s: float | None = None
    chunks: list[list[float]] = field(default_factory=list)
    spec_verify_ct: int | None = None
    acceptance_length: float | None = None
    engine_accept_length: float | None = None  # SGLang's own meta_info.spec_accept_length, where it sends one
    error: str | None = None
    simulated: bool = False

    @property
    def ok(self) -> bool:
        """Whether the request completed without error."""
        return self.error is None


# --------------------------------------------------------------------------- one request
async def run_request(transport: Transport, url: str, prompt: str | list[int], max_new_tokens: int,
                      record: RequestRecord, ignore_eos: bool = False) -> RequestRecord:
    """Send one streaming greedy /generate request (text, or token ids) and fill `record` with its stream.

    The end is the arrival of [DONE]. The asyncio client starts the clock as it writes the request to an open
    connection (just before: the server sees nothing before) and times each chunk in `data_received`, as its
    bytes arrive;
    aiohttp and httpx start it when the call is made and time a chunk when its line is handed over. A request
    fails (its `error` names why, with the server's message where it sent one) on an HTTP error, an error event or
    an abort in the stream, a malformed chunk, or a stream cut before [DONE].
    """
    payload = {"text" if isinstance(prompt, str) else "input_ids": prompt, "stream": True,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": ignore_eos}}
    record.max_new_tokens, record.ignore_eos = max_new_tokens, ignore_eos
    clock = time.perf_counter
    wall0, perf0 = time.time(), clock()
    record.start_ts = wall0
    state = StreamState(record.chunks)
    try:
        await transport.request(url + "/generate", payload, state)
    except HttpError as exc:
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
    record.e2e_s = round(end - t0, 6)  # to the microsecond, as the chunks: the last chunk is never after the end
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
    if meta:
        _fill_from_meta(record, meta)
    return record


def abort_message(reason: dict) -> str:
    """The error of a request SGLang aborted (`finish_reason` `{"type": "abort", "message", "status_code",
    "err_type"}`, managers/schedule_batch.py FINISH_ABORT): the server's message with its status and type."""
    details = ", ".join(f"{key} {reason[key]}" for key in ("status_code", "err_type") if reason.get(key) is not None)
    return f"aborted by the server: {reason.get('message') or 'Aborted'}" + (f" ({details})" if details else "")


def _fill_from_meta(record: RequestRecord, meta: dict) -> None:
    record.prompt_tokens = meta.get("prompt_tokens")
    record.cached_tokens = meta.get("cached_tokens")
    record.completion_tokens = meta.get("completion_tokens")
    reason = meta.get("finish_reason")
    record.finish_reason = reason.get("type") if isinstance(reason, dict) else reason
    if record.finish_reason == "abort":
        record.error = record.error or abort_message(reason if isinstance(reason, dict) else {})
    done = record.completion_tokens
    if record.finish_reason == "length" and done is not None and record.max_new_tokens and done < record.max_new_tokens:
        # SGLang lowers max_new_tokens (to its memory, SGLANG_MAX_NEW_TOKENS_LIMIT, or the context length with
        # --allow-auto-truncate) and still says `length`
        record.error = record.error or (f"the server stopped the request at {done} of the {record.max_new_tokens} "
                                        "new tokens asked (finish_reason length): it capped max_new_tokens, e.g. to "
                                        "fit the model's context length")
    verify = meta.get("spec_verify_ct")
    if verify is not None:
        record.spec_verify_ct = int(verify)
        if verify and record.completion_tokens:
            record.acceptance_length = record.completion_tokens / verify
    if isinstance(meta.get("spec_accept_length"), (int, float)):
        record.engine_accept_length = float(meta["spec_accept_length"])


# --------------------------------------------------------------------------- figures
def cell_figures(records: list[RequestRecord], stall_factor: float = figures.STALL_FACTOR,
                 stall_floor_s: float = figures.STALL_FLOOR_S) -> dict:
    """Figures of one cell from its measured (non-warmup) requests, per docs/results-schema.md (ddsweep.figures),
    with its first-token stalls (kept in every figure, reported) and whether its acceptance is saturated."""
    with figures.one_cell():
        return _cell_figures([vars(r) for r in records if not r.warmup], stall_factor, stall_floor_s)


def _cell_figures(measured: list[dict], stall_factor: float, stall_floor_s: float) -> dict:
    """cell_figures of the measured requests' records, inside figures.one_cell()."""
    done = [r for r in measured if not figures.failed(r)]
    wall = figures.wall_s(measured)
    samples = figures.cell_samples(measured)
    decode = samples.decode_tok_s
    fingerprints = [r["prompt_fingerprint"] for r in measured if r.get("prompt_fingerprint")]
    return {
        "requests": len(measured), "completed": len(done), "failed": len(measured) - len(done),
        "failure_fraction": (len(measured) - len(done)) / len(measured) if measured else None,
        "errors": dict(Counter(_error_kind(r["error"]) for r in measured if figures.failed(r))),
        "wall_s": wall, "output_tokens": sum(r["completion_tokens"] or 0 for r in done),
        "output_throughput_tok_s": figures.whole_output_throughput(measured),
        "decode_tok_s": {"median": figures.median(decode) if decode else None,
                         "p10": figures.percentile(decode, 10) if decode else None,
                         "p90": figures.percentile(decode, 90) if decode else None},
        "ttft_s": figures.percentiles(samples.ttft_s),
        "tpot_s": figures.percentiles(samples.tpot_s),
        "chunk_gap_s": figures.percentiles(samples.chunk_gaps_s),
        "token_gap_s": figures.percentiles(samples.token_gaps_s),
        "e2e_s": figures.percentiles(samples.e2e_s),
        "acceptance_length": figures.acceptance_length(measured),
        "prompt_tokens_mean": (sum(r["prompt_tokens"] or 0 for r in done) / len(done)) if done else None,
        "cached_share": figures.cached_share(measured),
        "distinct_prompts": len(set(fingerprints)) if fingerprints else None,
        "output_tokens_per_request": _lengths([r["completion_tokens"] for r in done
                                               if r["completion_tokens"] is not None]),
        "finish_reasons": dict(Counter(str(r["finish_reason"]) for r in done)),
        "at_concurrency_fraction": figures.at_concurrency_fraction(measured) if measured else None,
        "steady_state": figures.steady_state(measured),
        "stalls": figures.stalls(measured, stall_factor, stall_floor_s),
        "saturation": figures.saturation(measured),
    }


def cache_check(records: list[RequestRecord], prompts: list[list[int]]) -> dict:
    """What the prefix cache served beyond what the workload means to share: the token prefix all of a cell's
    prompts have in common (chat template, instruction) and how many requests the server reported more cached
    tokens for (a repeated prompt, or prompts sharing more than that), and how many prompts repeat another."""
    common = len(os.path.commonprefix(prompts)) if prompts else 0
    measured = [r for r in records if not r.warmup]
    return {"common_prefix_tokens": common,
            "cached_beyond_common_prefix": sum(1 for r in measured if (r.cached_tokens or 0) > common),
            "repeated_prompts": len(measured) - len({r.prompt_fingerprint for r in measured})}


def _error_kind(error: str) -> str:
    """A failed request's error without its details, to count failures of one kind together."""
    return error.split(":", 1)[0] if not error.startswith("aborted by the server") else "aborted by the server"


def _lengths(values: list[int]) -> dict:
    """Mean, min, median and max of per-request output lengths (they differ when requests stop naturally)."""
    if not values:
        return {"mean": None, "min": None, "p50": None, "max": None}
    return {"mean": sum(values) / len(values), "min": min(values), "p50": figures.median(values),
            "max": max(values)}


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
