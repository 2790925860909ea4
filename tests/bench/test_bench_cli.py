"""`ddsweep bench` answers a failed benchmark with one message naming the server, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddsweep.point.lifecycle import find_free_port


@pytest.mark.slow
def test_a_benchmark_against_a_server_that_is_not_there_fails_with_one_message(tmp_path):
    url = f"http://127.0.0.1:{find_free_port('127.0.0.1')}"
    out = tmp_path / "cells.json"
    result = subprocess.run([sys.executable, "-m", "ddsweep", "bench", "--url", url, "--out", str(out),
                             "--contexts", "64", "--concurrency", "1", "--requests", "1", "--repeats", "1"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ddsweep bench: the benchmark against {url} failed: "), lines
    assert "/tokenize" in lines[0]
