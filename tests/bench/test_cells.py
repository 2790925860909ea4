"""The load generator against a stand-in started in a subprocess, and its per-request arithmetic."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from standin import FAST, Sim, healthy_together

from ddsweep import figures, storage
from ddsweep.bench.cells import BenchSettings, TokenizeClient, TokenizeError, run_benchmark
from ddsweep.bench.records import RequestRecord, run_request
from ddsweep.bench.transport import (
    HttpResponseParser,
    ProtocolError,
    SseLines,
    StreamState,
    Transport,
    chunk_tokens,
    make_transport,
)

PROSE_EOS = {"name": "prose", "kind": "prose", "ignore_eos": True}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    """A healthy DDTree stand-in and one that fails half of its requests, started in parallel."""
    started = {"ok": Sim("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8", *FAST, wait=False),
               "bad": Sim("--sim-fault", "error-rate:0.5", *FAST, wait=False)}
    yield from healthy_together(started)


def test_benchmark_records_and_figures(sims: dict[str, Sim], tmp_path: Path) -> None:
    settings = BenchSettings(contexts=[64, 256], concurrency=[1, 3], max_new_tokens=24, requests_per_cell=4,
                             min_window_s=0, repeats=2, warmup_requests=2, workloads=[PROSE_EOS])
    lines: list[str] = []
    doc = run_benchmark(sims["ok"].url, tmp_path, settings, simulated=True, progress=lines.append)
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    assert storage.read_json(tmp_path / "cells.json") == json.loads(json.dumps(doc))
    assert len(records) == 2 * 2 * (2 + 2 * 4)
    assert sum(r["warmup"] for r in records) == 2 * 2 * 2
    assert all(r["error"] is None and r["completion_tokens"] == 24 and r["simulated"] for r in records)
    assert len({r["prompt_tokens"] for r in records if r["context"] == 64}) >= 1
    assert all(abs(r["prompt_tokens"] - r["context"]) <= 0.05 * r["context"] for r in records)
    assert len(doc["cells"]) == 8 and len(doc["groups"]) == 4 and doc["simulated"] is True
    assert not any(cell["prompt_tokens_off_target"] for cell in doc["cells"])
    for cell in doc["cells"]:
        measured = [r for r in records if not r["warmup"] and (r["context"], r["concurrency"], r["repeat"]) ==
                    (cell["context"], cell["concurrency"], cell["repeat"])]
        assert cell["requests"] == cell["completed"] == len(measured) == 4  # warmup excluded
        ratio = sum(r["completion_tokens"] for r in measured) / sum(r["spec_verify_ct"] for r in measured)
        assert cell["acceptance_length"] == pytest.approx(ratio)
        assert cell["output_tokens"] == 4 * 24
        assert cell["output_throughput_tok_s"] == pytest.approx(cell["output_tokens"] / cell["wall_s"])
    for r in records:  # the stream as it arrived: increasing times, cumulative counts up to the server's count
        times, counts = [c[0] for c in r["chunks"]], [c[1] for c in r["chunks"]]
        assert times == sorted(times) and times[0] > 0 and times[-1] <= r["e2e_s"]
        assert counts == sorted(counts) and counts[-1] == r["completion_tokens"]
        assert r["cached_tokens"] is not None and r["prompt_fingerprint"]
    group = doc["groups"][0]
    assert group["repeats"] == 2 and len(group["output_throughput_tok_s"]["values"]) == 2
    assert any(line.startswith("cell 8/8") for line in lines)


def test_failures_recorded_and_error_raised_after_files(sims: dict[str, Sim], tmp_path: Path) -> None:
    settings = BenchSettings(contexts=[64], concurrency=[2], max_new_tokens=8, requests_per_cell=10, repeats=2,
                             min_window_s=0, warmup_requests=0, max_failure_fraction=0.1, workloads=[PROSE_EOS])
    run_benchmark(sims["bad"].url, tmp_path, settings, simulated=True)  # failed cells, not a failed benchmark
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    assert len(records) == 20  # both cells ran: a failed cell does not stop the benchmark
    first = [r for r in records[:10] if r["error"]]
    assert first and all(r["error"].startswith("HTTP 500") for r in first)
    doc = storage.read_json(tmp_path / "cells.json")
    cells = doc["cells"]
    assert cells[0]["failed"] == len(first) and cells[0]["completed"] == 10 - len(first)
    failed_cells = [c for c in cells if c.get("cell_failed")]
    assert failed_cells and all("requests failed" in c["failure_reason"] for c in failed_cells)
    assert doc["failed_cells"] == failed_cells


class _Scripted(Transport):
    """A transport replaying SSE payloads with given delays."""

    def __init__(self, chunks: list[tuple[float, bytes]]) -> None:
        self.chunks = chunks

    async def request(self, url: str, payload: dict, state: StreamState) -> None:
        state.sent(time.perf_counter())
        for delay, data in self.chunks:
            await asyncio.sleep(delay)
            if not state.feed(data, time.perf_counter()):
                return


def _chunk(tokens: int, verify: int) -> bytes:
    return json.dumps({"text": "x", "meta_info": {"prompt_tokens": 5, "completion_tokens": tokens,
                                                  "spec_verify_ct": verify, "finish_reason": None}}).encode()


def test_chunks_give_chunk_gaps_per_token_times_and_acceptance() -> None:
    chunks = [(0.01, _chunk(1, 0)), (0.04, _chunk(5, 1)), (0.02, _chunk(7, 2)), (0.0, b"[DONE]")]
    rec = asyncio.run(run_request(_Scripted(chunks), "http://x", "p", 7, RequestRecord(1, 1, 0, 0, False)))
    assert rec.error is None and rec.completion_tokens == 7 and rec.spec_verify_ct == 2
    assert rec.acceptance_length == 3.5
    assert [c[1] for c in rec.chunks] == [1, 5, 7]
    times = figures.request_times(vars(rec))
    assert times.ttft_s == pytest.approx(rec.chunks[0][0]) and len(times.chunk_gaps_s) == 2
    assert 0.035 <= times.chunk_gaps_s[0] < 0.2  # the 40 ms pause, plus whatever a loaded machine adds
    assert len(times.token_gaps_s) == 6  # a chunk of 4 tokens gives 4 per-token times of a quarter of its gap
    assert times.token_gaps_s[:4] == pytest.approx([times.chunk_gaps_s[0] / 4] * 4)
    assert times.token_gaps_s[4:] == pytest.approx([times.chunk_gaps_s[1] / 2] * 2)
    assert times.tpot_s == pytest.approx((rec.e2e_s - times.ttft_s) / 6)


def _abort_chunk(tokens: int) -> bytes:
    reason = {"type": "abort", "message": "Retracted under decode memory pressure", "status_code": 503,
              "err_type": None}
    return json.dumps({"text": "x", "meta_info": {"prompt_tokens": 5, "completion_tokens": tokens,
                                                  "finish_reason": reason}}).encode()


def test_a_streamed_abort_and_an_error_event_are_failures_with_the_servers_message() -> None:
    aborted = asyncio.run(run_request(_Scripted([(0, _chunk(1, 0)), (0, _abort_chunk(2)), (0, b"[DONE]")]),
                                      "http://x", "p", 7, RequestRecord(1, 1, 0, 0, False)))
    assert aborted.error == ("aborted by the server: Retracted under decode memory pressure (status_code 503)")
    assert aborted.finish_reason == "abort" and not aborted.ok
    refused = json.dumps({"error": {"message": "The input (300 tokens) is longer than the model's context length "
                                               "(256 tokens).", "type": "invalid_request_error", "code": 400}})
    long = asyncio.run(run_request(_Scripted([(0, refused.encode()), (0, b"[DONE]")]), "http://x", "p", 7,
                                   RequestRecord(1, 1, 0, 0, False)))
    assert long.error == ("server error in stream: The input (300 tokens) is longer than the model's context "
                          "length (256 tokens).")


def test_cut_and_malformed_streams_are_errors() -> None:
    cut = asyncio.run(run_request(_Scripted([(0, _chunk(1, 0))]), "http://x", "p", 7,
                                  RequestRecord(1, 1, 0, 0, False)))
    assert cut.error is not None and "without [DONE]" in cut.error
    bad = asyncio.run(run_request(_Scripted([(0, _chunk(1, 0)), (0, b'{"text": ')]), "http://x", "p", 7,
                                  RequestRecord(1, 1, 0, 0, False)))
    assert bad.error is not None and bad.error.startswith("malformed")


def test_chunk_times_are_kept_to_the_microsecond() -> None:
    state = StreamState([])
    state.sent(1000.123456789)
    assert state.feed(_chunk(1, 0), 1000.136484447) and state.feed(_chunk(2, 0), 1000.2)
    assert state.chunks == [[0.013028, 1], [0.076543, 2]]


# --------------------------------------------------------------------------- stream parsing
def _sse(tokens: int, verify: int, text: str = "x", finish: dict | None = None) -> bytes:
    meta = {"prompt_tokens": 5, "completion_tokens": tokens, "spec_verify_ct": verify, "finish_reason": finish}
    return b"data: " + json.dumps({"text": text, "meta_info": meta, "index": 0}).encode() + b"\n\n"


def test_chunk_tokens_reads_meta_info_only() -> None:
    assert chunk_tokens(_sse(7, 2)[6:-2]) == 7
    tricky = 'he said "meta_info": {"completion_tokens": 99} \\ \u00e9'
    assert chunk_tokens(_sse(3, 1, text=tricky)[6:-2]) == 3
    assert chunk_tokens(b'{"text": "x", "meta_info": {"completion_tokens": 4}}') == 4
    for bad in (b'{"text": "x", "meta_info": {', b'{"text": "x"}', b'{"text": "x", "meta_info": []}',
                b'{"meta_info": {"completion_tokens": "4"}}', b'{"meta_info": {"completion_tokens": true}}',
                b'["meta_info": {"completion_tokens": 4}]', b'{"meta_info": {"completion_tokens": 4', b""):
        assert chunk_tokens(bad) is None, bad


def test_sse_lines_split_anywhere() -> None:
    body = (_sse(1, 0) + b": keep-alive comment\r\nevent: x\r\n" + _sse(5, 1).replace(b"\n", b"\r\n")
            + b"data: [DONE]\n\n")
    expected = [_sse(1, 0)[6:-2], _sse(5, 1)[6:-2], b"[DONE]"]
    got: list[bytes] = []
    for size in (1, 2, 7, 64, len(body)):
        got.clear()
        lines = SseLines(lambda data, now: got.append(data) is None)
        for i in range(0, len(body), size):
            lines.feed(body[i:i + size], 0.0)
        assert got == expected, size
    got.clear()
    lines = SseLines(lambda data, now: got.append(data) is None and len(got) < 2)
    lines.feed(body, 0.0)
    lines.feed(_sse(9, 2), 0.0)
    assert len(got) == 2 and lines.stopped  # nothing is delivered once the consumer said stop


def _chunked(*parts: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(b"%x;ext=1\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n" + trailer + b"\r\n"


def _parse(raw: bytes, size: int) -> tuple[HttpResponseParser, bytes]:
    body: list[bytes] = []
    parser = HttpResponseParser(lambda data, now: body.append(data))
    for i in range(0, len(raw), size):
        parser.feed(raw[i:i + size], 0.0)
    return parser, b"".join(body)


def test_http_parser_chunked_split_anywhere() -> None:
    events = _sse(1, 0) + _sse(5, 1) + b"data: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    raw = head + _chunked(events[:30], events[30:], trailer=b"X-Trailer: 1\r\n")
    for size in (1, 3, 16, len(raw)):
        parser, body = _parse(raw + b"HTTP/1.1 200", size)
        assert parser.complete and parser.keep_alive and parser.status == 200 and body == events, size
    parser, _ = _parse(raw[:-3], 5)
    assert not parser.complete


def test_http_parser_lengths_close_and_errors() -> None:
    parser, body = _parse(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nerrorXX", 2)
    assert parser.complete and parser.status == 500 and body == b"error"
    parser, body = _parse(b"HTTP/1.0 200 OK\r\n\r\ndata: 1\n", 4)
    assert not parser.complete and not parser.keep_alive
    parser.feed_eof()
    assert parser.complete and body == b"data: 1\n"
    parser, _ = _parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 100)
    assert parser.complete and not parser.keep_alive
    for raw in (b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY"):
        with pytest.raises(ProtocolError):
            _parse(raw, 100)


# --------------------------------------------------------------------------- the asyncio client end to end
Script = list[tuple[float, bytes]]
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"


def _stream(*events: bytes) -> bytes:
    return STREAM_HEAD + _chunked(*events)


async def _serve_scripts(scripts: list[Script], close_idle: bool = False) -> tuple[asyncio.Server, list[int]]:
    """A TCP server answering each request with the next script of (delay, bytes) writes; a b"" write closes.

    Returns the server and a list collecting each request's connection number. With `close_idle` the server closes
    a connection right after its first response (as a keep-alive timeout would), without saying so.
    """
    seen: list[int] = []
    conns = iter(range(1000))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = next(conns)
        try:
            while scripts:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                json.loads(await reader.readexactly(length))
                seen.append(number)
                for delay, data in scripts.pop(0):
                    await asyncio.sleep(delay)
                    if not data:
                        writer.close()
                        return
                    writer.write(data)
                    await writer.drain()
                if close_idle:
                    await asyncio.sleep(0.05)
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


def _run_raw(scripts: list[Script], requests: int, close_idle: bool = False, took: list[float] | None = None,
             gap_s: float = 0.0) -> tuple[list[RequestRecord], list[int]]:
    """Run `requests` requests one after the other (`gap_s` apart) against scripted responses; their durations
    go to `took`."""
    async def main() -> tuple[list[RequestRecord], list[int]]:
        server, seen = await _serve_scripts(scripts, close_idle)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        transport = make_transport("asyncio")
        await transport.open(1)
        records = []
        for i in range(requests):
            await asyncio.sleep(gap_s if i else 0.0)
            start = time.perf_counter()
            records.append(await run_request(transport, url, "p", 8, RequestRecord(1, 1, 0, i, False)))
            if took is not None:
                took.append(time.perf_counter() - start)
        await transport.close()
        server.close()
        return records, seen

    return asyncio.run(main())


def test_asyncio_client_streams_and_reuses_the_connection() -> None:
    events = _sse(1, 0) + _sse(5, 1) + _sse(8, 2, finish={"type": "length", "length": 8}) + b"data: [DONE]\n\n"
    raw = _stream(events)
    split = raw.index(b'"completion_tokens": 5') - 3  # splits the second event and its chunk
    # Pauses long against a loaded machine's scheduling delays (tens of ms under the parallel suite).
    script = [(0.0, raw[:split]), (0.2, raw[split:])]
    late_end = [(0.0, raw[:-5]), (0.4, raw[-5:])]  # the body's last chunk comes well after [DONE]
    took: list[float] = []
    records, seen = _run_raw([script, late_end, [(0.0, raw)]], requests=3, took=took, gap_s=0.6)
    first, second, third = records
    assert [r.error for r in records] == [None, None, None]
    assert took[1] < 0.3  # done at [DONE], not when the body ends
    assert first.completion_tokens == 8 and first.spec_verify_ct == 2 and first.finish_reason == "length"
    assert first.acceptance_length == 4.0 and first.prompt_tokens == 5
    assert [c[1] for c in first.chunks] == [1, 5, 8]
    assert 0.19 <= first.chunks[1][0] - first.chunks[0][0] < 0.35  # the pause between events
    assert first.chunks[0][0] < 0.15  # the first event arrived before the pause
    assert third.completion_tokens == 8 and seen == [0, 0, 0]  # kept alive: all on one connection


def test_asyncio_client_failures() -> None:
    good = _sse(1, 0) + _sse(5, 1)
    cut = [(0.0, STREAM_HEAD + b"%x\r\n%b\r\n" % (len(good), good)), (0.01, b"")]
    no_done = [(0.0, _stream(good))]
    broken = b'data: {"text": "ab", "meta_info": {\n\n'
    malformed = [(0.0, STREAM_HEAD + b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (_sse(1, 0), broken))),
                 (2.0, _chunked(_sse(5, 1)))]
    error = [(0.0, b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 12\r\n\r\nsimulated 500")]
    garbage = [(0.0, b"nonsense\r\n\r\n")]
    closed = [(0.0, b"")]
    took: list[float] = []
    records, _ = _run_raw([cut, no_done, malformed, error, garbage, closed], requests=6, took=took)
    errors = [r.error or "" for r in records]
    assert "without [DONE]" in errors[0] and records[0].completion_tokens == 5
    assert "without [DONE]" in errors[1]
    assert errors[2].startswith("malformed stream chunk") and took[2] < 1.0  # no waiting for the rest
    assert errors[3] == "HTTP 500: simulated 50"
    assert errors[4].startswith("ProtocolError: bad status line")
    assert errors[5].startswith("_StaleConnection") and "before the response head" in errors[5]
    assert all(r.end_ts is not None and r.e2e_s is not None for r in records)


def test_asyncio_client_retries_a_connection_closed_while_idle() -> None:
    raw = _stream(_sse(1, 0), _sse(4, 1), b"data: [DONE]\n\n")
    records, seen = _run_raw([[(0.0, raw)], [(0.0, raw)]], requests=2, close_idle=True)
    assert [r.error for r in records] == [None, None] and seen == [0, 1]


def test_the_tokenize_client_reopens_a_connection_the_server_closed_and_names_a_bad_answer() -> None:
    peers: set[int] = set()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            peers.add(self.client_address[1])
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, answer = (400, {"object": "error", "message": "no"}) if body["prompt"] == "bad" else (
                200, {"tokens": [7, 8, 9], "count": 3})
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True  # a keep-alive answer, then the server closes the connection unannounced

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = TokenizeClient(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        assert client({"prompt": "a"}) == [7, 8, 9]
        assert client({"prompt": "b"}) == [7, 8, 9]  # on the connection the server had closed: reopened once
        assert len(peers) == 2
        with pytest.raises(TokenizeError, match=r"/tokenize answered HTTP 400: .*no"):
            client({"prompt": "bad"})
    finally:
        client.close()
        server.shutdown()
        server.server_close()


def test_tokenize_clients_sharing_known_answers_ask_the_server_once_per_body(monkeypatch) -> None:
    asked: list[bytes] = []

    def post(self: TokenizeClient, payload: bytes) -> tuple[int, bytes]:
        asked.append(payload)
        return 200, json.dumps({"tokens": [len(asked)], "count": 1}).encode()

    monkeypatch.setattr(TokenizeClient, "_post", post)
    known: dict[bytes, tuple[int, ...]] = {}
    check, bench = TokenizeClient("http://127.0.0.1:1", known), TokenizeClient("http://127.0.0.1:1", known)
    first = check({"prompt": "a"})
    first.append(99)  # a caller's list is its own
    assert bench({"prompt": "a"}) == [1] and check({"prompt": "b"}) == [2]
    assert len(asked) == 2
    assert TokenizeClient("http://127.0.0.1:1")({"prompt": "a"}) == [3]  # a client of its own asks again
