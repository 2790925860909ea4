"""A minimal HTTP/1.1 server protocol on asyncio, so the scheduler can write stream chunks synchronously."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           413: "Payload Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024


@dataclass
class HttpRequest:
    """One parsed HTTP request."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON (ValueError when it is not JSON)."""
        return json.loads(self.body or b"{}")


class Connection(asyncio.Protocol):
    """An asyncio protocol for one client connection: parses requests one at a time and writes responses."""

    def __init__(self, handler: Callable[[Connection, HttpRequest], None], registry: set[Connection]) -> None:
        """Remember the request handler and the set of live connections (for shutdown)."""
        self._handler = handler
        self._registry = registry
        self._buf = bytearray()
        self._busy = False
        self._keep_alive = True
        self.transport: Any = None
        self.closed = False
        self.on_close: Callable[[], None] | None = None

    def connection_made(self, transport: Any) -> None:
        """Register the new connection."""
        self.transport = transport
        self._registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        """Mark the connection closed and notify whoever is generating for it."""
        self.closed = True
        self._registry.discard(self)
        if self.on_close is not None:
            callback, self.on_close = self.on_close, None
            callback()

    def eof_received(self) -> bool:
        """Close our side when the client half-closes."""
        return False

    def pause_writing(self) -> None:
        """Ignore flow control: the stand-in buffers what a slow client has not read yet."""

    def resume_writing(self) -> None:
        """Ignore flow control (see pause_writing)."""

    def data_received(self, data: bytes) -> None:
        """Buffer incoming bytes and dispatch complete requests."""
        self._buf += data
        self._process()

    def _process(self) -> None:
        while not self._busy and not self.closed:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    self.abort()
                return
            lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self.abort()
                return
            headers = {}
            for line in lines[1:]:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if length > MAX_BODY:
                self.abort()
                return
            if len(self._buf) < end + 4 + length:
                return
            body = bytes(self._buf[end + 4:end + 4 + length])
            del self._buf[:end + 4 + length]
            connection = headers.get("connection", "").lower()
            self._keep_alive = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
            path, _, query = target.partition("?")
            self._busy = True
            self._handler(self, HttpRequest(method.upper(), path, query, headers, body))

    def _head(self, status: int, content_type: str, extra: str) -> bytes:
        conn = "keep-alive" if self._keep_alive else "close"
        return (f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\nContent-Type: {content_type}\r\n"
                f"X-Simulated: true\r\nConnection: {conn}\r\n{extra}\r\n").encode("latin-1")

    def respond(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        """Send a complete response with a Content-Length."""
        if self.closed:
            return
        self.transport.write(self._head(status, content_type, f"Content-Length: {len(body)}\r\n") + body)
        self._finish()

    def respond_json(self, status: int, data: Any) -> None:
        """Send `data` as a JSON response."""
        self.respond(status, json.dumps(data).encode("utf-8"))

    def start_stream(self, content_type: str = "text/event-stream") -> None:
        """Send the head of a chunked (streaming) response."""
        if not self.closed:
            extra = "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n"
            self.transport.write(self._head(200, content_type, extra))

    def send_chunk(self, data: bytes) -> None:
        """Send one chunk of a streaming response."""
        if not self.closed and data:
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end_stream(self, last: bytes = b"") -> None:
        """Terminate a streaming response, sending `last` as its final chunk in the same write."""
        if not self.closed:
            self.transport.write((b"%x\r\n%b\r\n" % (len(last), last) if last else b"") + b"0\r\n\r\n")
            self._finish()

    def abort(self) -> None:
        """Drop the connection without completing the response."""
        if not self.closed and self.transport is not None:
            self.transport.abort()

    def _finish(self) -> None:
        self._busy = False
        self.on_close = None
        if not self._keep_alive:
            self.transport.close()
        elif self._buf:
            self._process()
