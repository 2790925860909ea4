"""The contract with SGLang 0.5.23 checked against a real SGLang server (CPU, tiny random model, .ci/sglang-real.sh):
everything ddsweep sends and parses, its failure answers, aborts, disconnects, concurrency, timing, and that the
server's whole process tree is gone after stop. One server for the module, started by ddsweep's launcher code."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import realsglang
import yaml

from ddsweep.bench.cells import TokenizeClient
from ddsweep.bench.feasibility import local_tokenizer
from ddsweep.bench.records import RequestRecord, run_request
from ddsweep.bench.transport import make_transport, stream_error
from ddsweep.point.lifecycle import SERVER_INFO_PATHS, owned_processes, verify_settings
from ddsweep.sim.contract import context_refusal

# A real server start costs 30-60 s of both cores.
pytestmark = [pytest.mark.slow, pytest.mark.full("starts a real SGLang server on CPU (30-60 s of both cores)")]
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[realsglang.RealServer]:
    """One real SGLang server for the whole module (a start costs 30-60 s of both cores)."""
    server = realsglang.start(tmp_path_factory.mktemp("real-sglang") / "server.log")
    try:
        yield server
    finally:
        server.server.stop()


def events(response: httpx.Response) -> list[bytes]:
    """The payloads of a streamed response's `data:` lines, in order."""
    return [line[5:].strip() for line in response.content.split(b"\n") if line.startswith(b"data:")]


def generate(url: str, body: dict, timeout: float = 120) -> httpx.Response:
    """POST /generate."""
    return httpx.post(url + "/generate", json=body, timeout=timeout)


def run(coro):
    """Run one coroutine to completion."""
    return asyncio.run(coro)


async def ddsweep_requests(url: str, prompts: list[str], max_new_tokens: int) -> list[RequestRecord]:
    """ddsweep's benchmark client (the asyncio transport), all prompts at once."""
    transport = make_transport("asyncio")
    await transport.open(len(prompts))
    try:
        records = [RequestRecord(context=0, concurrency=len(prompts), repeat=0, index=i, warmup=False)
                   for i in range(len(prompts))]
        return list(await asyncio.gather(*(run_request(transport, url, p, max_new_tokens, r, ignore_eos=True)
                                           for p, r in zip(prompts, records, strict=True))))
    finally:
        await transport.close()


def test_health_is_not_200_until_the_server_is_ready(real: realsglang.RealServer) -> None:
    seen = real.health_seen
    assert seen and seen[0] != 200, seen  # the first probes find no listener yet (or a 503)
    assert set(seen) <= {"refused", 503, 200}, seen
    assert "The server is fired up and ready to roll!" in real.log()
    assert httpx.get(real.url + "/health", timeout=10).status_code == 200


def test_server_info_has_the_resolved_arguments_at_the_top_level(real: realsglang.RealServer) -> None:
    info = httpx.get(real.url + SERVER_INFO_PATHS[0], timeout=30).json()
    # the keys the presets verify, resolved, at the top level (SGLang 0.5.23 has no server_args key)
    keys = {"speculative_algorithm", "speculative_num_draft_tokens", "speculative_dflash_block_size",
            "speculative_draft_window_size", "speculative_draft_model_path", "tp_size", "ep_size", "page_size",
            "max_running_requests", "disable_overlap_schedule", "served_model_name", "launch_command"}
    assert keys <= set(info) and "server_args" not in info and len(info) > 400
    assert info["version"] == "0.5.23" and info["device"] == "cpu" and info["speculative_algorithm"] is None
    assert info["model_path"] == real.manifest["model_dir"] and info["max_total_num_tokens"] > 0
    assert "--attention-backend torch_native" in info["launch_command"]
    assert isinstance(info["internal_states"], list) and info["internal_states"]
    # ddsweep's verification of the ar preset, against the real answer
    spec = real.server.spec
    spec.expected_server_args, spec.launch_command = {"speculative_algorithm": None, "tp_size": 1}, ["--device cpu"]
    verdict = verify_settings(spec, {**info, "ddsweep_endpoint": "/server_info"}, "")
    assert verdict["ok"], verdict
    spec.expected_server_args = {"tp_size": 2}
    assert not verify_settings(spec, info, "")["ok"]
    assert httpx.get(real.url + "/get_server_info", timeout=30).json()["version"] == "0.5.23"


