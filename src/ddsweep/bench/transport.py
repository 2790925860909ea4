"""HTTP/1.1 streaming clients for the benchmark: SSE parsing, an incremental response parser and transports.

The default transport is a raw asyncio Protocol that timestamps every chunk as its bytes arrive; httpx and aiohttp
transports are kept for comparison. The HTTP/1.1 client is written here rather than taken from a library because
it measures closest to the server's own figures: in benchmarks/bench_client.py it stayed within 1% of the
server's throughput at every concurrency up to 256, where aiohttp and httpx fell several percent short, as it
timestamps each chunk as its bytes are read rather than when a task wakes (benchmarks/README.md).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from ddsweep.coding.errors import stream_error

HTTP_CLIENTS = ("asyncio", "aiohttp", "httpx")


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


class StreamState:
    """Progress of one streamed request, fed with every SSE data payload and the time its bytes arrived."""

    __slots__ = ("t0", "end", "tokens", "chunks", "done", "error", "final")

    def __init__(self, chunks: list[list[float]]) -> None:
        """Start empty; every chunk is appended to `chunks` as [seconds since sent, cumulative tokens], the seconds
        rounded to the microsecond (finer digits are clock noise, and they were most of a launch's records)."""
        self.t0: float | None = None
        self.end: float | None = None
        self.tokens = 0
        self.chunks = chunks
        self.done = False
        self.error: str | None = None
        self.final = b""

    def sent(self, now: float) -> None:
        """Record when the request was handed to the socket (perf_counter seconds)."""
        self.t0 = now

    def feed(self, data: bytes, now: float) -> bool:
        """Account one payload that arrived at `now`; False once the stream is over ([DONE], an error event or a
        malformed payload)."""
        if data == b"[DONE]":
            self.done, self.end = True, now
            return False
        tokens = chunk_tokens(data)
        if tokens is None:
            message = stream_error(data)
            self.error = (f"server error in stream: {message}" if message is not None else
                          f"malformed stream chunk: {data[:80].decode('utf-8', 'replace')!r}")
            self.end = now
            return False
        self.final = data
        self.chunks.append([round(now - (self.t0 if self.t0 is not None else now), 6), tokens])
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
class Transport:
    """Sends one streaming POST and feeds its SSE payloads to a StreamState; one subclass per HTTP client."""

    async def open(self, connections: int) -> None:
        """Create the connection pool, sized for `connections` requests in flight."""

    async def warm(self, url: str, connections: int) -> None:
        """Make sure `connections` connections to `url` are open before a cell starts (where supported)."""

    async def close(self) -> None:
        """Close the connection pool."""

    async def request(self, url: str, payload: dict, state: StreamState) -> None:
        """POST `payload`, call `state.sent`, feed payloads until it returns False; HttpError on a non-200."""
        raise NotImplementedError


class HttpError(Exception):
    """A non-200 response."""


def _http_error(status: int, body: bytes) -> HttpError:
    """The error of a non-200 answer, with the server's message where its body is SGLang's error object."""
    message = stream_error(body) if body.startswith(b"{") else None
    return HttpError(f"HTTP {status}: {message if message is not None else body[:200].decode('utf-8', 'replace')}")


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

    def begin(self, state: StreamState) -> asyncio.Future:
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
        elif len(self._error_body) < 4096:
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


class _RawTransport(Transport):
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

    async def request(self, url: str, payload: dict, state: StreamState) -> None:
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
    async def _exchange(conn: _RawConnection, message: bytes, state: StreamState) -> None:
        waiter = conn.begin(state)
        # the clock starts before the bytes go: write() hands them to the socket at once, and a loop thread that
        # lost the CPU between the write and a later stamp would time the whole answer as microseconds
        state.sent(time.perf_counter())
        conn.transport.write(message)
        await waiter


class _HttpxTransport(Transport):
    """httpx.AsyncClient transport."""

    async def open(self, connections: int) -> None:
        """Create the client with a pool as large as the highest concurrency."""
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None))

    async def close(self) -> None:
        """Close the client."""
        await self.client.aclose()

    async def request(self, url: str, payload: dict, state: StreamState) -> None:
        """Stream SSE data payloads via httpx, timestamped as each line is handed over."""
        clock = time.perf_counter
        state.sent(clock())
        async with self.client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                raise _http_error(resp.status_code, await resp.aread())
            async for line in resp.aiter_lines():
                if line.startswith("data:") and not state.feed(line[5:].strip().encode(), clock()):
                    return


class _AiohttpTransport(Transport):
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

    async def request(self, url: str, payload: dict, state: StreamState) -> None:
        """Stream SSE data payloads via aiohttp, timestamped as each line is handed over."""
        clock = time.perf_counter
        state.sent(clock())
        async with self.session.post(url, json=payload) as resp:
            if resp.status != 200:
                raise _http_error(resp.status, await resp.read())
            async for line in resp.content:
                if line.startswith(b"data:") and not state.feed(line[5:].strip(), clock()):
                    return


def make_transport(name: str) -> Transport:
    if name == "asyncio":
        return _RawTransport()
    if name == "httpx":
        return _HttpxTransport()
    if name == "aiohttp":
        return _AiohttpTransport()
    raise ValueError(f"unknown HTTP client {name!r}; choose from {', '.join(HTTP_CLIENTS)}")
