"""Finding a server's processes and its listening socket by the owner token it carries in its environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from standin import free_port

from ddsweep.point.lifecycle import OWNER_ENV, listener_owned, owned_processes

LISTEN = ("import socket, sys, time\n"
          "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('ready', flush=True)\n"
          "time.sleep(60)\n")


def start_listener(port: int, token: str | None) -> subprocess.Popen:
    """A process listening on `port`, carrying `token` as its owner token (none: a foreign process)."""
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    if token:
        env[OWNER_ENV] = token
    proc = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_owner_token_finds_our_processes_and_tells_our_listener_from_a_foreign_one() -> None:
    token, port = uuid.uuid4().hex, free_port()
    assert listener_owned(port, token) is None  # nothing listens
    ours = start_listener(port, token)
    try:
        assert owned_processes(token) == [ours.pid]
        assert listener_owned(port, token) is True
        assert listener_owned(port, uuid.uuid4().hex) is False  # someone else's token: a foreign listener
    finally:
        ours.kill()
        ours.wait()
    deadline = time.monotonic() + 5
    while owned_processes(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert owned_processes(token) == []
    foreign = start_listener(port, None)
    try:
        assert listener_owned(port, token) is False
    finally:
        foreign.kill()
        foreign.wait()
