"""The stand-in against what a real SGLang with speculative decoding answered on an H200 (SGLang 0.5.16 with the
ddtree-v2 build's DDTREE; captured by benchmarks/gpu/capture.py, benchmarks/records/): the same /server_info keys
ddsweep reads with the same types and the values SGLang sets itself, the same native /generate meta_info (both
the old and the new names of the speculative fields), the same streaming format with several tokens per event
under speculation, and the same chat-completion layout. A drift of the stand-in fails here."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from conftest import demo_config
from standin import Sim

from ddsweep.config.presets import library_builds
from ddsweep.config.records import point_record
from ddsweep.config.study import expand_points
from ddsweep.point.lifecycle import render_server, verify_settings
from ddsweep.point.preflight import check_build

FIXTURES = Path(__file__).parent / "fixtures" / "gpu-h200-sglang-0.5.16-ddtree-v2"
# Each captured server: its flags (as its preset rendered them) and the /server_info keys ddsweep verifies there.
SERVERS = {
    "dflash-bs8": (["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "sim/draft",
                    "--speculative-dflash-block-size", "8"],
                   ["speculative_algorithm", "speculative_dflash_block_size", "speculative_draft_window_size"]),
    "ddtree-v2-bs8-b8-t1-woff": (["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path",
                                  "sim/draft", "--speculative-ddtree-block-size", "8",
                                  "--speculative-ddtree-budget", "8"],
                                 ["speculative_algorithm", "speculative_ddtree_budget",
                                  "speculative_ddtree_block_size", "speculative_num_draft_tokens",
                                  "speculative_dflash_block_size", "speculative_draft_window_size"]),
    "ngram-bs8": (["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"],
                  ["speculative_algorithm", "speculative_num_draft_tokens"]),
}
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def fixture(server: str, name: str):
    """One captured answer (JSON parsed, text as it is)."""
    text = (FIXTURES / server / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


def events(raw: str) -> list[dict]:
    """The JSON payloads of a native stream, checking SGLang's framing (data: lines, [DONE] last)."""
    lines = [line for line in raw.split("\n") if line.strip()]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


# Sent by 0.5.16 but not by 0.5.23 (tests/contract/test_real_server.py holds the stand-in to 0.5.23's keys), and
# read by no part of ddsweep.
NOT_IN_0_5_23 = {"response_sent_to_client_ts", "tool_calls"}


def same_shape(real: dict, ours: dict, where: str) -> None:
    """Every key of the real answer is in ours with the same JSON type (null matches null only)."""
    real = {k: v for k, v in real.items() if k not in NOT_IN_0_5_23}
    missing = sorted(set(real) - set(ours))
    assert not missing, f"{where}: the stand-in lacks {missing}"
    for key, value in real.items():
        if value is None or isinstance(value, bool):
            assert ours[key] is value or type(ours[key]) is type(value), f"{where}.{key}: {ours[key]!r} vs {value!r}"
        elif isinstance(value, (int, float)):
            assert isinstance(ours[key], (int, float)) and not isinstance(ours[key], bool), f"{where}.{key}"
        else:
            assert type(ours[key]) is type(value), f"{where}.{key}: {type(ours[key])} vs {type(value)}"


