"""The stand-in SGLang server: endpoints, streaming format, determinism, acceptance model and faults."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator

import httpx
import pytest
from standin import FAST, Sim, healthy_together

from ddsweep.sim.cli import build_parser, build_settings, parse_unknown
from ddsweep.sim.model import (
    Heat,
    Knobs,
    ModelParams,
    expected_accept_length,
    natural_length,
    prompt_kind,
    step_time_s,
)

FAULTY = ("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "4", "--sim-fault",
          "ignore-knob:budget", "--sim-fault", "error-rate:0.5", "--sim-seed", "3", *FAST)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Sim]]:
    """All long-running stand-ins of this module, started in parallel (process start-up dominates)."""
    sims = {
        "ddtree": Sim("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8",
                      "--speculative-draft-window-size", "2048", "--tp-size", "8", "--trust-remote-code", *FAST,
                      env={"SGLANG_DDTREE_MAX_TOPK": "4"}, wait=False),
        "ar": Sim(*FAST, wait=False),
        "b4": Sim("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "4", *FAST, wait=False),
        "dflash": Sim("--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "16", *FAST,
                      wait=False),
        "faulty1": Sim(*FAULTY, wait=False),
        "faulty2": Sim(*FAULTY, wait=False),
    }
    yield from healthy_together(sims)


@pytest.fixture
def ddtree(servers: dict[str, Sim]) -> Sim:
    return servers["ddtree"]


def test_server_info_echoes_args_and_is_labelled(ddtree: Sim) -> None:
    info = httpx.get(ddtree.url + "/server_info").json()
    args = info  # SGLang 0.5.23: resolved arguments at the top level
    assert info["simulated"] is True and info["version"].startswith("sim-") and info["strict"] is False
    assert "server_args" not in info and "--speculative-ddtree-budget 8" in info["launch_command"]
    assert args["speculative_algorithm"] == "DDTREE" and args["speculative_ddtree_budget"] == 8
    assert args["speculative_dflash_block_size"] == args["speculative_num_draft_tokens"] == 8
    assert args["speculative_draft_window_size"] == 2048
    assert args["tp_size"] == 8 and args["trust_remote_code"] is True
    assert "avg_spec_accept_length" in info["internal_states"][0]
    assert httpx.get(ddtree.url + "/get_server_info").json()["speculative_ddtree_budget"] == 8
    models = httpx.get(ddtree.url + "/v1/models").json()
    assert models["data"][0]["id"] == "sim/model"
    assert httpx.get(ddtree.url + "/health_generate", timeout=10).status_code == 200
    tok = httpx.post(ddtree.url + "/tokenize", json={"text": "Hello, world."}).json()
    assert tok["count"] == 4 == len(tok["tokens"])
    assert httpx.get(ddtree.url + "/nope").status_code == 404


def test_generate_native_and_stream_format(ddtree: Sim) -> None:
    plain = ddtree.generate("Explain the tides.", 40).json()
    meta = plain["meta_info"]
    assert meta["completion_tokens"] == 40 and meta["finish_reason"] == {"type": "length", "length": 40}
    assert meta["spec_verify_ct"] >= 1 and meta["prompt_tokens"] == 5
    with httpx.stream("POST", ddtree.url + "/generate", timeout=30,
                      json={"text": "Explain the tides.", "stream": True,
                            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}) as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 40
    assert max(b - a for a, b in zip(counts, counts[1:], strict=False)) > 1  # several tokens per verify step
    assert chunks[-1]["text"] == plain["text"]  # whole text so far; identical to non-streamed output
    assert all(chunks[i + 1]["text"].startswith(chunks[i]["text"]) for i in range(len(chunks) - 1))
    assert chunks[-1]["meta_info"]["spec_verify_ct"] == len(chunks) - 1  # prefill chunk + one per verify step


def test_chat_completions(ddtree: Sim) -> None:
    body = {"model": "sim/model", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 5}
    doc = httpx.post(ddtree.url + "/v1/chat/completions", json=body, timeout=30).json()
    assert doc["choices"][0]["finish_reason"] in ("length", "stop")
    assert doc["usage"]["completion_tokens"] <= 5 and doc["choices"][0]["message"]["content"]
    with httpx.stream("POST", ddtree.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "") for line in lines[:-1])
    assert text == doc["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_startup_delay_gives_503_then_200() -> None:
    sim = Sim("--sim-startup-delay", "3.0", *FAST, wait=False)
    try:
        deadline = time.time() + 10
        status = None
        while time.time() < deadline:
            try:
                status = httpx.get(sim.url + "/health", timeout=1).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.02)
        assert status == 503
        assert sim.generate("x").status_code == 503
        sim.wait_healthy()
        sim.proc.terminate()
        assert sim.proc.wait(timeout=5) == 0
    finally:
        out = sim.close()
    assert "fired up and ready to roll! [simulated]" in out
    assert "server_args=ServerArgs(" in out and "Speculative decoding disabled" in out


def test_text_identical_across_knobs_and_deterministic(servers: dict[str, Sim]) -> None:
    sims = [servers["ar"], servers["b4"], servers["dflash"]]
    outs = [s.generate("A prompt about rivers.", 30).json() for s in sims]
    again = sims[1].generate("A prompt about rivers.", 30).json()
    assert len({o["text"] for o in outs}) == 1
    assert "spec_verify_ct" not in outs[0]["meta_info"]  # autoregressive
    assert again["meta_info"]["spec_verify_ct"] == outs[1]["meta_info"]["spec_verify_ct"]


def test_acceptance_model_grows_and_saturates() -> None:
    p = ModelParams()

    def acc(budget: int, topk: int, block: int) -> float:
        return expected_accept_length(p, Knobs("ddtree", budget, topk, block, 2048))

    assert acc(4, 4, 8) < acc(8, 4, 8) < acc(16, 4, 8) < acc(32, 4, 8)
    # PR #29907's tree: a budget <= L is the spine chain (topk unused); topk only caps the width past it
    assert acc(4, 1, 8) == acc(4, 4, 8) and acc(8, 1, 16) == acc(8, 8, 16)
    assert acc(8, 2, 8) == acc(8, 4, 8) == acc(8, 8, 8)  # width min(2, topk): one tree
    assert acc(16, 2, 8) < acc(16, 4, 8) == acc(16, 8, 8)  # width 2, then 3
    assert acc(8, 1, 8) == acc(12, 1, 8) == acc(16, 1, 8) == acc(7, 1, 8)  # width 1: the chain of L, at any budget
    for topk in (1, 2, 4, 8):  # at a fixed topk, a larger budget's tree contains the smaller one's
        for block in (8, 16):
            curve = [acc(b, topk, block) for b in range(1, 65)]
            assert all(b >= a for a, b in zip(curve, curve[1:], strict=False)), (topk, block)
    assert 3.5 < acc(8, 4, 8) < 5.3
    assert 0 < acc(15, 1, 16) - acc(7, 1, 8) < 0.4  # drafter-bound beyond the trained block size (chains)
    ar = Knobs("ar", None, None, None, None)
    b8, b4 = Knobs("ddtree", 8, 4, 8, 2048), Knobs("ddtree", 4, 4, 8, 2048)
    speedup = acc(8, 4, 8) / step_time_s(p, b8, 1) / (1 / step_time_s(p, ar, 1))
    assert 1.5 <= speedup <= 2.5
    assert acc(4, 4, 8) / step_time_s(p, b4, 32) > acc(8, 4, 8) / step_time_s(p, b8, 32)


def test_unknown_flags_and_ignore_knob_reports_default() -> None:
    args, rest = build_parser().parse_known_args(
        ["--model-path", "m", "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8",
         "--speculative-num-draft-tokens", "16", "--sim-fault", "ignore-knob:budget", "--mem-fraction-static",
         "0.8", "--enable-x", "--tp-size=8"])
    settings = build_settings(args, parse_unknown(rest), {"SGLANG_DDTREE_MAX_TOPK": "4"})
    assert settings.server_args["speculative_ddtree_budget"] == 16  # the default, not the requested 8
    assert settings.knobs.budget == 16 and settings.knobs.topk == 4 and settings.knobs.block_size == 16
    assert settings.server_args["mem_fraction_static"] == 0.8 and settings.server_args["enable_x"] is True
    assert settings.server_args["tp_size"] == 8


@pytest.mark.parametrize(("steps", "topk", "tokens", "resolved"), [(4, 1, 9, 5), (2, 1, 3, 3), (4, 2, 9, 9)])
def test_standalone_at_topk_1_verifies_num_steps_plus_1_tokens_as_sglang_resolves_it(steps: int, topk: int,
                                                                                    tokens: int, resolved: int) -> None:
    # SGLang's _handle_eagle_family: a top-k 1 draft is a chain of num_steps tokens, whatever was asked
    args, rest = build_parser().parse_known_args(
        ["--model-path", "m", "--speculative-algorithm", "STANDALONE", "--speculative-num-steps", str(steps),
         "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(tokens)])
    settings = build_settings(args, parse_unknown(rest), {})
    assert settings.server_args["speculative_num_draft_tokens"] == resolved
    assert settings.knobs.budget == resolved - 1 and settings.knobs.block_size == steps + 1


def test_launch_noise_scales_step_time_per_launch_reproducibly_from_its_seed() -> None:
    def step_ms(*extra: str) -> float:
        args, rest = build_parser().parse_known_args(["--model-path", "m", "--sim-step-ms", "4", *extra])
        return build_settings(args, parse_unknown(rest), {}).params.step_ms

    assert step_ms() == 4.0
    seeded = [step_ms("--sim-launch-noise", "0.05", "--sim-launch-seed", str(seed)) for seed in range(20)]
    assert seeded == [step_ms("--sim-launch-noise", "0.05", "--sim-launch-seed", str(s)) for s in range(20)]
    assert len(set(seeded)) == 20 and min(seeded) / 4 > 0.8 and max(seeded) / 4 < 1.25
    fresh = {step_ms("--sim-launch-noise", "0.05") for _ in range(5)}
    assert len(fresh) == 5  # without a seed every launch draws anew


def test_gpu_like_drift_slows_steps_under_load_and_recovers_while_idle() -> None:
    args, rest = build_parser().parse_known_args(["--model-path", "m", "--sim-drift", "0.3", "--sim-drift-s", "2"])
    params = build_settings(args, parse_unknown(rest), {}).params
    assert (params.drift, params.drift_s) == (0.3, 2.0)
    heat = Heat(params.drift, params.drift_s)
    assert heat.advance(0.0, busy=True) == 1.0  # a fresh launch runs at full speed
    assert heat.advance(2.0, busy=True) == pytest.approx(1 + 0.3 * (1 - math.exp(-1)))  # one time constant
    assert heat.advance(20.0, busy=True) == pytest.approx(1.3, abs=1e-3)  # settled at the slow-down
    assert heat.advance(22.0, busy=False) == pytest.approx(1 + 0.3 * math.exp(-1), abs=1e-3)  # cooling
    assert Heat(0.0, 2.0).advance(5.0, busy=True) == 1.0


def test_exit_during_startup() -> None:
    sim = Sim("--sim-fault", "exit-during-startup", "--sim-startup-delay", "0.2", wait=False)
    assert sim.proc.wait(timeout=10) != 0
    assert "fired up" not in sim.close()


@pytest.mark.slow
def test_error_rate_gives_500s_deterministically(servers: dict[str, Sim]) -> None:
    codes = [[servers[name].generate(f"p{i}", 2).status_code for i in range(20)] for name in ("faulty1", "faulty2")]
    assert codes[0] == codes[1]
    assert 3 <= codes[0].count(500) <= 17 and set(codes[0]) == {200, 500}


def test_ignore_knob_server_info_and_log_line(servers: dict[str, Sim]) -> None:
    sim = servers["faulty1"]
    assert httpx.get(sim.url + "/server_info").json()["speculative_ddtree_budget"] == 16
    sim.proc.terminate()
    out = sim.close()
    assert "DDTree config: budget=16 " in out and "budget=4" not in out


def test_sim_stats_ground_truth(ddtree: Sim) -> None:
    httpx.post(ddtree.url + "/sim/reset")
    meta = ddtree.generate("Truth.", 24).json()["meta_info"]
    rows = httpx.get(ddtree.url + "/sim/stats").json()["requests"]
    assert len(rows) == 1 and rows[0]["completion_tokens"] == 24
    assert rows[0]["spec_verify_ct"] == meta["spec_verify_ct"]
    assert rows[0]["arrival_ts"] <= rows[0]["first_token_ts"] <= rows[0]["last_token_ts"]


def test_sigterm_shuts_down_quickly(servers: dict[str, Sim]) -> None:
    sim = servers["ar"]
    sim.proc.terminate()
    assert sim.proc.wait(timeout=5) == 0


def test_acceptance_depends_on_the_workload_and_post_eos_repetition() -> None:
    p, knobs = ModelParams(), Knobs("ddtree", 8, 4, 8, 2048)
    prose, code, post = (expected_accept_length(p, knobs, kind) for kind in ("prose", "code", "post_eos"))
    assert prose + 0.5 < code < post
    assert prompt_kind("Complete this:\n```python\ndef f(x):\n    pass\n```") == "code"
    assert prompt_kind("The river rose in the spring.") == "prose"


def test_ignore_eos_past_the_natural_end_is_accepted_more(servers: dict[str, Sim]) -> None:
    sim = servers["ddtree"]
    prompt = next(f"A story about rivers, part {i}." for i in range(1000) if natural_length(0, f"A story about "
                                                                                          f"rivers, part {i}.") < 40)
    stopped = sim.generate(prompt, 600, ignore_eos=False).json()["meta_info"]
    forced = sim.generate(prompt, 600, ignore_eos=True).json()["meta_info"]
    assert stopped["finish_reason"]["type"] == "stop" and stopped["completion_tokens"] < 40
    assert forced["completion_tokens"] == 600
    prose = expected_accept_length(ModelParams(), Knobs("ddtree", 8, 4, 8, 2048), "prose")
    assert forced["spec_accept_length"] > prose + 1.0  # 560 of the 600 tokens come after the natural end


def test_a_prompt_whose_new_tokens_do_not_fit_the_context_is_refused_as_sglang_refuses_it() -> None:
    # SGLang 0.5.23 refuses prompt tokens + max_new_tokens over the context length (validate_total_tokens), and
    # checks nothing of the kind where the request does not ask for a number of new tokens
    sim = Sim("--context-length", "64", *FAST)
    try:
        text = " ".join(["word"] * 20)
        refused = sim.generate(text, 60)
        assert refused.status_code == 400
        message = refused.json()["error"]["message"]
        assert message.startswith("Requested token count exceeds the model's maximum context length of 64 tokens. "
                                  "You requested a total of ")
        assert "tokens from the input messages and 60 tokens for the completion" in message
        assert sim.generate(text, 30).status_code == 200
        assert httpx.post(sim.url + "/generate", timeout=30, json={"text": text}).status_code == 200
        chat = httpx.post(sim.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": text}], "max_tokens": 60})
        assert chat.status_code == 400 and "60 tokens for the completion" in chat.json()["message"]
    finally:
        sim.close()


def test_prompt_beyond_context_length_is_refused_as_sglang_refuses_it() -> None:
    sim = Sim("--context-length", "16")
    try:
        long_text = " ".join(["word"] * 40)
        refused = sim.generate(long_text, 4)
        assert refused.status_code == 400
        assert "longer than the model's context length (16 tokens)" in refused.json()["error"]["message"]
        streamed = sim.generate(long_text, 4, stream=True)
        lines = [line for line in streamed.text.split("\n") if line.startswith("data:")]
        assert streamed.status_code == 200 and lines[-1] == "data: [DONE]" and len(lines) == 2
        assert json.loads(lines[0][5:])["error"]["message"] == refused.json()["error"]["message"]
        chat = httpx.post(sim.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": long_text}], "max_tokens": 4})
        assert chat.status_code == 400 and chat.json()["object"] == "error"
        assert sim.generate("short", 2).status_code == 200
        assert httpx.post(sim.url + "/tokenize", json={"prompt": "x"}).json()["max_model_len"] == 16
    finally:
        sim.close()
