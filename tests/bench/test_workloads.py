"""Workloads against the stand-in: prompt sizes as the server counts them, steady state, acceptance, cell order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from standin import Sim, healthy_together

from ddsweep import storage
from ddsweep.bench.cells import BenchSettings, plan_cells, run_benchmark
from ddsweep.bench.workloads import PromptBuilder, Workload, WorkloadError
from ddsweep.sim import tokenizer
from ddsweep.sim.cli import DEFAULT_TOPK
from ddsweep.sim.model import Knobs, ModelParams, expected_accept_length, step_time_s
from ddsweep.sim.openai import render_chat

STEP_MS = 10.0
DDTREE = ("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8")


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    """A DDTree stand-in and an autoregressive one (fixed one token per step: the ramp is predictable)."""
    started = {"ddtree": Sim(*DDTREE, "--sim-step-ms", "1", "--sim-prefill-ms-per-1k", "1", wait=False),
               "ar": Sim("--sim-step-ms", str(STEP_MS), "--sim-prefill-ms-per-1k", "0", wait=False)}
    yield from healthy_together(started)


@pytest.fixture
def traffic(tmp_path: Path) -> Path:
    """A user's JSONL of chat conversations and raw prompts."""
    path = tmp_path / "traffic.jsonl"
    rows = [{"messages": [{"role": "system", "content": "You are a helpful assistant."},
                          {"role": "user", "content": "Summarise the history of the printing press."}]},
            {"prompt": "Once upon a time, in a village by the sea,"},
            {"messages": [{"role": "user", "content": "Write a haiku about rivers."}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _tokenize(url: str) -> tuple[httpx.Client, object]:
    client = httpx.Client(timeout=30)

    def tokenize(body: dict) -> list[int]:
        resp = client.post(url + "/tokenize", json=body)
        resp.raise_for_status()
        return resp.json()["tokens"]

    return client, tokenize


@pytest.mark.slow
def test_prompts_of_every_workload_land_within_5_percent_as_the_server_counts(sims, traffic, tmp_path) -> None:
    workloads = [{"name": "coding", "kind": "coding"}, {"name": "prose", "kind": "prose"},
                 {"name": "traffic", "kind": "jsonl", "path": str(traffic)}]
    settings = BenchSettings(contexts=[128, 1024], concurrency=[2], max_new_tokens=8, requests_per_cell=6,
                             min_window_s=0, repeats=1, warmup_requests=0, workloads=workloads)
    doc = run_benchmark(sims["ddtree"].url, tmp_path, settings, simulated=True)
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    assert {r["workload"] for r in records} == {"coding", "prose", "traffic"}
    assert len(records) == 3 * 2 * 6 and all(r["error"] is None for r in records)
    for r in records:  # prompt_tokens is the server's own meta_info count of what the model received
        assert abs(r["prompt_tokens"] - r["context"]) <= 0.05 * r["context"], r
    sources = {r["prompt_source"] for r in records if r["workload"] == "coding"}
    assert all(s.startswith("HumanEval/") for s in sources) and len(sources) >= 6
    assert any(s.startswith(f"{traffic}:2") for s in {r["prompt_source"] for r in records})  # the raw prompt too
    assert [w["name"] for w in doc["workloads"]] == ["coding", "prose", "traffic"]
    assert {g["workload"] for g in doc["groups"]} == {"coding", "prose", "traffic"}


def test_chat_prompts_are_sent_as_the_chat_template_renders_them(sims) -> None:
    client, tokenize = _tokenize(sims["ddtree"].url)
    with client:
        builder = PromptBuilder(Workload("prose", "prose"), tokenize)
        prompt = builder.build(256, 0)
        other = PromptBuilder(Workload("prose", "prose"), tokenize)
        other.build(1024, 3)
        assert other.build(256, 0) == prompt  # a prompt never depends on the cells built before it
        messages = [{"role": "user", "content": "Hello"}]
        templated = client.post(sims["ddtree"].url + "/tokenize", json={"messages": messages}).json()
        raw = client.post(sims["ddtree"].url + "/tokenize", json={"prompt": "Hello"}).json()
        assert templated["count"] > raw["count"]  # the template's role markers are counted
        out = client.post(sims["ddtree"].url + "/generate", json={
            "input_ids": prompt.input_ids, "sampling_params": {"max_new_tokens": 4}}).json()
        assert out["meta_info"]["prompt_tokens"] == len(prompt.input_ids)
        bad = client.post(sims["ddtree"].url + "/tokenize", json={"messages": messages, "prompt": "x"})
        assert bad.status_code == 400


def test_a_small_context_prompt_is_sized_where_its_first_padding_windows_all_miss(sims) -> None:
    # At context 128 one HumanEval problem fits the stand-in's tokenizer, and for these (seed, sequence) its first
    # OFFSET_TRIES padding windows all miss the target: later windows must be tried before giving up.
    client, tokenize = _tokenize(sims["ar"].url)
    with client:
        for seed, sequences in ((0, [182]), (1, [61, 135, 280]), (2, [34])):
            builder = PromptBuilder(Workload("coding", "coding"), tokenize, seed)
            for sequence in sequences:
                prompt = builder.build(128, sequence)
                assert abs(len(prompt.input_ids) - 128) <= 0.045 * 128, (seed, sequence)


def test_a_source_without_a_fitting_prompt_names_the_workload(sims, tmp_path) -> None:
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "word " * 400}) + "\n", encoding="utf-8")
    client, tokenize = _tokenize(sims["ddtree"].url)
    with client, pytest.raises(WorkloadError, match="workload mine: no prompt can be sized to context 64"):
        PromptBuilder(Workload("mine", "jsonl", str(path)), tokenize).build(64, 0)
    path.write_text('{"neither": 1}\n', encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"long.jsonl:1 has neither 'messages'"):
        PromptBuilder(Workload("mine", "jsonl", str(path)), tokenize)