@pytest.fixture(scope="module", params=sorted(SERVERS))
def served(request) -> tuple[str, dict]:
    """A lenient stand-in started with a captured server's flags, and its answers to the captured requests."""
    flags, _ = SERVERS[request.param]
    sim = Sim(*flags)
    try:
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
        with httpx.Client(base_url=sim.url, timeout=30) as client:
            chat = {"model": "sim/model", "max_tokens": 32, "temperature": 0,
                    "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]}
            answers = {"server_info": client.get("/server_info").json(),
                       "generate": client.post("/generate", json=body).json(),
                       "stream": client.post("/generate", json={**body, "stream": True}).text,
                       "chat": client.post("/v1/chat/completions", json=chat).json()}
    finally:
        log = sim.close()
    answers["log"] = log
    return request.param, answers


def test_server_info_has_the_keys_ddsweep_verifies_with_the_values_sglang_sets(served) -> None:
    server, ours = served
    real = fixture(server, "server_info.json")
    keys = SERVERS[server][1] + ["max_running_requests", "version"]  # 0.5.16 sends no launch_command
    same_shape({k: real[k] for k in keys}, ours["server_info"], f"{server} /server_info")
    for key in SERVERS[server][1]:
        assert ours["server_info"][key] == real[key], f"{server}: {key} {ours['server_info'][key]!r} != {real[key]!r}"
    assert real["max_running_requests"] == ours["server_info"]["max_running_requests"] == 48  # SGLang's own choice
    assert isinstance(real["internal_states"], list) and isinstance(ours["server_info"]["internal_states"], list)
    assert "server_args" not in real and "server_args" not in ours["server_info"]  # arguments at the top level


def test_generate_meta_info_matches_sglangs_with_old_and_new_speculative_names(served) -> None:
    server, ours = served
    real = fixture(server, "generate.json")
    assert set(real) == {"text", "output_ids", "meta_info"} and set(real) <= set(ours["generate"])
    same_shape(real["meta_info"], ours["generate"]["meta_info"], f"{server} meta_info")
    meta = ours["generate"]["meta_info"]
    assert meta["spec_accepted_drafts"] == meta["spec_num_correct_drafts"]
    assert meta["spec_accept_histogram"] == meta["spec_correct_drafts_histogram"]
    assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"]
    real_meta = real["meta_info"]  # SGLang's own arithmetic, which the stand-in follows
    assert sum(real_meta["spec_correct_drafts_histogram"]) == real_meta["spec_verify_ct"]
    assert real_meta["spec_num_proposed_drafts"] == real_meta["spec_verify_ct"] * 7
    assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 7
    assert real_meta["finish_reason"] == meta["finish_reason"] == {"type": "length", "length": 64}


def test_streaming_is_sglangs_format_with_several_tokens_per_event_under_speculation(served) -> None:
    server, ours = served
    real, mine = events(fixture(server, "generate_stream.txt")), events(ours["stream"])
    for stream in (real, mine):
        counts = [e["meta_info"]["completion_tokens"] for e in stream]
        assert counts == sorted(counts) and counts[-1] == 64  # cumulative
        assert all(b["text"].startswith(a["text"]) for a, b in zip(stream, stream[1:], strict=False))
    same_shape(real[-1]["meta_info"], mine[-1]["meta_info"], f"{server} last event")
    if server == "ngram-bs8":  # the real NGRAM server sent 64 tokens in 9 events
        assert len(real) < 16 and len(mine) < 32


def test_chat_completion_layout_matches_sglangs(served) -> None:
    server, ours = served
    real = fixture(server, "chat.json")
    assert real["status"] == 200
    same_shape({k: v for k, v in real["body"].items() if k != "metadata"}, ours["chat"], f"{server} chat")
    same_shape(real["body"]["choices"][0], ours["chat"]["choices"][0], f"{server} chat choice")
    same_shape(real["body"]["usage"], ours["chat"]["usage"], f"{server} chat usage")


def test_the_ddtree_start_up_line_of_the_real_build_passes_the_ddtree_v2_preset_check() -> None:
    config = demo_config(sweep={"points": [{"preset": "ddtree-v2", "budget": 8, "topk": 1, "block_size": 8,
                                            "window": None}]})
    point = next(p for p in expand_points(config) if p.preset == "ddtree-v2")
    spec = render_server(point_record(config, point), 30000)
    info = fixture("ddtree-v2-bs8-b8-t1-woff", "server_info.json")
    log = fixture("ddtree-v2-bs8-b8-t1-woff", "startup_lines.txt")
    result = verify_settings(spec, info, log)
    assert result["ok"], result
    ddtree = next(p for p in expand_points(config) if p.preset == "ddtree")
    pr_spec = render_server(point_record(config, ddtree), 30000)
    assert not verify_settings(pr_spec, info, log)["ok"]  # PR #29907's preset does not fit this build


def test_the_preflight_names_ddtree_v2_on_the_real_builds_parser() -> None:
    options = json.loads((FIXTURES / "sglang_options.json").read_text())
    assert library_builds()["sglang-ddtree-v2"].matches(options)
    config = demo_config()
    points = [p for p in expand_points(config) if p.preset == "ddtree"]
    [finding] = check_build(config, points, options)
    assert finding.level == "error" and "use preset ddtree-v2" in finding.message
