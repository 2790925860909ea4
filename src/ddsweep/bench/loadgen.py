"""`ddsweep bench`: the benchmark run at every sweep point against SGLang's native streaming /generate.

For each (context, concurrency) it sends warmup requests (recorded, flagged, excluded from every figure), then
`repeats` cells of `requests_per_cell` greedy requests with `ignore_eos`, each with its own prompt. The requests
of a cell are appended to requests.jsonl in the order they finished as soon as the cell is over (or fails, or is
interrupted): serializing a record costs ~0.2 ms, and doing it while other streams are in flight delays their
timestamps. cells.json (per cell and per group across repeats) is rewritten atomically after each cell.
Acceptance is always the ratio of per-request sums, never a server counter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from ddsweep import storage
from ddsweep.bench import metrics, prompts
from ddsweep.config.defaults import schema_default

HTTP_CLIENTS = ("asyncio", "aiohttp", "httpx")
PROGRESS_INTERVAL_S = 2.0


@dataclass
class BenchSettings:
    """What to measure: the (context, concurrency) matrix, request counts, limits and the seed."""

    contexts: list[int]
    concurrency: list[int]
    max_new_tokens: int = schema_default("benchmark.max_new_tokens")
    requests_per_cell: int = schema_default("benchmark.requests_per_cell")
    repeats: int = schema_default("benchmark.repeats")
    warmup_requests: int = schema_default("benchmark.warmup_requests")
    max_failure_fraction: float = schema_default("benchmark.max_failure_fraction")
    request_timeout_s: float = schema_default("benchmark.request_timeout_s")
    seed: int = schema_default("benchmark.seed")
    request_rate: float | None = schema_default("benchmark.request_rate")
    http_client: str = "asyncio"


class BenchmarkError(RuntimeError):
    """A cell had more failed requests than allowed (raised after the result files are written)."""


@dataclass
class RequestRecord:
    """One benchmark request, as one line of requests.jsonl (see docs/results-schema.md)."""

    context: int
    concurrency: int
    repeat: int
    index: int
    warmup: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    start_ts: float | None = None
    end_ts: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    decode_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    spec_verify_ct: int | None = None
    acceptance_length: float | None = None
    error: str | None = None
    simulated: bool = False

    @property
    def ok(self) -> bool:
        """Whether the request completed without error."""
        return self.error is None


# --------------------------------------------------------------------------- stream parsing
_META_KEY = b'"meta_info":'
_DECODER = json.JSONDecoder()


def chunk_tokens(data: bytes) -> int | None:
    """Cumulative `meta_info.completion_tokens` of one SSE payload, decoding only `meta_info` (None if malformed).

    The whole payload carries the cumulative text, so decoding it every chunk costs O(n^2) per request. In valid
    JSON the bytes `"meta_info":` can only be that key (a quote inside a string is escaped), and it follows
    `text`, so the last occurrence is found from the end and only the small object after it is decoded.
    """
    pos = data.rfind(_META_KEY)
    if pos < 0 or not data.startswith(b"{"):
        return None
    try:
        rest = data[pos + len(_META_KEY):].decode("utf-8")
        meta, _ = _DECODER.raw_decode(rest, len(rest) - len(rest.lstrip()))
        tokens = meta["completion_tokens"]
    except (ValueError, KeyError, TypeError):
        return None
    return tokens if type(tokens) is int else None


class _StreamState:
    """Progress of one streamed request, fed with every SSE data payload and the time its bytes arrived."""

    __slots__ = ("t0", "first", "last", "end", "tokens", "itl", "done", "error", "final")

    def __init__(self, itl: list[float]) -> None:
        """Start empty; inter-token gaps are appended to `itl`."""
        self.t0: float | None = None
        self.first: float | None = None
        self.last = 0.0
        self.end: float | None = None
        self.tokens = 0
        self.itl = itl
        self.done = False
        self.error: str | None = None
        self.final = b""

    def sent(self, now: float) -> None:
        """Record when the request was handed to the socket (perf_counter seconds)."""
        self.t0 = self.last = now

    def feed(self, data: bytes, now: float) -> bool:
        """Account one payload that arrived at `now`; False once the stream is over ([DONE] or malformed)."""
        if data == b"[DONE]":
            self.done, self.end = True, now
            return False
        tokens = chunk_tokens(data)
        if tokens is None:
            self.error = f"malformed stream chunk: {data[:80].decode('utf-8', 'replace')!r}"
            self.end = now
            return False
        self.final = data
        new = tokens - self.tokens
        if new > 0:
            if self.first is None:
                self.first = now
            else:
                self.itl.extend([(now - self.last) / new] * new)
            self.last = now
            self.tokens = tokens
        return True


class SseLines:
    """Splits a response body, fed in arbitrary pieces, into the payloads of its `data:` lines."""

    def __init__(self, on_data: Callable[[bytes, float], bool]) -> None:
        """Deliver every payload to `on_data(payload, arrival time)`; stop delivering once it returns False."""
        self._on_data = on_data
        self._partial = b""
        self.stopped = False

    def feed(self, body: bytes, now: float) -> None:
        """Consume body bytes that arrived at `now`."""
        if self.stopped:
            return
        if self._partial:
            body = self._partial + body
        start = 0
        while (nl := body.find(b"\n", start)) >= 0:
            line = body[start:nl]
            start = nl + 1
            if line.startswith(b"data:") and not self._on_data(line[5:].strip(), now):
                self.stopped = True
                return
        self._partial = body[start:]


class ProtocolError(Exception):
    """The server's bytes are not a valid HTTP/1.1 response."""