def _in_flight_profile(records: list[dict]) -> list[tuple[float, int]]:
    events = sorted([(r["start_ts"], 1) for r in records] + [(r["end_ts"], -1) for r in records])
    level, out = 0, []
    for ts, delta in events:
        level += delta
        out.append((ts, level))
    return out


def test_c32_cell_keeps_32_in_flight_and_the_ramp_explains_whole_vs_steady(sims, tmp_path) -> None:
    """Defaults (4*C requests) keep C in flight for most of the cell, and the whole cell falls short of the steady
    state by what the stand-in's step-time model predicts for the measured in-flight profile (the ramp). Its
    absolute speed is not asserted: on a loaded machine the stand-in's steps take longer than its model's."""
    settings = BenchSettings(contexts=[128], concurrency=[32], max_new_tokens=24, repeats=1, warmup_requests=0,
                             min_window_s=0, workloads=[{"name": "prose", "kind": "prose", "ignore_eos": True}])
    doc = run_benchmark(sims["ar"].url, tmp_path, settings, simulated=True)
    records = [r for r in storage.read_jsonl(tmp_path / "requests.jsonl") if not r["warmup"]]
    cell = doc["cells"][0]
    assert len(records) == cell["requests"] == 128 and cell["completed"] == 128
    profile = _in_flight_profile(records)
    wall = profile[-1][0] - profile[0][0]
    at_c = sum(b[0] - a[0] for a, b in zip(profile, profile[1:], strict=False) if a[1] == 32)
    assert at_c / wall >= 0.7, f"32 in flight for only {at_c / wall:.0%} of the cell"
    assert cell["at_concurrency_fraction"] == pytest.approx(at_c / wall)
    # Autoregressive stand-in: one token per request per step of step_time_s(batch) seconds.
    params, ar = ModelParams(step_ms=STEP_MS), Knobs("ar", None, None, None, None)
    predicted_tokens = sum((b[0] - a[0]) * a[1] / step_time_s(params, ar, a[1])
                           for a, b in zip(profile, profile[1:], strict=False) if a[1])
    whole, steady = cell["output_throughput_tok_s"], cell["steady_state"]["output_throughput_tok_s"]
    rate_at_c = 32 / step_time_s(params, ar, 32)
    # never faster than the model (a step takes at least step_time_s): 0.98-0.99 of it on an idle machine, and slower
    # under load (once in the fast tier on the 2-core machine: 1164 against the model's 1582 tok/s)
    assert 0 < steady <= 1.1 * rate_at_c and whole > 0
    # The whole cell falls short of the steady state by the share the ramp (fewer than C in flight) costs. Under
    # CPU contention the measured shortfall comes out below the prediction: by 0.2-3.5 points with six busy
    # loops on 2 cores, by 5.3 once in the fast subset (4 workers on 2 cores).
    assert (steady - whole) / steady == pytest.approx(1 - predicted_tokens / wall / rate_at_c, abs=0.08)
    window = cell["steady_state"]
    ends = sorted(r["end_ts"] for r in records)
    assert window["end_ts"] == ends[-32] and window["in_flight_mean"] > 30


