"""A hung server is named after the stall timeout and one unanswered probe; a slow server that still streams, or
one silent for a while that answers the probe, is not a hang."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from standin import FAST, Sim, healthy_together

from ddsweep import storage
from ddsweep.bench.cells import BenchSettings, run_benchmark
from ddsweep.bench.hangs import PROBE_TIMEOUT_S, STALL_FRACTION, HangWatch, ServerHang, stall_timeout

PROSE = {"name": "prose", "kind": "prose", "ignore_eos": True}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    """Stand-ins started in parallel: one whose scheduler stops after 3 generate requests, one that takes 0.13 s per
    decode step (slower than the stall timeout per request, faster per token), one that holds every 3rd request
    0.9 s before the scheduler sees it."""
    started = {"hang": Sim(*FAST, "--sim-fault", "hang:3", wait=False),
               "slow": Sim("--sim-step-ms", "130", wait=False),
               "silent": Sim(*FAST, "--sim-fault", "stall-every:3,0.9", wait=False)}
    yield from healthy_together(started)


def _settings(**changes: object) -> BenchSettings:
    base = {"contexts": [64], "concurrency": [2], "max_new_tokens": 8, "requests_per_cell": 4, "repeats": 2,
            "warmup_requests": 1, "workloads": [PROSE], "request_timeout_s": 60, "stall_timeout_s": 0.5,
            "cell_order": "fixed"}
    return BenchSettings(**{**base, **changes})


def test_the_default_stall_timeout_is_a_tenth_of_the_request_timeout_and_the_probe_is_capped():
    assert stall_timeout(None, 900) == STALL_FRACTION * 900 == 90 and stall_timeout(5, 900) == 5
    assert HangWatch(90).probe_timeout_s == PROBE_TIMEOUT_S == 20 and HangWatch(0.5).probe_timeout_s == 0.5


def test_a_silent_server_that_does_not_answer_the_probe_is_a_hang_named_in_seconds(sims, tmp_path: Path):
    started = time.monotonic()
    with pytest.raises(ServerHang) as raised:
        run_benchmark(sims["hang"].url, tmp_path, _settings(), simulated=True)
    elapsed = time.monotonic() - started
    # the fourth request stops the scheduler: requests in flight then (the third, maybe) get no more tokens either
    assert elapsed < 20, elapsed  # not the 60 s request timeout (a loaded CPU slows the stand-in and the client)
    hang = raised.value.record()
    assert hang["stall_timeout_s"] == 0.5 and hang["probe_timeout_s"] == 0.5 and hang["probe_error"] is None
    # each figure is rounded to the millisecond on its own: their difference may be 1 ms short of the probe's 0.5 s
    assert 0.5 <= hang["silent_s"] < 10 and hang["waited_s"] - hang["silent_s"] >= 0.499 and hang["in_flight"] >= 1
    assert "the server hung: no token arrived for" in str(raised.value)
    doc = storage.read_json(tmp_path / "cells.json")
    assert doc["hang"]["waited_s"] == hang["waited_s"] and not doc["hang"]["stall_probes"][0]["answered"]
    # every request sent is on disk: the answered ones, and those in flight marked with the hang
    lines = storage.read_jsonl(tmp_path / "requests.jsonl")
    hung = [r for r in lines if r["error"] and r["error"].startswith("server hang: no answer for")]
    assert len(hung) == hang["in_flight"] and len(lines) == len(hung) + sum(r["error"] is None for r in lines) >= 3


@pytest.mark.slow
def test_a_slow_server_that_still_streams_is_not_a_hang(sims, tmp_path: Path):
    doc = run_benchmark(sims["slow"].url, tmp_path, _settings(repeats=1, max_new_tokens=5), simulated=True)
    (cell,) = doc["cells"]
    assert cell["completed"] == cell["requests"] == 4 and cell["stall_probes"] == []
    assert cell["e2e_s"]["p50"] > 0.5  # every request outlasts the stall timeout; its tokens never pause that long


@pytest.mark.slow
def test_a_silent_server_that_answers_the_probe_goes_on_and_the_probe_is_recorded(sims, tmp_path: Path):
    doc = run_benchmark(sims["silent"].url, tmp_path, _settings(concurrency=[1], repeats=1), simulated=True)
    probes = [p for cell in [*doc["warmups"], *doc["cells"]] for p in cell["stall_probes"]]
    assert probes and all(p["answered"] and p["silent_s"] >= 0.5 for p in probes), probes
    assert all(cell["completed"] == cell["requests"] for cell in doc["cells"])
    assert "hang" not in doc