def test_tokenize_with_prompt_and_with_messages(real: realsglang.RealServer) -> None:
    plain = httpx.post(real.url + "/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()
    special = httpx.post(real.url + "/tokenize", json={"prompt": PROMPT}).json()
    assert set(plain) == {"tokens", "count", "max_model_len"} and plain["max_model_len"] == 2048
    assert plain["count"] == len(plain["tokens"]) > 5
    assert special["tokens"] == [0, *plain["tokens"]]  # BOS (id 0) prepended by default
    chat = httpx.post(real.url + "/v1/tokenize", json={"messages": [{"role": "user", "content": PROMPT}]}).json()
    assert chat["count"] == len(chat["tokens"]) > plain["count"]  # the chat template's headers
    both = httpx.post(real.url + "/tokenize", json={"prompt": "x", "messages": [{"role": "user", "content": "x"}]})
    text = httpx.post(real.url + "/tokenize", json={"text": "x"})
    assert both.status_code == 400 and text.status_code == 400 and text.json()["object"] == "error"



def test_the_model_directorys_tokenizer_counts_as_the_server_does(real: realsglang.RealServer) -> None:
    # the count `ddsweep plan` and the preflight size prompts with before any server starts
    tokenize, source = local_tokenizer({"target": {"model_path": real.manifest["model_dir"]}})
    assert tokenize is not None, source
    messages = [{"role": "user", "content": PROMPT}]
    assert tokenize({"prompt": PROMPT}) == httpx.post(real.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert tokenize({"messages": messages}) == httpx.post(real.url + "/v1/tokenize",
                                                          json={"messages": messages}).json()["tokens"]


def test_plan_reports_a_context_shorter_than_the_shortest_prompt_from_the_model_directory(tmp_path: Path) -> None:
    # the tiny model's shortest coding prompt has 130 tokens: 128 is within the context tolerance, 64 is not
    doc = realsglang.manifest()
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"target": {"model_path": doc["model_dir"]},
                                       "drafter": {"model_path": doc["model_dir"]},
                                       "benchmark": {"contexts": [64, 128, 512]}}))
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-m", "ddsweep", "plan", "-c", "config/config.yaml",
                             ".test/real-sglang.yaml", str(overlay), "--write", str(tmp_path / "plan.json")],
                            cwd=root, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    (cell,) = plan["infeasible_cells"]
    assert (cell["workload"], cell["context"]) == ("coding", 64)
    assert "no prompt can be sized to context 64" in cell["reason"]
    assert plan["infeasible_cells_checked_with"] == f"the tokenizer of {doc['model_dir']}"
    assert "Benchmark cells no point can measure" in result.stdout and "coding ctx=64: " in result.stdout

def test_generate_non_streamed_and_streamed(real: realsglang.RealServer) -> None:
    sampling = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    whole = generate(real.url, {"text": PROMPT, "sampling_params": sampling})
    assert whole.status_code == 200
    meta = whole.json()["meta_info"]
    count = httpx.post(real.url + "/tokenize", json={"prompt": PROMPT}).json()["count"]
    assert meta["prompt_tokens"] == count and meta["completion_tokens"] == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert isinstance(meta["cached_tokens"], int) and meta["e2e_latency"] > 0
    streamed = generate(real.url, {"text": PROMPT, "stream": True, "sampling_params": sampling})
    payloads = events(streamed)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert payloads[-1] == b"[DONE]" and len(payloads) >= 2
    chunks = [json.loads(p) for p in payloads[:-1]]
    texts = [c["text"] for c in chunks]
    tokens = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # cumulative text
    assert tokens == sorted(tokens) and tokens[-1] == 6  # cumulative counts
    assert [c["meta_info"]["finish_reason"] for c in chunks][-1] == {"type": "length", "length": 6}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["cached_tokens"] > 0  # the same prompt again: radix-cache hits
    assert texts[-1] == whole.json()["text"]  # greedy: the same text either way