def test_acceptance_per_workload_follows_the_stand_in_model(sims, tmp_path) -> None:
    settings = BenchSettings(contexts=[256], concurrency=[4], max_new_tokens=48, requests_per_cell=16, repeats=1,
                             min_window_s=0, warmup_requests=0, workloads=[{"name": "coding", "kind": "coding"},
                                                          {"name": "prose", "kind": "prose"}])
    doc = run_benchmark(sims["ddtree"].url, tmp_path, settings, simulated=True)
    accept = {w["name"]: w["acceptance_length"] for w in doc["workloads"]}
    knobs, params = Knobs("ddtree", 8, DEFAULT_TOPK, 8, None), ModelParams()
    assert accept["coding"] > accept["prose"]  # the model expects 6.60 against 6.07
    assert accept["coding"] == pytest.approx(expected_accept_length(params, knobs, "code"), rel=0.1)
    assert accept["prose"] == pytest.approx(expected_accept_length(params, knobs, "prose"), rel=0.1)
    assert all(w["ignore_eos"] is False for w in doc["workloads"])
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    assert all(r["ignore_eos"] is False and r["max_new_tokens"] == 48 for r in records)


def test_cell_order_is_shuffled_reproducibly_with_warmups_first_and_fixed_prompts() -> None:
    settings = BenchSettings(contexts=[128, 512], concurrency=[1, 4], requests_per_cell=None, repeats=3,
                             min_window_s=0, warmup_requests=2, workloads=[{"name": "prose", "kind": "prose"}])
    first, again, other = plan_cells(settings, 11), plan_cells(settings, 11), plan_cells(settings, 12)
    fixed = plan_cells(BenchSettings(**{**settings.__dict__, "cell_order": "fixed"}), 11)
    key = [(c.context, c.concurrency, c.repeat, c.warmup) for c in first]
    assert key == [(c.context, c.concurrency, c.repeat, c.warmup) for c in again]
    assert key != [(c.context, c.concurrency, c.repeat, c.warmup) for c in other]
    assert key != [(c.context, c.concurrency, c.repeat, c.warmup) for c in fixed]
    prompts = {(c.context, c.concurrency, c.repeat, c.warmup): c.sequences for c in first}
    assert prompts == {(c.context, c.concurrency, c.repeat, c.warmup): c.sequences for c in fixed}
    seen: set[tuple[int, int]] = set()
    for c in first:
        group = (c.context, c.concurrency)
        assert c.warmup == (group not in seen)
        seen.add(group)
    assert {len(c.sequences) for c in first if not c.warmup and c.concurrency == 4} == {16}
    assert {len(c.sequences) for c in first if not c.warmup and c.concurrency == 1} == {8}


def test_sizing_a_prompt_never_counts_the_same_body_twice() -> None:
    # At context 128 the padding of most HumanEval problems is cut to its 16-character minimum: counting that cut
    # again (up to MAX_ROUNDS times, as once happened) learns nothing and costs a /tokenize round trip each time.
    bodies: list[str] = []

    def tokenize(body: dict) -> list[int]:
        bodies.append(json.dumps(body, sort_keys=True))
        text = body["prompt"] if "prompt" in body else render_chat(body["messages"])
        return tokenizer.token_ids(text)

    for workload, target in ((Workload("coding", "coding"), 128), (Workload("prose", "prose"), 512)):
        builder = PromptBuilder(workload, tokenize)
        builder.fitting(target)  # the problems' own counts, once per builder
        for sequence in range(30):
            bodies.clear()
            prompt = builder.build(target, sequence)
            assert abs(len(prompt.input_ids) - target) <= 0.045 * target
            assert len(bodies) == len(set(bodies)), (workload.name, sequence, len(bodies))
