"""A stand-in SGLang server started as a subprocess, for tests that need a server but not the launcher."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx

FAST = ["--sim-step-ms", "1", "--sim-prefill-ms-per-1k", "1"]


def free_port() -> int:
    """A free TCP port that no other test of this session was given, below the kernel's ephemeral range.

    A port the kernel hands out for port 0 is free only until someone binds it: between this call and the server's
    bind (a second or more on a loaded machine) any socket bound to port 0 (a launcher's, an HTTP client's) may get
    it, and the test would then talk to another server. Below the ephemeral range the kernel never hands a port
    out, and the ports handed out here are counted in a file shared by the session's workers (tests/conftest.py)."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low, high = max(1024, first_ephemeral - 10_000), first_ephemeral
    # tests/conftest.py names the session's file; elsewhere (a script) each process counts its own
    counter = Path(os.environ.get("DDSWEEP_TEST_PORTS") or Path(tempfile.gettempdir()) / f"ports-{os.getpid()}")
    session = str(counter.parent)
    with open(counter, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        # each session starts at its own place in the range, so that two sessions side by side rarely meet
        given = int(handle.read() or zlib.crc32(session.encode()))
        for offset in range(given, given + (high - low)):
            port = low + offset % (high - low)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            handle.seek(0)
            handle.truncate()
            handle.write(str(offset + 1))
            return port
    raise RuntimeError(f"no free TCP port in {low}-{high - 1}")


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
                    if self.proc.poll() is not None:  # another process answers on this port
                        raise AssertionError(f"the stand-in exited (status {self.proc.returncode}) and another "
                                             f"server answers on its port {self.port}: {self.close()[-2000:]}")
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
