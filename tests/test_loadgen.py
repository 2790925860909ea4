"""The load generator against a stand-in started in a subprocess, and its per-request arithmetic."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from test_simserver import FAST, Sim

from ddsweep import storage
from ddsweep.loadgen import BenchmarkError, BenchSettings, RequestRecord, _Transport, run_benchmark, run_request


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    """A healthy DDTree stand-in and one that fails half of its requests, started in parallel."""
    started = {"ok": Sim("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8", *FAST, wait=False),
               "bad": Sim("--sim-fault", "error-rate:0.5", *FAST, wait=False)}
    try:
        for sim in started.values():
            sim.wait_healthy(timeout=60)
        yield started
    finally:
        for sim in started.values():
            sim.close()


def test_benchmark_records_and_figures(sims: dict[str, Sim], tmp_path: Path) -> None:
    settings = BenchSettings(contexts=[64, 256], concurrency=[1, 3], max_new_tokens=24, requests_per_cell=4,
                             repeats=2, warmup_requests=2)
    lines: list[str] = []
    doc = run_benchmark(sims["ok"].url, tmp_path, settings, simulated=True, progress=lines.append)
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    assert storage.read_json(tmp_path / "cells.json") == json.loads(json.dumps(doc))
    assert len(records) == 2 * 2 * (2 + 2 * 4)
    assert sum(r["warmup"] for r in records) == 2 * 2 * 2
    assert all(r["error"] is None and r["completion_tokens"] == 24 and r["simulated"] for r in records)
    assert len({r["prompt_tokens"] for r in records if r["context"] == 64}) >= 1
    assert all(abs(r["prompt_tokens"] - r["context"]) <= 0.03 * r["context"] + 2 for r in records)
    assert len(doc["cells"]) == 8 and len(doc["groups"]) == 4 and doc["simulated"] is True
    for cell in doc["cells"]:
        measured = [r for r in records if not r["warmup"] and (r["context"], r["concurrency"], r["repeat"]) ==
                    (cell["context"], cell["concurrency"], cell["repeat"])]
        assert cell["requests"] == cell["completed"] == len(measured) == 4  # warmup excluded
        ratio = sum(r["completion_tokens"] for r in measured) / sum(r["spec_verify_ct"] for r in measured)
        assert cell["acceptance_length"] == pytest.approx(ratio)
        assert cell["output_tokens"] == 4 * 24
        assert cell["output_throughput_tok_s"] == pytest.approx(cell["output_tokens"] / cell["wall_s"])
    for r in records:
        assert len(r["itl_s"]) == r["completion_tokens"] - 1
        assert sum(r["itl_s"]) <= r["decode_s"] + 1e-6
        assert r["e2e_s"] == pytest.approx(r["ttft_s"] + r["decode_s"])
    group = doc["groups"][0]
    assert group["repeats"] == 2 and len(group["output_throughput_tok_s"]["values"]) == 2
    assert any(line.startswith("cell 8/8") for line in lines)


def test_failures_recorded_and_error_raised_after_files(sims: dict[str, Sim], tmp_path: Path) -> None:
    settings = BenchSettings(contexts=[64], concurrency=[2], max_new_tokens=8, requests_per_cell=10, repeats=2,
                             warmup_requests=0, max_failure_fraction=0.1)
    with pytest.raises(BenchmarkError, match="requests failed"):
        run_benchmark(sims["bad"].url, tmp_path, settings, simulated=True)
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    assert len(records) == 10  # the first cell, then the error
    failed = [r for r in records if r["error"]]
    assert failed and all(r["error"].startswith("HTTP 500") for r in failed)
    cells = storage.read_json(tmp_path / "cells.json")["cells"]
    assert cells[0]["failed"] == len(failed) and cells[0]["completed"] == 10 - len(failed)


class _Scripted(_Transport):
    """A transport replaying SSE payloads with given delays."""

    def __init__(self, chunks: list[tuple[float, bytes]]) -> None:
        self.chunks = chunks

    async def stream(self, url: str, payload: dict) -> AsyncIterator[bytes]:
        for delay, data in self.chunks:
            await asyncio.sleep(delay)
            yield data


def _chunk(tokens: int, verify: int) -> bytes:
    return json.dumps({"text": "x", "meta_info": {"prompt_tokens": 5, "completion_tokens": tokens,
                                                  "spec_verify_ct": verify, "finish_reason": None}}).encode()


def test_itl_splits_chunk_gaps_and_acceptance() -> None:
    chunks = [(0.01, _chunk(1, 0)), (0.04, _chunk(5, 1)), (0.02, _chunk(7, 2)), (0.0, b"[DONE]")]
    rec = asyncio.run(run_request(_Scripted(chunks), "http://x", "p", 7, RequestRecord(1, 1, 0, 0, False)))
    assert rec.error is None and rec.completion_tokens == 7 and rec.spec_verify_ct == 2
    assert rec.acceptance_length == 3.5
    assert len(rec.itl_s) == 6
    assert len(set(rec.itl_s[:4])) == 1 and len(set(rec.itl_s[4:])) == 1
    assert rec.itl_s[0] == pytest.approx(0.01, abs=0.008) and rec.itl_s[4] == pytest.approx(0.01, abs=0.008)


def test_cut_and_malformed_streams_are_errors() -> None:
    cut = asyncio.run(run_request(_Scripted([(0, _chunk(1, 0))]), "http://x", "p", 7,
                                  RequestRecord(1, 1, 0, 0, False)))
    assert cut.error is not None and "without [DONE]" in cut.error
    bad = asyncio.run(run_request(_Scripted([(0, _chunk(1, 0)), (0, b'{"text": ')]), "http://x", "p", 7,
                                  RequestRecord(1, 1, 0, 0, False)))
    assert bad.error is not None and bad.error.startswith("malformed")
