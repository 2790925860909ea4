"""The presets for released speculative algorithms and the ddtree-v2 build run end to end against the stand-in,
which resolves their flags as SGLang does (STANDALONE, NGRAM, DDTREE with its own block-size flag)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import demo_record
from standin import Sim

from ddsweep.point.run import run_point

BENCH = {"contexts": [128, 2048], "concurrency": [1, 8], "max_new_tokens": 32, "requests_per_cell": 3, "repeats": 2,
         "warmup_requests": 0, "workloads": [{"name": "coding", "kind": "coding"}]}
POINTS = [{"preset": "standalone", "budget": 4, "topk": 1, "block_size": 5},
          {"preset": "ngram", "block_size": 8, "window": None},
          {"preset": "ddtree-v2", "budget": 16, "topk": 1, "block_size": 8, "window": None}]


@pytest.mark.slow
@pytest.mark.parametrize(("point_id", "expected"), [
    ("standalone-bs5-b4-t1-woff", {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 4,
                                   "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5}),
    ("ngram-bs8", {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}),
    ("ddtree-v2-bs8-b16-t1-woff", {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 16,
                                   "speculative_ddtree_block_size": 8, "speculative_num_draft_tokens": 8,
                                   "speculative_dflash_block_size": None}),
])
def test_engine_presets_verify_and_measure_against_the_stand_in(point_id: str, expected: dict,
                                                                 tmp_path: Path) -> None:
    record = demo_record(point_id, benchmark=BENCH, coding_eval={"enabled": False},
                         sweep={"points": POINTS})
    status = run_point(record, tmp_path, progress=lambda _: None)
    assert status["status"] == "ok", status
    verification = json.loads((tmp_path / "verification.json").read_text())
    assert verification["ok"], verification
    info = json.loads((tmp_path / "server_info.json").read_text())
    assert {key: info[key] for key in expected} == expected
    assert info["max_running_requests"] == 48
    rows = [json.loads(line) for line in (tmp_path / "bench" / "requests.jsonl").read_text().splitlines()]
    accept = [r["acceptance_length"] for r in rows]
    if point_id.startswith("standalone"):  # the target drafts for itself: every step accepts its 4 drafts + 1
        assert all(a == pytest.approx(5.0, abs=0.6) for a in accept) and min(accept) > 4.0
    if point_id.startswith("ddtree-v2"):
        log = (tmp_path / "server.log").read_text()
        assert "Initialized DDTREE v2 worker. block_size=8, tree_budget=16, max_tree_nodes=17" in log


def test_the_ngram_stand_in_saturates_on_a_prompt_its_shared_store_has_seen() -> None:
    sim = Sim("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8")
    try:
        first = sim.generate("The river runs past the old mill and the town.", n=64).json()["meta_info"]
        other = sim.generate("A different prompt about the sea and the coast.", n=64).json()["meta_info"]
        again = sim.generate("The river runs past the old mill and the town.", n=64).json()["meta_info"]
    finally:
        sim.close()
    assert first["spec_accept_length"] < 8.0 and other["spec_accept_length"] < 8.0
    # every verify step accepts all 7 drafts and the bonus token (the last step may be cut by the length)
    assert again["spec_verify_ct"] == -(-64 // 8) and again["spec_accept_length"] == 8.0