class HttpResponseParser:
    """Incremental HTTP/1.1 response parser (status, headers, chunked / Content-Length / until-close body)."""

    def __init__(self, on_body: Callable[[bytes, float], None]) -> None:
        """Deliver decoded body bytes to `on_body(bytes, arrival time)`."""
        self._on_body = on_body
        self._buf = b""
        self._mode = ""
        self._left = 0
        self._skip = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.complete = False

    def feed(self, data: bytes, now: float) -> None:
        """Consume bytes that arrived at `now`; raises ProtocolError on a malformed response."""
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos = 0
        if not self._mode:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    raise ProtocolError("response head larger than 64 KiB")
                self._buf = buf
                return
            self._head(buf[:end])
            pos = end + 4
        if self._mode == "chunked":
            pos = self._chunked(buf, pos, now)
        elif pos < len(buf) and not self.complete:
            body = buf[pos:pos + self._left] if self._mode == "length" else buf[pos:]
            if self._mode == "length":
                self._left -= len(body)
                self.complete = self._left == 0
            self._on_body(body, now)
            pos = len(buf)
        self._buf = buf[pos:]

    def feed_eof(self) -> None:
        """The connection closed: completes an until-close body, otherwise leaves the response incomplete."""
        if self._mode == "close":
            self.complete = True
        self.keep_alive = False

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()
        conn = self.headers.get("connection", "").lower()
        self.keep_alive = conn != "close" and (parts[0] == "HTTP/1.1" or conn == "keep-alive")
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._mode = "chunked"
        elif "content-length" in self.headers:
            if not self.headers["content-length"].isdigit():
                raise ProtocolError(f"bad Content-Length {self.headers['content-length'][:40]!r}")
            self._mode, self._left = "length", int(self.headers["content-length"])
            self.complete = self._left == 0
        else:
            self._mode, self.keep_alive = "close", False

    def _chunked(self, buf: bytes, pos: int, now: float) -> int:
        """Decode chunks from `buf[pos:]`; returns where the undecoded rest starts."""
        size = len(buf)
        while pos < size and not self.complete:
            if self._left:
                piece = buf[pos:pos + self._left]
                self._left -= len(piece)
                pos += len(piece)
                self._on_body(piece, now)
                if self._left:
                    break
                self._skip = 2
            if self._skip:
                if size - pos < self._skip:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunk not terminated by CRLF")
                pos += 2
                self._skip = 0
                continue
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                break
            try:
                length = int(buf[pos:nl].split(b";", 1)[0], 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {buf[pos:nl][:40]!r}") from None
            if length == 0:
                end = buf.find(b"\r\n\r\n", nl)
                if end < 0:
                    break
                self.complete = True
                return end + 4
            self._left = length
            pos = nl + 2
        return pos


# --------------------------------------------------------------------------- HTTP transports
class _Transport:
    """Sends one streaming POST and feeds its SSE payloads to a _StreamState; one subclass per HTTP client."""

    async def open(self, connections: int) -> None:
        """Create the connection pool, sized for `connections` requests in flight."""

    async def warm(self, url: str, connections: int) -> None:
        """Make sure `connections` connections to `url` are open before a cell starts (where supported)."""

    async def close(self) -> None:
        """Close the connection pool."""

    async def request(self, url: str, payload: dict, state: _StreamState) -> None:
        """POST `payload`, call `state.sent`, feed payloads until it returns False; _HttpError on a non-200."""
        raise NotImplementedError


class _HttpError(Exception):
    """A non-200 response."""


def _http_error(status: int, body: bytes) -> _HttpError:
    return _HttpError(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")


class _StaleConnection(ConnectionResetError):
    """The connection closed before any byte of the response arrived."""


class _RawConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that parses the response in `data_received`, timestamping arrivals."""

    def __init__(self) -> None:
        """Start idle and unconnected."""
        self.transport: Any = None
        self.closed = False
        self._parser: HttpResponseParser | None = None
        self._sse: SseLines | None = None
        self._waiter: asyncio.Future | None = None
        self._error_body = b""
        self.on_complete: Callable[[], None] | None = None

    def connection_made(self, transport: Any) -> None:
        """Keep the transport."""
        self.transport = transport

    def begin(self, state: _StreamState) -> asyncio.Future:
        """Expect a response whose events go to `state`; the returned future resolves when it is over."""
        self._sse = SseLines(state.feed)
        self._parser = HttpResponseParser(self._body)
        self._error_body = b""
        self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    @property
    def reusable(self) -> bool:
        """Whether the last response completed and the connection can carry another request."""
        return not self.closed and self._parser is not None and self._parser.complete and self._parser.keep_alive

    def _body(self, data: bytes, now: float) -> None:
        assert self._parser is not None and self._sse is not None
        if self._parser.status == 200:
            self._sse.feed(data, now)
        elif len(self._error_body) < 200:
            self._error_body += data

    def data_received(self, data: bytes) -> None:
        """Parse what arrived, with one timestamp taken as the bytes are read off the socket."""
        now = time.perf_counter()
        parser, waiter = self._parser, self._waiter
        if parser is None or waiter is None or parser.complete:
            return
        try:
            parser.feed(data, now)
        except ProtocolError as exc:
            if not waiter.done():
                waiter.set_exception(exc)
            self.transport.abort()
            return
        if waiter.done():  # [DONE] was handed over already: this reads the rest of the body, for reuse
            if parser.complete and self.on_complete is not None:
                callback, self.on_complete = self.on_complete, None
                callback()
        elif parser.complete:
            if parser.status != 200:
                waiter.set_exception(_http_error(parser.status, self._error_body))
            else:
                waiter.set_result(None)
        elif self._sse is not None and self._sse.stopped:
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        """Finish a pending response: an until-close body ends here, any other is cut (state lacks [DONE])."""
        self.closed = True
        if self.on_complete is not None:
            callback, self.on_complete = self.on_complete, None
            callback()
        parser, waiter = self._parser, self._waiter
        if waiter is None or waiter.done():
            return
        if parser is None or not parser.status:
            waiter.set_exception(_StaleConnection("connection closed before the response head"))
            return
        parser.feed_eof()
        if parser.status != 200:
            waiter.set_exception(_http_error(parser.status, self._error_body))
        else:
            waiter.set_result(None)


def _endpoint(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"unsupported URL {url!r}")
    return parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


class _RawTransport(_Transport):
    """HTTP/1.1 on a raw asyncio Protocol: one connection per in-flight request, reused when kept alive."""

    async def open(self, connections: int) -> None:
        """Start with an empty pool; connections are made by `warm` or on demand, and kept."""
        self._idle: dict[tuple[str, str, int], list[_RawConnection]] = {}
        self._draining: set[_RawConnection] = set()
        self._ssl: ssl.SSLContext | None = None

    async def warm(self, url: str, connections: int) -> None:
        """Open idle connections up to `connections`, so a cell's first requests do not wait on a connect storm;
        a failed connect is left for the request itself to report."""
        key = _endpoint(url)
        pool = self._idle.setdefault(key, [])
        pool[:] = [conn for conn in pool if not conn.closed]
        made = await asyncio.gather(*(self._new_connection(key) for _ in range(connections - len(pool))),
                                    return_exceptions=True)
        pool.extend(conn for conn in made if isinstance(conn, _RawConnection))

    async def close(self) -> None:
        """Close every idle or draining connection."""
        for conn in [c for pool in self._idle.values() for c in pool] + list(self._draining):
            conn.transport.close()
        self._idle.clear()
        self._draining.clear()

    async def _new_connection(self, key: tuple[str, str, int]) -> _RawConnection:
        scheme, host, port = key
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()  # loading CA certificates costs ~25 ms: once per run
        ctx = self._ssl if scheme == "https" else None
        _, conn = await asyncio.get_running_loop().create_connection(_RawConnection, host, port, ssl=ctx)
        return conn

    async def request(self, url: str, payload: dict, state: _StreamState) -> None:
        """Send the request on a pooled connection and wait until the stream is over.

        A kept-alive connection the server closed while idle (its keep-alive timeout) fails before any response
        byte; the request is then sent once more on a new connection.
        """
        parts = urlsplit(url)
        key = _endpoint(url)
        pool = self._idle.setdefault(key, [])
        body = json.dumps(payload).encode()
        message = (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                   f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
        while pool and pool[-1].closed:
            pool.pop()
        reused = bool(pool)
        conn = pool.pop() if reused else await self._new_connection(key)
        try:
            await self._exchange(conn, message, state)
        except _StaleConnection:
            if not reused:
                raise
            conn = await self._new_connection(key)
            await self._exchange(conn, message, state)
        finally:
            self._release(conn, pool, state.done)

    def _release(self, conn: _RawConnection, pool: list[_RawConnection], done: bool) -> None:
        """Pool a connection whose response is complete; one that delivered [DONE] but not yet the end of its
        chunked body is pooled once that arrives; any other is dropped."""
        if conn.reusable:
            pool.append(conn)
        elif done and not conn.closed:
            self._draining.add(conn)

            def drained() -> None:
                self._draining.discard(conn)
                if conn.reusable:
                    pool.append(conn)
                else:
                    conn.transport.close()

            conn.on_complete = drained
        elif not conn.closed:
            conn.transport.abort()

    @staticmethod
    async def _exchange(conn: _RawConnection, message: bytes, state: _StreamState) -> None:
        waiter = conn.begin(state)
        conn.transport.write(message)
        state.sent(time.perf_counter())
        await waiter


class _HttpxTransport(_Transport):
    """httpx.AsyncClient transport."""

    async def open(self, connections: int) -> None:
        """Create the client with a pool as large as the highest concurrency."""
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None))

    async def close(self) -> None:
        """Close the client."""
        await self.client.aclose()

    async def request(self, url: str, payload: dict, state: _StreamState) -> None:
        """Stream SSE data payloads via httpx, timestamped as each line is handed over."""
        clock = time.perf_counter
        state.sent(clock())
        async with self.client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                raise _http_error(resp.status_code, await resp.aread())
            async for line in resp.aiter_lines():
                if line.startswith("data:") and not state.feed(line[5:].strip().encode(), clock()):
                    return


class _AiohttpTransport(_Transport):
    """aiohttp.ClientSession transport."""

    async def open(self, connections: int) -> None:
        """Create the session with a pool as large as the highest concurrency."""
        import aiohttp

        connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                             read_bufsize=1 << 18)

    async def close(self) -> None:
        """Close the session."""
        await self.session.close()

    async def request(self, url: str, payload: dict, state: _StreamState) -> None:
        """Stream SSE data payloads via aiohttp, timestamped as each line is handed over."""
        clock = time.perf_counter
        state.sent(clock())
        async with self.session.post(url, json=payload) as resp:
            if resp.status != 200:
                raise _http_error(resp.status, await resp.read())
            async for line in resp.content:
                if line.startswith(b"data:") and not state.feed(line[5:].strip(), clock()):
                    return


def _transport(name: str) -> _Transport:
    if name == "asyncio":
        return _RawTransport()
    if name == "httpx":
        return _HttpxTransport()
    if name == "aiohttp":
        return _AiohttpTransport()
    raise ValueError(f"unknown HTTP client {name!r}; choose from {', '.join(HTTP_CLIENTS)}")


# --------------------------------------------------------------------------- one request
async def run_request(transport: _Transport, url: str, prompt: str, max_new_tokens: int,
                      record: RequestRecord) -> RequestRecord:
    """Send one streaming greedy /generate request and fill `record` with its timings and counts.

    The end is the arrival of [DONE]. The asyncio client starts the clock when the request is written to an open
    connection (the server sees nothing before) and times each chunk in `data_received`, as its bytes arrive;
    aiohttp and httpx start it when the call is made and time a chunk when its line is handed over.
    """
    payload = {"text": prompt, "stream": True,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    clock = time.perf_counter
    wall0, perf0 = time.time(), clock()
    record.start_ts = wall0
    state = _StreamState(record.itl_s)
    try:
        await transport.request(url + "/generate", payload, state)
    except _HttpError as exc:
        record.error = str(exc)
    except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, ProtocolError) as exc:
        record.error = f"{type(exc).__name__}: {exc or 'connection error'}"
    except Exception as exc:  # aiohttp's errors, without importing it when unused
        if type(exc).__module__.split(".")[0] != "aiohttp":
            raise
        record.error = f"{type(exc).__name__}: {exc or 'connection error'}"
    end = state.end if state.end is not None else clock()
    t0 = state.t0 if state.t0 is not None else perf0
    record.start_ts = wall0 + (t0 - perf0)
    record.end_ts = wall0 + (end - perf0)
    record.error = record.error or state.error
    meta: dict = {}
    if state.final:
        try:
            meta = json.loads(state.final)["meta_info"]
            if not isinstance(meta, dict):
                raise TypeError("meta_info is not an object")
        except (ValueError, KeyError, TypeError):
            meta = {}
            record.error = record.error or f"malformed stream chunk: {state.final[:80].decode('utf-8', 'replace')!r}"
    if record.error is None and not state.done:
        record.error = "stream ended without [DONE] (connection closed mid-stream)"
    _fill_from_meta(record, meta, t0, state.first, end)
    return record


def _fill_from_meta(record: RequestRecord, meta: dict, t0: float, first: float | None, end: float) -> None:
    record.e2e_s = end - t0
    if first is not None:
        record.ttft_s = first - t0
        record.decode_s = end - first
    if meta:
        record.prompt_tokens = meta.get("prompt_tokens")
        record.completion_tokens = meta.get("completion_tokens")
        reason = meta.get("finish_reason")
        record.finish_reason = reason.get("type") if isinstance(reason, dict) else reason
        verify = meta.get("spec_verify_ct")
        if verify is not None:
            record.spec_verify_ct = int(verify)
            if verify and record.completion_tokens:
                record.acceptance_length = record.completion_tokens / verify


# --------------------------------------------------------------------------- figures
def cell_figures(records: list[RequestRecord]) -> dict:
    """Figures of one cell from its measured (non-warmup) requests, per docs/results-schema.md."""
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    starts = [r.start_ts for r in measured if r.start_ts is not None]
    ends = [r.end_ts for r in measured if r.end_ts is not None]
    wall = (max(ends) - min(starts)) if starts and ends else None
    tokens = sum(r.completion_tokens or 0 for r in done)
    decode = [(r.completion_tokens - 1) / r.decode_s for r in done
              if r.completion_tokens and r.completion_tokens > 1 and r.decode_s]
    tpot = [r.decode_s / (r.completion_tokens - 1) for r in done
            if r.completion_tokens and r.completion_tokens > 1 and r.decode_s is not None]
    verify = [r for r in done if r.spec_verify_ct]
    return {
        "requests": len(measured), "completed": len(done), "failed": len(measured) - len(done),
        "wall_s": wall, "output_tokens": tokens,
        "output_throughput_tok_s": tokens / wall if wall else None,
        "decode_tok_s": {"median": metrics.median(decode) if decode else None,
                         "p10": metrics.percentile(decode, 10) if decode else None,
                         "p90": metrics.percentile(decode, 90) if decode else None},
        "ttft_s": metrics.percentiles([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_s": metrics.percentiles(tpot),
        "itl_s": metrics.percentiles([g for r in done for g in r.itl_s]),
        "e2e_s": metrics.percentiles([r.e2e_s for r in done if r.e2e_s is not None]),
        "acceptance_length": (sum(r.completion_tokens or 0 for r in verify) / sum(r.spec_verify_ct or 0
                                                                                    for r in verify))
        if verify else None,
        "prompt_tokens_mean": (sum(r.prompt_tokens or 0 for r in done) / len(done)) if done else None,
    }


def group_figures(cells: list[dict]) -> list[dict]:
    """Per (context, concurrency): median and 95% CI across repeats of the headline figures."""
    keys: dict[tuple[int, int], list[dict]] = {}
    for cell in cells:
        keys.setdefault((cell["context"], cell["concurrency"]), []).append(cell)
    groups = []
    for (context, conc), members in keys.items():
        groups.append({
            "context": context, "concurrency": conc, "repeats": len(members),
            "output_throughput_tok_s": metrics.summarize_repeats([c["output_throughput_tok_s"] for c in members]),
            "decode_tok_s": metrics.summarize_repeats([c["decode_tok_s"]["median"] for c in members]),
            "acceptance_length": metrics.summarize_repeats([c["acceptance_length"] for c in members]),
            "ttft_p50_s": metrics.summarize_repeats([c["ttft_s"]["p50"] for c in members]),
            "tpot_p50_s": metrics.summarize_repeats([c["tpot_s"]["p50"] for c in members]),
        })
    return groups


# --------------------------------------------------------------------------- the run
class _Counter:
    """Token counter for prompts: the server's own tokenizer through SGLang's `/tokenize` (`prompt` body)."""

    def __init__(self, url: str) -> None:
        """An HTTP client for `url` (CA certificates are loaded for https only: ~25 ms CPU)."""
        self.url = url
        self.client = httpx.Client(timeout=30.0, verify=url.startswith("https:"))

    def __call__(self, text: str) -> int:
        """Tokens in `text`, without special tokens; any other answer than SGLang's is an error naming it."""
        resp = self.client.post(self.url + "/tokenize", json={"prompt": text, "add_special_tokens": False})
        try:
            count = resp.json().get("count") if resp.status_code == 200 else None
        except ValueError:
            count = None
        if not isinstance(count, int):
            raise ValueError(f"POST {self.url}/tokenize answered HTTP {resp.status_code}: {resp.text[:300]!r}")
        return count

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()


@dataclass
class _RunState:
    """Mutable progress of a run, for the progress reporter."""

    in_flight: int = 0
    done: int = 0
    tokens: int = 0
    label: str = ""


async def _run_cell(transport: _Transport, url: str, prompt_list: list[str], records: list[RequestRecord],
                    settings: BenchSettings, concurrency: int, sink: Callable[[RequestRecord], None],
                    state: _RunState) -> None:
    """Run `records` (one per prompt) with at most `concurrency` in flight, closed-loop or Poisson arrivals."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(records)):
        queue.put_nowait(i)
    rng = random.Random(settings.seed * 1_000_003 + concurrency)
    gate = asyncio.Lock()
    next_send = [time.perf_counter()]

    async def one(i: int) -> None:
        state.in_flight += 1
        rec = records[i]
        try:
            await asyncio.wait_for(run_request(transport, url, prompt_list[i], settings.max_new_tokens, rec),
                                   settings.request_timeout_s)
        except asyncio.TimeoutError:
            rec.error = f"timeout after {settings.request_timeout_s:g} s"
            rec.end_ts = time.time()
            rec.e2e_s = rec.end_ts - (rec.start_ts or rec.end_ts)
        state.in_flight -= 1
        state.done += 1
        state.tokens += (rec.completion_tokens or 0) if rec.ok else 0
        sink(rec)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if settings.request_rate:
                async with gate:
                    next_send[0] += rng.expovariate(settings.request_rate)
                    await asyncio.sleep(max(0.0, next_send[0] - time.perf_counter()))
            await one(i)

    workers = min(concurrency, len(records))
    await transport.warm(url + "/generate", workers)
    await asyncio.gather(*(worker() for _ in range(workers)))


async def _run_async(url: str, requests_path: Path, cells_path: Path, settings: BenchSettings, simulated: bool,
                     progress: Callable[[str], None]) -> dict:
    url = url.rstrip("/")
    requests_path.parent.mkdir(parents=True, exist_ok=True)
    config = asdict(settings)
    doc: dict[str, Any] = {"simulated": simulated, "config": config, "cells": [], "groups": []}
    counter = _Counter(url)
    transport = _transport(settings.http_client)
    await transport.open(max(settings.concurrency))
    with open(requests_path, "w", encoding="utf-8") as handle:
        await _run_matrix(url, cells_path, settings, doc, handle, counter, transport, progress)
    storage.write_json_atomic(cells_path, doc)
    return doc


async def _run_matrix(url: str, cells_path: Path, settings: BenchSettings, doc: dict, handle: Any,
                      counter: _Counter, transport: _Transport, progress: Callable[[str], None]) -> None:
    simulated = doc["simulated"]
    state = _RunState()
    sequence = 0

    finished: list[RequestRecord] = []

    def flush() -> None:
        handle.write("".join(json.dumps(vars(rec)) + "\n" for rec in finished))
        handle.flush()
        finished.clear()

    async def reporter() -> None:
        last_tokens, last_t = 0, time.perf_counter()
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            now = time.perf_counter()
            rate = (state.tokens - last_tokens) / (now - last_t)
            last_tokens, last_t = state.tokens, now
            progress(f"  {state.label}: {state.done} done, {state.in_flight} in flight, {rate:.0f} tok/s")

    reporter_task = asyncio.get_running_loop().create_task(reporter())
    n_cells = len(settings.contexts) * len(settings.concurrency) * settings.repeats
    try:
        for context in settings.contexts:
            for conc in settings.concurrency:
                plan = [(True, 0, i) for i in range(settings.warmup_requests)]
                plan += [(False, rep, i) for rep in range(settings.repeats) for i in range(settings.requests_per_cell)]
                texts = []
                for _ in plan:
                    try:
                        texts.append(await asyncio.to_thread(prompts.build_prompt, context, sequence,
                                                             counter, settings.seed))
                    except (httpx.HTTPError, ValueError, KeyError) as exc:
                        raise BenchmarkError(f"could not count prompt tokens with {url}/tokenize for the cells of "
                                             f"context={context} concurrency={conc}: {type(exc).__name__}: {exc}"
                                             ) from exc
                    sequence += 1
                batches = [[k for k, p in enumerate(plan) if p[0]]]
                batches += [[k for k, p in enumerate(plan) if not p[0] and p[1] == rep]
                            for rep in range(settings.repeats)]
                for batch in batches:
                    if not batch:
                        continue
                    recs = [RequestRecord(context, conc, plan[k][1], plan[k][2], plan[k][0], simulated=simulated)
                            for k in batch]
                    warm = recs[0].warmup
                    state.label = (f"ctx={context} C={conc} " + ("warmup" if warm else f"repeat {recs[0].repeat}"))
                    state.done = 0
                    try:
                        await _run_cell(transport, url, [texts[k] for k in batch], recs, settings, conc,
                                        finished.append, state)
                    finally:
                        flush()
                    if warm:
                        continue
                    cell = {"context": context, "concurrency": conc, "repeat": recs[0].repeat,
                            **cell_figures(recs)}
                    doc["cells"].append(cell)
                    doc["groups"] = group_figures(doc["cells"])
                    storage.write_json_atomic(cells_path, doc)
                    tput = cell["output_throughput_tok_s"] or 0.0
                    progress(f"cell {len(doc['cells'])}/{n_cells} ctx={context} C={conc} rep={cell['repeat']}: "
                             f"{cell['completed']}/{cell['requests']} ok, {tput:.1f} tok/s")
                    if cell["requests"] and cell["failed"] > settings.max_failure_fraction * cell["requests"]:
                        errors = sorted({r.error for r in recs if r.error})
                        raise BenchmarkError(
                            f"cell context={context} concurrency={conc} repeat={cell['repeat']}: {cell['failed']} of "
                            f"{cell['requests']} requests failed (allowed fraction {settings.max_failure_fraction:g}); "
                            f"errors: {'; '.join(errors[:3])}")
    finally:
        reporter_task.cancel()
        counter.close()
        await transport.close()


def run_benchmark(url: str, out_dir: Path, settings: BenchSettings, simulated: bool,
                  progress: Callable[[str], None] | None = None) -> dict:
    """Run the whole matrix against `url`, write requests.jsonl and cells.json into `out_dir`, return cells.json."""
    out_dir = Path(out_dir)
    return _arun(_run_async(url, out_dir / "requests.jsonl", out_dir / "cells.json", settings, simulated,
                            progress or (lambda _: None)))


def _arun(coro: Any) -> Any:
    """Run a coroutine on uvloop when it is installed (less client CPU per streamed chunk), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# --------------------------------------------------------------------------- CLI
def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bench` subcommand."""
    parser = subparsers.add_parser(
        "bench", help="benchmark a running SGLang server (native streaming /generate)",
        description="Benchmark a running server. --out is the cells JSON; the per-request records go next to it "
                    "as <stem>.requests.jsonl.")
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--out", required=True, type=Path, help="cells JSON file to write")
    parser.add_argument("--contexts", type=_ints, default=[128, 4096], help="prompt lengths in tokens")
    parser.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 32], help="closed-loop concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=BenchSettings.max_new_tokens)
    parser.add_argument("--requests", type=int, default=BenchSettings.requests_per_cell,
                        help="measured requests per cell")
    parser.add_argument("--repeats", type=int, default=BenchSettings.repeats)
    parser.add_argument("--warmup", type=int, default=BenchSettings.warmup_requests,
                        help="warmup requests per (context, concurrency)")
    parser.add_argument("--seed", type=int, default=BenchSettings.seed)
    parser.add_argument("--request-rate", type=float, default=BenchSettings.request_rate,
                        help="Poisson arrivals (requests/s)")
    parser.add_argument("--timeout", type=float, default=BenchSettings.request_timeout_s,
                        help="per-request timeout in seconds")
    parser.add_argument("--max-failure-fraction", type=float, default=BenchSettings.max_failure_fraction)
    parser.add_argument("--http-client", choices=HTTP_CLIENTS, default=BenchSettings.http_client)
    parser.set_defaults(func=main)


def detect_simulated(url: str) -> bool:
    """Whether the server at `url` is the stand-in (top-level "simulated": true in /get_server_info)."""
    try:
        return bool(httpx.get(url.rstrip("/") + "/get_server_info", timeout=30.0).json().get("simulated", False))
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def format_table(doc: dict) -> str:
    """A short text table of the groups in a cells.json document."""
    lines = [f"{'context':>8} {'conc':>5} {'tok/s':>10} {'decode tok/s':>13} {'ttft p50 s':>11} {'accept':>7}"]
    for g in doc["groups"]:
        def med(key: str, g: dict = g) -> str:
            value = g[key]["median"]
            return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"
        lines.append(f"{g['context']:>8} {g['concurrency']:>5} {med('output_throughput_tok_s'):>10} "
                     f"{med('decode_tok_s'):>13} {med('ttft_p50_s'):>11} {med('acceptance_length'):>7}")
    if doc.get("simulated"):
        lines.append("(simulated: measured against the stand-in server)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Entry point of `ddsweep bench`."""
    settings = BenchSettings(contexts=args.contexts, concurrency=args.concurrency, max_new_tokens=args.max_tokens,
                             requests_per_cell=args.requests, repeats=args.repeats, warmup_requests=args.warmup,
                             max_failure_fraction=args.max_failure_fraction, request_timeout_s=args.timeout,
                             seed=args.seed, request_rate=args.request_rate, http_client=args.http_client)
    out: Path = args.out
    requests_path = out.parent / f"{out.stem}.requests.jsonl"
    simulated = detect_simulated(args.url)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    status = 0
    try:
        doc = _arun(_run_async(args.url, requests_path, out, settings, simulated, progress))
    except BenchmarkError as exc:
        progress(f"error: {exc}")
        doc, status = storage.read_json(out), 1
    print(format_table(doc))
    return status
