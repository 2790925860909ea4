"""A hung server named in seconds: when no token has arrived for `benchmark.stall_timeout_s` while requests are in
flight, the cell probes the server with a one-token generation, as SGLang's `/health_generate` does (its `/health`
does too in 0.5.23, unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is off: then it answers while generation
hangs); a probe that gets nothing either ends the cell as a hang.

A server that streams slowly is never probed: any token of any in-flight request, or a request that ends with the
server's answer (an error included), counts as a sign of life. A probe that is answered is recorded with the cell
and the cell goes on."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ddsweep.bench.records import RequestRecord, run_request
from ddsweep.bench.transport import Transport

# Default stall_timeout_s: this fraction of request_timeout_s (90 s at the default 900 s). A working server's longest
# silence over all its in-flight requests is one prefill of one request (chunked) or a one-time kernel compile; a
# tenth of the time a whole request may take leaves room for that and names a hang ten times sooner than the
# request timeout would.
STALL_FRACTION = 0.1
# The probe waits at most this long (SGLang's /health_generate waits 20 s, SGLANG_HEALTH_CHECK_TIMEOUT), and never
# longer than the stall timeout itself.
PROBE_TIMEOUT_S = 20.0


def stall_timeout(stall_timeout_s: float | None, request_timeout_s: float) -> float:
    """The stall timeout in effect: the configured one, else STALL_FRACTION of the request timeout."""
    return float(stall_timeout_s) if stall_timeout_s is not None else STALL_FRACTION * float(request_timeout_s)


@dataclass(frozen=True)
class Probe:
    """One probe of a silent server: how long nothing had arrived, with how many requests in flight, and its
    answer (`answered`, its duration, or the error it got)."""

    at_ts: float
    silent_s: float
    in_flight: int
    answered: bool
    probe_s: float
    error: str | None


class ServerHang(RuntimeError):
    """The server sent nothing for the stall timeout and did not answer a one-token probe: the cell was stopped."""

    def __init__(self, probe: Probe, stall_timeout_s: float, probe_timeout_s: float) -> None:
        what = f"got no answer within {probe_timeout_s:g} s" if probe.error is None else f"failed ({probe.error})"
        super().__init__(
            f"the server hung: no token arrived for {probe.silent_s:.1f} s while {probe.in_flight} request(s) were "
            f"in flight (benchmark.stall_timeout_s {stall_timeout_s:g} s), and a one-token generation probe {what}; "
            f"the point stopped sending after {probe.silent_s + probe.probe_s:.1f} s without an answer")
        self.probe = probe
        self.stall_timeout_s = stall_timeout_s
        self.probe_timeout_s = probe_timeout_s

    def record(self) -> dict[str, Any]:
        """What failure.json records of the hang (docs/results-schema.md, `hang`)."""
        return {"waited_s": round(self.probe.silent_s + self.probe.probe_s, 3),
                "silent_s": round(self.probe.silent_s, 3), "in_flight": self.probe.in_flight,
                "stall_timeout_s": self.stall_timeout_s, "probe_timeout_s": self.probe_timeout_s,
                "probe_error": self.probe.error}


@dataclass
class HangWatch:
    """Watches one cell for a silent server: `heard` is when the server last showed life (perf_counter seconds),
    `progress` the count of what it has sent so far; the probes made are kept for the cell's record."""

    stall_timeout_s: float
    probes: list[Probe] = field(default_factory=list)
    heard: float = field(default_factory=time.perf_counter)
    progress: int = -1

    @property
    def probe_timeout_s(self) -> float:
        """How long a probe may take: at most PROBE_TIMEOUT_S, at most the stall timeout."""
        return min(PROBE_TIMEOUT_S, self.stall_timeout_s)

    @property
    def interval_s(self) -> float:
        """How often the cell looks for progress."""
        return max(0.02, min(1.0, self.stall_timeout_s / 4))

    def observe(self, progress: int, in_flight: int, now: float) -> float | None:
        """Note the server's progress count; returns how long it has been silent when that reaches the stall
        timeout with requests in flight, else None."""
        if progress != self.progress or not in_flight:
            self.progress, self.heard = progress, now
            return None
        silent = now - self.heard
        return silent if silent >= self.stall_timeout_s else None

    def records(self) -> list[dict[str, Any]]:
        """The cell's probes as JSON objects (cells.json `stall_probes`)."""
        return [asdict(p) for p in self.probes]


async def probe(transport: Transport, url: str, input_ids: list[int], timeout_s: float) -> tuple[bool, float,
                                                                                                 str | None]:
    """Ask the server for one greedy token of `input_ids` on the benchmark's own transport: (answered, seconds
    taken, the error when it failed other than by timing out)."""
    record = RequestRecord(context=0, concurrency=0, repeat=0, index=-1, warmup=True)
    started = time.perf_counter()
    try:
        await asyncio.wait_for(run_request(transport, url, input_ids, 1, record), timeout_s)
    except asyncio.TimeoutError:
        return False, time.perf_counter() - started, None
    elapsed = time.perf_counter() - started
    if record.error is not None:
        return False, elapsed, record.error
    return bool(record.completion_tokens), elapsed, None if record.completion_tokens else "no token in the answer"
