"""A real SGLang 0.5.23 server on CPU with the tiny model of `.ci/sglang-real.sh`, started through ddsweep's own
launcher code (ddsweep.point.lifecycle.ManagedServer), for the contract tests against the real engine.

Outside CI the tests skip with the reason when the environment is absent; with DDSWEEP_REAL_SGLANG=require
(exported by .ci/run) they fail instead."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from standin import free_port

from ddsweep.point.lifecycle import ManagedServer, ServerSpec

MANIFEST = Path(sys.prefix) / "ddsweep-real-sglang.json"
REQUIRE_ENV = "DDSWEEP_REAL_SGLANG"
STARTUP_TIMEOUT_S = 420  # 32-53 s on an idle 2-core machine; several times that under a loaded one


def manifest() -> dict:
    """The real-engine manifest; skips (or fails under DDSWEEP_REAL_SGLANG=require) when it is absent."""
    if not MANIFEST.is_file():
        reason = f"no real SGLang environment: {MANIFEST} is missing (install it with .ci/sglang-real.sh {sys.prefix})"
        if os.environ.get(REQUIRE_ENV) == "require":
            pytest.fail(f"{REQUIRE_ENV}=require, but {reason}")
        pytest.skip(reason)
    return json.loads(MANIFEST.read_text())


@dataclass
class RealServer:
    """A started real server: its managed process, base URL, log and what /health answered while it started."""

    server: ManagedServer
    manifest: dict
    startup_s: float = 0.0
    health_seen: list[int | str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Base URL of the server's HTTP API."""
        return self.server.spec.url

    def log(self) -> str:
        """The server's log so far."""
        return self.server.log_path.read_text(errors="replace")


def start(log_path: Path, extra_args: list[str] | None = None) -> RealServer:
    """Start a real server on a free port through ManagedServer and wait until /health answers 200, recording
    every /health answer seen during start-up (a status code, or `refused` before the port listens)."""
    doc = manifest()
    port = free_port()
    command = [doc["python"], "-m", "sglang.launch_server", "--model-path", doc["model_dir"],
               "--host", "127.0.0.1", "--port", str(port), *doc["server_args"], *(extra_args or [])]
    spec = ServerSpec(command=command, env=dict(doc["env"]), host="127.0.0.1", port=port)
    real = RealServer(ManagedServer(spec, log_path, shutdown_timeout_s=30), doc)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                real.health_seen.append(httpx.get(f"{spec.url}/health", timeout=2).status_code)
            except httpx.HTTPError:
                real.health_seen.append("refused")
            time.sleep(0.25)

    real.server.start()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        real.startup_s = real.server.wait_until_healthy(STARTUP_TIMEOUT_S)
    except BaseException:
        real.server.stop()
        raise
    finally:
        stop.set()
        watcher.join()
    return real
