"""What the benchmark measures represents real use: distinct prompts without answers, aborts as failures, and
figures that the raw chunks of requests.jsonl reproduce (against stand-ins that audit prompts or abort)."""

from __future__ import annotations

import gzip
import json
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import yaml
from standin import FAST, Sim

from ddsweep import storage
from ddsweep.bench.cells import BenchSettings, run_benchmark
from ddsweep.bench.records import RequestRecord, cache_check
from ddsweep.bench.workloads import _humaneval_path
from ddsweep.sim import tokenizer

CODING = {"name": "coding", "kind": "coding"}
CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"


def _solutions() -> list[str]:
    with gzip.open(_humaneval_path(), "rt", encoding="utf-8") as handle:
        return [json.loads(line)["canonical_solution"].strip() for line in handle if line.strip()]


@pytest.mark.slow
def test_prompts_are_distinct_and_hold_no_humaneval_solution(tmp_path: Path) -> None:
    largest = max(yaml.safe_load(CONFIG.read_text())["benchmark"]["contexts"])
    log = tmp_path / "prompts.jsonl"
    settings = BenchSettings(contexts=[128, largest], concurrency=[16], max_new_tokens=4, requests_per_cell=64,
                             min_window_s=0, repeats=1, warmup_requests=0, workloads=[CODING])
    with closing(Sim("--sim-prompt-log", str(log), *FAST)) as sim:
        doc = run_benchmark(sim.url, tmp_path, settings, simulated=True)
    received = [json.loads(line)["text"] for line in log.read_text().splitlines()]
    assert len(received) == 2 * 64
    solutions = _solutions()
    for context in (128, largest):  # the stand-in's count of what it received tells the contexts apart
        mine = [t for t in received if abs(tokenizer.count(t) - context) <= 0.05 * context]
        assert len(mine) == 64 and len(set(mine)) >= 60, (context, len(set(mine)))
        leaked = [s for s in solutions for t in mine if s in t]
        assert not leaked, f"context {context}: prompts hold canonical solutions {leaked[:3]}"
    for cell in doc["cells"]:
        assert cell["distinct_prompts"] == 64 and cell["cached_share"] < 0.3
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    assert len({r["prompt_fingerprint"] for r in records}) == 128
    assert all(r["cached_tokens"] is not None and r["cached_tokens"] < r["prompt_tokens"] for r in records)


def test_a_stand_in_that_aborts_every_fifth_request_fails_the_cell(tmp_path: Path) -> None:
    settings = BenchSettings(contexts=[64], concurrency=[2], max_new_tokens=16, requests_per_cell=20, repeats=1,
                             min_window_s=0, warmup_requests=0, max_failure_fraction=0.1,
                             workloads=[{"name": "prose", "kind": "prose", "ignore_eos": True}])
    with closing(Sim("--sim-fault", "abort-every:5", *FAST)) as sim:
        run_benchmark(sim.url, tmp_path, settings, simulated=True)
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    failed = [r for r in records if r["error"]]
    assert len(failed) == 4 and all(r["finish_reason"] == "abort" for r in failed)
    assert {r["error"] for r in failed} == {"aborted by the server: Retracted under decode memory pressure without a "
                                            "KV backup. Retry later. (status_code 503)"}
    assert all(r["chunks"] and r["chunks"][-1][1] < 16 for r in failed)  # cut half-way, as the server aborted it
    cell = storage.read_json(tmp_path / "cells.json")["cells"][0]
    assert (cell["failed"], cell["failure_fraction"]) == (4, 0.2)
    assert cell["cell_failed"] is True and "4 of 20 requests failed (allowed fraction 0.1)" in cell["failure_reason"]
    assert "aborted by the server: Retracted under decode memory pressure" in cell["failure_reason"]
    assert cell["output_tokens"] == 16 * 16  # aborted requests' tokens count nowhere


def test_a_prompt_past_the_context_length_fails_with_the_servers_message(tmp_path: Path) -> None:
    settings = BenchSettings(contexts=[512], concurrency=[1], max_new_tokens=4, requests_per_cell=2, repeats=1,
                             min_window_s=0, warmup_requests=0, max_failure_fraction=1.0, workloads=[CODING])
    with closing(Sim("--context-length", "256", *FAST)) as sim:
        run_benchmark(sim.url, tmp_path, settings, simulated=True)
    errors = {r["error"] for r in storage.read_jsonl(tmp_path / "requests.jsonl")}
    assert len(errors) == 2 and all(e.startswith("server error in stream: The input (") and
                                    e.endswith("longer than the model's context length (256 tokens).") for e in errors)


@pytest.mark.slow
def test_ttft_tpot_and_chunk_gaps_recomputed_from_chunks_match_cells_json(tmp_path: Path) -> None:
    settings = BenchSettings(contexts=[256], concurrency=[4], max_new_tokens=32, requests_per_cell=16, repeats=1,
                             min_window_s=0, warmup_requests=0, workloads=[CODING])
    ddtree = ("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8", "--sim-step-ms", "20")
    with closing(Sim(*ddtree)) as sim:
        doc = run_benchmark(sim.url, tmp_path, settings, simulated=True)
    records = [r for r in storage.read_jsonl(tmp_path / "requests.jsonl") if not r["error"]]
    assert len(records) == 16
    ttft, tpot, gaps = [], [], []
    for r in records:  # a plain reading of docs/results-schema.md, not the package's code
        times = [t for t, _ in r["chunks"]]
        ttft.append(times[0])
        tpot.append((r["e2e_s"] - times[0]) / (r["completion_tokens"] - 1))
        gaps += list(np.diff(times))
    assert any(b - a > 1 for r in records for (_, a), (_, b) in zip(r["chunks"], r["chunks"][1:], strict=False))
    cell = doc["cells"][0]
    for name, values in (("ttft_s", ttft), ("tpot_s", tpot), ("chunk_gap_s", gaps)):
        for q in (50, 90, 99):
            assert cell[name][f"p{q}"] == pytest.approx(float(np.percentile(values, q)), rel=1e-9), (name, q)
    assert cell["token_gap_s"]["p50"] < cell["chunk_gap_s"]["p50"]  # several tokens a chunk under speculation


def test_a_repeated_prompt_hits_the_stand_ins_prefix_cache_and_the_cell_says_so() -> None:
    text = "def add(a, b):\n    return a + b\n" * 20
    with closing(Sim(*FAST)) as sim:
        first, again = (sim.generate(text, n=2).json()["meta_info"] for _ in range(2))
    assert first["cached_tokens"] == 0 and again["cached_tokens"] == again["prompt_tokens"] - 1
    records = [RequestRecord(128, 2, 0, i, False, prompt_fingerprint=fp, cached_tokens=cached)
               for i, (fp, cached) in enumerate([("a", 3), ("b", 3), ("a", 9)])]
    check = cache_check(records, [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4]])
    assert check == {"common_prefix_tokens": 3, "cached_beyond_common_prefix": 1, "repeated_prompts": 1}
