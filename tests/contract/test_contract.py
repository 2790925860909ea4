"""The contract with SGLang 0.5.23, checked against SGLang's own code: the strict stand-in validates with SGLang's
request classes, parses with its argument parser and builds /server_info with its build_server_info; the load
generator, the coding eval and the run-point lifecycle work against it. Skipped where sglang does not import."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import demo_record
from standin import FAST, Sim

from ddsweep.cli import main as cli_main
from ddsweep.sim import contract

# Every test here starts a strict stand-in, which imports SGLang (seconds of CPU).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def sglang_contract() -> contract.Contract:
    """SGLang's contract, loaded when the first test here runs (importing sglang takes seconds of CPU, which
    every pytest-xdist worker would spend at collection); the module skips where it does not load."""
    loaded = contract.load("auto")
    if not loaded.strict:
        pytest.skip(f"SGLang's contract does not load here: {loaded.reason} (CI installs it: .ci/sglang-real.sh)")
    return loaded


# The demo's analysis regimes name contexts 128, 2048 and concurrency 1, 8: the smallest matrix they accept.
SMALL_BENCH = {"contexts": [128, 2048], "concurrency": [1, 8], "max_new_tokens": 8, "requests_per_cell": 2,
               "repeats": 1, "warmup_requests": 0}


@pytest.fixture(scope="module")
def strict() -> Iterator[Sim]:
    """A strict DDTree stand-in, as the DDTree preset starts it."""
    sim = Sim("--speculative-algorithm", "DDTREE", "--speculative-dflash-block-size", "8",
              "--speculative-ddtree-budget", "8", "--speculative-draft-window-size", "2048", *FAST,
              env={"SGLANG_DDTREE_MAX_TOPK": "4"}, wait=False, strict=True)
    try:
        sim.wait_healthy(timeout=180)
        yield sim
    finally:
        sim.close()


def test_text_body_to_tokenize_is_rejected_as_sglang_rejects_it(strict: Sim) -> None:
    from sglang.srt.entrypoints.openai.protocol import TokenizeRequest

    with pytest.raises(Exception) as sglang_says:
        TokenizeRequest.model_validate({"text": "Hello world"})
    for path in ("/tokenize", "/v1/tokenize"):
        answer = httpx.post(strict.url + path, json={"text": "Hello world"}, timeout=30)
        body = answer.json()
        assert answer.status_code == 400 and body["object"] == "error" and body["code"] == 400
        assert sglang_says.value.errors()[0]["msg"] in body["message"]
    ok = httpx.post(strict.url + "/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
    assert set(ok) == {"tokens", "count", "max_model_len"} and ok["count"] == len(ok["tokens"]) > 0


def test_generate_and_openai_bodies_are_checked_with_sglangs_schema(strict: Sim) -> None:
    bad = httpx.post(strict.url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": "many"}})
    assert bad.status_code == 400 and "error" in bad.json()
    chat = httpx.post(strict.url + "/v1/chat/completions", json={"messages": "not a list", "max_tokens": 4})
    assert chat.status_code == 400 and chat.json()["object"] == "error"
    good = httpx.post(strict.url + "/v1/chat/completions", timeout=30, json={
        "model": "sim/model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
        "return_spec_tokens_details": True}).json()
    details = good["sglext"]["spec_tokens_details"]
    assert details["spec_verify_ct"] >= 1 and details["spec_accept_length"] > 0
    meta = strict.generate("A river.", 12).json()["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert {"prompt_tokens", "completion_tokens", "spec_verify_ct", "spec_accept_length"} <= set(meta)


def test_server_info_has_sglangs_top_level_layout(strict: Sim) -> None:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    fields = {a.dest for a in parser._actions if a.dest != "help"}
    info = httpx.get(strict.url + "/server_info").json()
    assert fields <= set(info) and "server_args" not in info
    assert info["speculative_num_draft_tokens"] == 8  # resolved from --speculative-dflash-block-size
    assert info["speculative_ddtree_budget"] == 8 and info["speculative_algorithm"] == "DDTREE"
    assert "--speculative-ddtree-budget 8" in info["launch_command"]
    assert info["strict"] is True and info["internal_states"] and info["version"] and "kv_events" in info


def test_unknown_flag_fails_like_sglangs_parser(capsys: pytest.CaptureFixture[str]) -> None:
    # In this process, where SGLang is loaded already: a stand-in process would spend seconds importing it again
    # only to refuse its command line.
    with pytest.raises(SystemExit) as exited:
        cli_main(["sim-server", "--model-path", "sim/model", "--sim-strict", "on",
                  "--speculative-dflash-blok-size", "8"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --speculative-dflash-blok-size" in capsys.readouterr().err


def test_prompts_land_within_five_percent_of_every_target_as_counted_by_the_server(strict: Sim,
                                                                                   tmp_path: Path) -> None:
    from ddsweep.bench.cells import BenchSettings, run_benchmark

    settings = BenchSettings(contexts=[128, 1024, 4096], concurrency=[2], max_new_tokens=8, requests_per_cell=3,
                             repeats=1, warmup_requests=0)
    doc = run_benchmark(strict.url, tmp_path, settings, simulated=True)
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and all(r["error"] is None for r in rows)
    assert all(abs(r["prompt_tokens"] - r["context"]) <= 0.05 * r["context"] for r in rows)
    assert [c["prompt_tokens_off_target"] for c in doc["cells"]] == [False, False, False]


@pytest.mark.parametrize("point_id", ["bs8-b8-t4-w2048", "dflash-bs8-w2048", "ar"])
def test_every_preset_point_verifies_through_run_point(point_id: str, tmp_path: Path) -> None:
    from ddsweep.point.run import run_point

    coding = {"enabled": point_id == "bs8-b8-t4-w2048", "limit": 2}
    record = demo_record(point_id, strict=True, benchmark=SMALL_BENCH, coding_eval=coding,
                         engine={"startup_timeout_s": 240})
    status = run_point(record, tmp_path / point_id, progress=lambda _: None)
    assert status["status"] == "ok"
    verification = json.loads((tmp_path / point_id / "verification.json").read_text())
    assert verification["ok"] and verification["endpoint"] == "/server_info"
    assert [u["knob"] for u in verification["unverified"]] == (["topk"] if point_id.startswith("bs") else [])
    info = json.loads((tmp_path / point_id / "server_info.json").read_text())
    assert info["strict"] is True
    if coding["enabled"]:  # the coding eval ran against the strict stand-in
        assert (tmp_path / point_id / "coding").is_dir() and status["steps"]["coding"] == "ok"