def test_ddsweep_client_records_a_real_request(real: realsglang.RealServer) -> None:
    [record] = run(ddsweep_requests(real.url, [PROMPT + "# one"], 8))
    assert record.error is None and record.completion_tokens == 8 and record.finish_reason == "length"
    ttft = record.chunks[0][0]  # the first chunk's time since the request was sent
    assert record.prompt_tokens > 5 and 0 < ttft <= record.e2e_s and record.chunks[-1][1] == 8


def test_openai_chat_with_and_without_streaming(real: realsglang.RealServer) -> None:
    body = {"model": real.manifest["model_dir"], "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 5, "temperature": 0}
    done = httpx.post(real.url + "/v1/chat/completions", json=body, timeout=120).json()
    assert done["object"] == "chat.completion" and done["choices"][0]["finish_reason"] == "length"
    assert isinstance(done["choices"][0]["message"]["content"], str) and done["usage"]["completion_tokens"] == 5
    streamed = httpx.post(real.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120)
    payloads = events(streamed)
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == done["choices"][0]["message"]["content"]


def test_prompt_beyond_the_context_is_refused_and_recorded_as_failed(real: realsglang.RealServer) -> None:
    long_prompt = "x " * 3000  # about 3000 tokens; the model's context is 2048
    refused = generate(real.url, {"text": long_prompt, "sampling_params": {"max_new_tokens": 4}})
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert "longer than the model's context length (2048 tokens)" in message
    streamed = generate(real.url, {"text": long_prompt, "stream": True, "sampling_params": {"max_new_tokens": 4}})
    payloads = events(streamed)  # HTTP 200, one error event, then [DONE]
    assert streamed.status_code == 200 and payloads[-1] == b"[DONE]"
    assert json.loads(payloads[0])["error"]["message"] == message
    [record] = run(ddsweep_requests(real.url, [long_prompt], 4))
    assert not record.ok and "longer than the model's context length" in record.error
    assert record.completion_tokens is None


def test_a_prompt_whose_new_tokens_do_not_fit_is_refused_and_the_context_length_is_read(
        real: realsglang.RealServer) -> None:
    # what a point reads before its benchmark to leave out the cells that do not fit: /v1/models' max_model_len
    assert TokenizeClient(real.url).context_length() == 2048
    refused = generate(real.url, {"text": "x " * 1000, "sampling_params": {"max_new_tokens": 2000}})
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    prompt_tokens = int(re.search(r"(\d+) tokens from the input messages", message).group(1))
    assert prompt_tokens < 2048  # the prompt fits; with its new tokens it does not
    # the stand-in's refusal of the same counts, word for word
    stand_in = context_refusal(prompt_tokens, 2000, 2048, stream=False, openai=False)
    assert stand_in == (400, {"error": {"message": message}})


def test_an_error_response_body_is_read_by_its_message(real: realsglang.RealServer) -> None:
    # SGLang's own ErrorResponse ({"object": "error", "message", ...}), here its answer to an invalid chat body
    refused = httpx.post(real.url + "/v1/chat/completions", json={"model": "m", "messages": "not a list"},
                         timeout=120)
    body = refused.json()
    assert refused.status_code == 400 and body["object"] == "error", body
    assert stream_error(refused.content) == body["message"] and body["message"]


def test_streamed_abort_ends_with_an_abort_finish_reason(real: realsglang.RealServer) -> None:
    # The tiny model writes the 1500 tokens (all its context allows) in seconds: on a loaded machine the abort can
    # land after the last one, and the request then ends by length. That race is the test machine's, so a request
    # that ended before the abort reached the server is sent again (three tries).
    for attempt in range(3):
        rid = f"ddsweep-abort-{attempt}"
        body = {"rid": rid, "text": PROMPT, "stream": True,
                "sampling_params": {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}}
        with (httpx.Client(timeout=120) as client,
              client.stream("POST", real.url + "/generate", json=body) as response):
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            assert json.loads(first[5:])["meta_info"]["finish_reason"] is None
            aborted = client.post(real.url + "/abort_request", json={"rid": rid})
            assert aborted.status_code == 200
            rest = [line[5:].strip() for line in lines if line.startswith("data:")]
        assert rest[-1] == "[DONE]"
        final = json.loads(rest[-2])["meta_info"]
        if final["finish_reason"]["type"] != "length" or final["completion_tokens"] < 1500:
            break
    assert final["finish_reason"]["type"] == "abort" and "message" in final["finish_reason"]
    assert 0 < final["completion_tokens"] < 1500


def test_client_disconnect_mid_stream_leaves_the_server_serving(real: realsglang.RealServer) -> None:
    body = {"text": PROMPT + "# gone", "stream": True,
            "sampling_params": {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}}
    with httpx.Client(timeout=120) as client, client.stream("POST", real.url + "/generate", json=body) as response:
        next(line for line in response.iter_lines() if line.startswith("data:"))
    # the connection is closed; the server aborts that request and keeps serving others
    after = generate(real.url, {"text": PROMPT, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    assert after.status_code == 200 and after.json()["meta_info"]["completion_tokens"] == 3
    assert httpx.get(real.url + "/health", timeout=10).status_code == 200


def test_concurrent_requests_and_timing_against_sglangs_own_e2e_latency(real: realsglang.RealServer) -> None:
    """Client e2e latency (from sending the request to [DONE]) against meta_info.e2e_latency for the same
    requests: SGLang's clock starts when the tokenizer manager receives the request and stops before the last event
    is sent, so the client's is longer by the HTTP path; on a loaded 2-core machine that gap reaches tenths of a
    second, so the tolerance is 0.5 s plus 25 %."""
    prompts = [f"{PROMPT}# variant {i}\n" for i in range(4)]

    async def timed(client: httpx.AsyncClient, prompt: str) -> tuple[float, dict]:
        body = {"text": prompt, "stream": True, "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}}
        t0 = time.perf_counter()
        async with client.stream("POST", real.url + "/generate", json=body) as response:
            payloads = [line[5:].strip() async for line in response.aiter_lines() if line.startswith("data:")]
        return time.perf_counter() - t0, json.loads(payloads[-2])["meta_info"]

    async def all_at_once() -> list[tuple[float, dict]]:
        async with httpx.AsyncClient(timeout=120) as client:
            return list(await asyncio.gather(*(timed(client, p) for p in prompts)))

    results = run(all_at_once())
    assert len({m["id"] for _, m in results}) == 4 and all(m["completion_tokens"] == 16 for _, m in results)
    gaps = []
    for client_s, meta in results:
        server_s = meta["e2e_latency"]
        gaps.append(client_s - server_s)
        assert server_s <= client_s + 0.01, (server_s, client_s)
        assert client_s - server_s <= 0.5 + 0.25 * server_s, (server_s, client_s)
    print(f"real SGLang e2e, 4 concurrent x 16 tokens: client - server gaps {[round(g, 3) for g in gaps]} s")
    records = run(ddsweep_requests(real.url, prompts, 8))
    assert all(r.error is None and r.completion_tokens == 8 for r in records)


def shape(value: object) -> object:
    """The layout of a JSON value: object keys mapped to their shapes, a list's first element, a leaf's type."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__


def missing_in(real: object, stand_in: object, path: str = "") -> list[str]:
    """Where the stand-in's layout has a key or type the real server's lacks (the stand-in's own labels aside)."""
    if isinstance(stand_in, dict):
        if not isinstance(real, dict):
            return [f"{path}: object vs {real}"]
        return [m for k, v in stand_in.items() if k not in ("simulated", "sglext")
                for m in ([f"{path}.{k}: absent from the real answer"] if k not in real else
                          missing_in(real[k], v, f"{path}.{k}"))]
    if isinstance(stand_in, list):
        return missing_in(real[0], stand_in[0], f"{path}[0]") if stand_in and real else []
    return [] if stand_in == real or "NoneType" in (stand_in, real) else [f"{path}: {stand_in} vs {real}"]


@pytest.fixture(scope="module")
def strict_standin() -> Iterator:
    """A strict autoregressive stand-in with the tiny model's context length."""
    from standin import FAST, Sim

    sim = Sim("--context-length", "2048", *FAST, wait=False, strict=True)
    try:
        sim.wait_healthy(timeout=300)
        yield sim
    finally:
        sim.close()


SERVER_INFO_READ = ("speculative_algorithm", "speculative_num_draft_tokens", "speculative_dflash_block_size",
                    "speculative_draft_window_size", "tp_size", "max_running_requests", "launch_command", "version",
                    "model_path", "served_model_name")
CONFORMANCE = [  # (name, method, path, body): what ddsweep sends, and the refusals it must see as SGLang sends them
    ("tokenize prompt", "POST", "/tokenize", {"prompt": PROMPT, "add_special_tokens": False}),
    ("tokenize messages", "POST", "/tokenize", {"messages": [{"role": "user", "content": PROMPT}]}),
    ("tokenize text", "POST", "/tokenize", {"text": PROMPT}),
    ("generate", "POST", "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}),
    ("generate stream", "POST", "/generate", {"text": PROMPT, "stream": True,
                                              "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}),
    ("generate bad sampling", "POST", "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": "many"}}),
    ("generate too long", "POST", "/generate", {"text": "x " * 3000, "sampling_params": {"max_new_tokens": 4}}),
    ("generate too long stream", "POST", "/generate", {"text": "x " * 3000, "stream": True,
                                                       "sampling_params": {"max_new_tokens": 4}}),
    ("generate past the context with its new tokens", "POST", "/generate",
     {"text": "x " * 1000, "sampling_params": {"max_new_tokens": 2000}}),
    ("generate past the context with its new tokens stream", "POST", "/generate",
     {"text": "x " * 1000, "stream": True, "sampling_params": {"max_new_tokens": 2000}}),
    ("chat", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}),
    ("chat past the context with its new tokens", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x " * 1000}], "max_tokens": 2000}),
    ("models", "GET", "/v1/models", None),
    ("chat stream", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                     "max_tokens": 4, "stream": True}),
    ("chat bad messages", "POST", "/v1/chat/completions", {"messages": "not a list", "max_tokens": 4}),
    ("server_info", "GET", "/server_info", None),
]


def answer(url: str, method: str, path: str, body: dict | None) -> tuple[int, str, list[object]]:
    """Status, content type (without parameters) and the shapes of the answer: one per SSE event, else one."""
    response = httpx.request(method, url + path, json=body, timeout=120)
    kind = response.headers.get("content-type", "").split(";")[0]
    if kind == "text/event-stream":
        assert response.text.endswith("data: [DONE]\n\n")
        assert all(block.startswith("data: ") for block in response.text.split("\n\n") if block)
        return response.status_code, kind, [shape(json.loads(p)) for p in events(response)[:-1]]
    return response.status_code, kind, [shape(response.json())]


@pytest.mark.parametrize("name", [c[0] for c in CONFORMANCE])
def test_stand_in_answers_in_the_real_servers_shape(name: str, real: realsglang.RealServer, strict_standin) -> None:
    """The same request to the strict stand-in and to the real server: same status, content type, SSE framing,
    and every key and type the stand-in sends is one the real server sends."""
    _, method, path, body = next(c for c in CONFORMANCE if c[0] == name)
    status, kind, real_shapes = answer(real.url, method, path, body)
    sim_status, sim_kind, sim_shapes = answer(strict_standin.url, method, path, body)
    if path == "/server_info":  # what ddsweep reads; the stand-in adds its labels and PR #29907's budget field
        sim_shapes = [{k: v for k, v in sim_shapes[0].items() if k in SERVER_INFO_READ}]
    assert (sim_status, sim_kind) == (status, kind)
    problems = [m for s in sim_shapes for m in missing_in(real_shapes[-1], s)] if sim_shapes else []
    if kind == "text/event-stream":  # each stand-in event against the real event at the same stage
        problems = missing_in(real_shapes[0], sim_shapes[0]) + missing_in(real_shapes[-1], sim_shapes[-1])
    assert not problems, problems


# Last in the module: it stops the module's server.
def group_processes(pgid: int) -> dict[int, str]:
    """Live processes of one process group (Linux /proc): pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_stop_leaves_no_process_of_the_server(real: realsglang.RealServer) -> None:
    pgid = real.server.process.pid
    before = group_processes(pgid)
    commands = " | ".join(before.values())
    assert len(before) >= 3 and "sglang::scheduler" in commands and "sglang::detokenizer" in commands, before
    real.server.stop()
    assert group_processes(pgid) == {} and owned_processes(real.server.owner_token) == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(real.url + "/health", timeout=5)
