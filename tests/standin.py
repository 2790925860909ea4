"""A stand-in SGLang server started as a subprocess, for tests that need a server but not the launcher."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

FAST = ["--sim-step-ms", "1", "--sim-prefill-ms-per-1k", "1"]


def free_port() -> int:
    """An unused TCP port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def marked_processes(marker: str) -> list[int]:
    """Pids whose environment carries `marker` (NAME=value, given to a test's servers through engine.env): the
    servers of that test and their children, and no other test's (ports are reused by the tests beside it)."""
    needle = marker.encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class Sim:
    """A stand-in started as a subprocess, killed on close."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None, wait: bool = True, strict: bool = False) -> None:
        """Start the server and (optionally) wait for /health; lenient unless `strict` (loading SGLang's classes
        costs seconds of CPU per process; the contract tests and the launcher-started points are strict)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "ddsweep", "sim-server", "--model-path", "sim/model", "--port", str(self.port),
               "--sim-strict", "on" if strict else "off", *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = 15.0) -> None:
        """Poll /health until 200."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.03)
        raise AssertionError("stand-in never became healthy")

    def generate(self, text: str, n: int = 16, stream: bool = False, ignore_eos: bool = True) -> httpx.Response:
        """POST /generate."""
        body = {"text": text, "stream": stream,
                "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": ignore_eos}}
        return httpx.post(self.url + "/generate", json=body, timeout=30)

    def close(self) -> str:
        """Kill the server; return its output."""
        if self.proc.poll() is None:
            self.proc.kill()
        out, _ = self.proc.communicate(timeout=10)
        return out


def healthy_together(started: dict[str, Sim]) -> Iterator[dict[str, Sim]]:
    """For a module fixture: wait until every stand-in (started with wait=False, so they boot in parallel) is
    healthy, yield them, and close them all afterwards."""
    try:
        for sim in started.values():
            sim.wait_healthy(timeout=60)
        yield started
    finally:
        for sim in started.values():
            sim.close()
