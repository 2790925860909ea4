"""The hand-written HTTP/1.1 client against the HTTP stack SGLang serves with: FastAPI on uvicorn, streaming
responses (chunked bodies), keep-alive, `Connection: close`, error bodies, a stream cut mid-event, a slow first
byte. Skipped where fastapi or uvicorn is missing (the test extras install both)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from ddsweep.bench.records import RequestRecord, run_request
from ddsweep.bench.transport import HttpError, StreamState, make_transport

fastapi = pytest.importorskip("fastapi", reason="needs fastapi (pip install -e '.[test]')")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn (pip install -e '.[test]')")
from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402

TOKENS = 12


def _event(tokens: int, verify: int, done: bool = False) -> bytes:
    meta = {"prompt_tokens": 7, "completion_tokens": tokens, "spec_verify_ct": verify,
            "finish_reason": {"type": "length", "length": tokens} if done else None}
    return b"data: " + json.dumps({"text": "x" * tokens, "meta_info": meta}).encode() + b"\n\n"


def build_app() -> tuple[object, list[tuple[str, int]]]:
    """A FastAPI app shaped like SGLang's /generate, with one route per behaviour; it records client ports."""
    app = fastapi.FastAPI()
    peers: list[tuple[str, int]] = []

    async def events(first_delay: float = 0.0, cut: bool = False, steps: int = 3) -> AsyncIterator[bytes]:
        await asyncio.sleep(first_delay)
        for step in range(1, steps + 1):
            yield _event(4 * step, step, done=step == steps)
            if cut and step == 2:
                yield b'data: {"text": "xxxxxxxx", "meta_'  # half an event, then the connection drops
                raise RuntimeError("simulated crash mid-stream")
            await asyncio.sleep(0.01)
        yield b"data: [DONE]\n\n"

    @app.middleware("http")
    async def remember_peer(request: fastapi.Request, call_next):  # noqa: ANN202 (FastAPI's middleware form)
        peers.append((request.url.path, request.client.port))
        return await call_next(request)

    @app.post("/generate")
    async def generate() -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/close/generate")
    async def close() -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream", headers={"Connection": "close"})

    @app.post("/capped/generate")
    async def capped() -> StreamingResponse:  # SGLang lowered max_new_tokens (e.g. to fit the context length)
        return StreamingResponse(events(steps=2), media_type="text/event-stream")

    @app.post("/slow/generate")
    async def slow() -> StreamingResponse:
        return StreamingResponse(events(first_delay=0.3), media_type="text/event-stream")

    @app.post("/cut/generate")
    async def cut() -> StreamingResponse:
        return StreamingResponse(events(cut=True), media_type="text/event-stream")

    @app.post("/error/generate")
    async def error() -> JSONResponse:
        return JSONResponse({"error": {"message": "Either text, input_ids or input_embeds should be provided."}},
                            status_code=400)

    @app.post("/object-error/generate")
    async def object_error() -> JSONResponse:  # SGLang's HTTPException handler (ErrorResponse)
        return JSONResponse({"object": "error", "message": "Server is not ready", "type": "503", "code": 503},
                            status_code=503)

    return app, peers


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """The app on uvicorn in a thread (its default HTTP implementation, as SGLang runs it)."""
    app, peers = build_app()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical",
                                           timeout_keep_alive=5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", peers
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _requests(base: str, paths: list[str]) -> list[RequestRecord]:
    """Send one request per path, one after the other, on one asyncio transport (as a cell at concurrency 1)."""
    async def main() -> list[RequestRecord]:
        transport = make_transport("asyncio")
        await transport.open(1)
        out = []
        for i, path in enumerate(paths):
            out.append(await run_request(transport, base + path, "p", TOKENS, RequestRecord(1, 1, 0, i, False)))
            await asyncio.sleep(0.05)  # lets the chunked body's terminator arrive before the next request
        await transport.close()
        return out

    return asyncio.run(main())


def test_chunked_streams_parse_and_keep_alive_reuses_one_connection(served) -> None:
    base, peers = served
    peers.clear()
    records = _requests(base, ["", "", ""])
    assert [r.error for r in records] == [None, None, None]
    assert all(r.completion_tokens == TOKENS and r.spec_verify_ct == 3 and r.finish_reason == "length"
               for r in records)
    assert records[0].acceptance_length == 4.0 and [c[1] for c in records[0].chunks] == [4, 8, TOKENS]
    assert len({port for _, port in peers}) == 1  # one TCP connection carried all three


def test_connection_close_is_honoured_and_the_next_request_opens_a_new_connection(served) -> None:
    base, peers = served
    peers.clear()
    records = _requests(base, ["/close", "/close", ""])
    assert [r.error for r in records] == [None, None, None]
    assert len({port for _, port in peers}) == 3


def test_error_body_is_reported_with_status_and_message(served) -> None:
    base, peers = served
    peers.clear()
    error, after = _requests(base, ["/error", ""])
    assert error.error.startswith("HTTP 400") and "input_embeds should be provided" in error.error
    assert after.error is None and len({port for _, port in peers}) == 1  # a complete error body keeps the connection


def test_a_request_the_server_ended_by_length_short_of_the_tokens_asked_fails_naming_both(served) -> None:
    base, _ = served
    capped, full = _requests(base, ["/capped", ""])
    assert capped.error.startswith("the server stopped the request at 8 of the 12 new tokens asked")
    assert capped.completion_tokens == 8 and capped.finish_reason == "length"  # what it measured stays recorded
    assert full.error is None and full.completion_tokens == TOKENS


def test_sglangs_error_response_body_is_reported_by_its_message(served) -> None:
    base, _ = served
    (error,) = _requests(base, ["/object-error"])
    assert error.error == "HTTP 503: Server is not ready"


def test_stream_cut_mid_event_is_an_error_with_the_tokens_seen(served) -> None:
    base, _ = served
    cut, after = _requests(base, ["/cut", ""])
    assert cut.error is not None and cut.completion_tokens == 8
    assert after.error is None and after.completion_tokens == TOKENS


def test_slow_first_byte_is_time_to_first_token(served) -> None:
    base, _ = served
    (slow,) = _requests(base, ["/slow"])
    # The server sleeps 0.3 s from when it read the request; the client stamps the send after its write returns,
    # which in this one-process setup can be a GIL switch interval (5 ms) after the server thread took over.
    assert slow.error is None and 0.3 - 0.02 <= slow.chunks[0][0] < 1.5


def test_http_error_type_from_the_transport(served) -> None:
    base, _ = served

    async def main() -> None:
        transport = make_transport("asyncio")
        await transport.open(1)
        try:
            with pytest.raises(HttpError, match="HTTP 400"):
                await transport.request(base + "/error/generate", {"text": "x"}, StreamState([]))
        finally:
            await transport.close()

    asyncio.run(main())


def test_the_asyncio_clock_starts_before_the_request_reaches_the_socket() -> None:
    # write() hands the bytes to the socket at once; a loop thread that lost the CPU right after it (a busy
    # machine: prompt-building threads, other processes) once timed a whole 16-token answer as 24 µs
    from ddsweep.bench import transport as transport_module

    class Connection:
        written_at: float | None = None

        @property
        def transport(self) -> Connection:
            return self

        def begin(self, _state: StreamState) -> asyncio.Future:
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

        def write(self, _message: bytes) -> None:
            self.written_at = time.perf_counter()
            time.sleep(0.05)  # descheduled as the bytes go out

    connection, state = Connection(), StreamState([])
    asyncio.run(transport_module._RawTransport._exchange(connection, b"POST /generate", state))
    assert state.t0 is not None and state.t0 <= connection.written_at
