"""Environment records: interconnect classification from `nvidia-smi topo -m`, and the record's fields."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from ddsweep.point import environment
from ddsweep.point.environment import (
    ENGINE_PACKAGES,
    classify_interconnect,
    collect_environment,
    engine_provenance,
    source_checkout,
    strip_escapes,
)

PCIE_TOPOLOGY = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPIX\tNODE\tSYS\t0-47\t0
GPU1\tPIX\t X \tNODE\tSYS\t0-47\t0
GPU2\tNODE\tNODE\t X \tSYS\t0-47\t0
GPU3\tSYS\tSYS\tSYS\t X \t48-95\t1

Legend:
  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""

NVLINK_TOPOLOGY = """\
\tGPU0\tGPU1\tNIC0\tCPU Affinity
GPU0\t X \tNV18\tPXB\t0-55
GPU1\tNV18\t X \tPXB\t0-55
NIC0\tPXB\tPXB\t X

Legend:
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_pcie_only_machine_is_pcie_even_though_the_legend_mentions_nvlink():
    assert classify_interconnect(PCIE_TOPOLOGY) == "PCIe"


def test_nvlink_machine_is_nvlink():
    assert classify_interconnect(NVLINK_TOPOLOGY) == "NVLink"


def test_unknown_without_nvidia_smi_output():
    assert classify_interconnect(None) is None
    assert classify_interconnect("no GPU rows here") is None


def test_environment_record_without_gpus_names_the_engine_and_slurm_job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi, no git
    record = collect_environment({"version": "0.5.23"}, simulated=False)
    assert record["engine"]["name"] == "sglang" and record["engine"]["version"] == "0.5.23"
    assert record["engine"]["launcher"]["probed"] is False
    assert record["slurm"]["job_id"] == "4242" and record["slurm"]["node"] == "gpu07"
    assert record["gpus"] == [] and record["gpu_count"] == 0 and record["interconnect"] is None
    assert record["git_commit"] is None and record["simulated"] is False


def test_engine_provenance_is_what_the_launchers_python_sees(tmp_path):
    fake = tmp_path / "site" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (tmp_path / "site" / "sglang-0.0.1.dist-info").mkdir()
    (tmp_path / "site" / "sglang-0.0.1.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.0.1\n")
    record = engine_provenance([sys.executable, "-m", "sglang.launch_server"], {"PYTHONPATH": str(tmp_path / "site")})
    assert record["probed"] and record["interpreter"] == sys.executable
    assert record["packages"]["sglang"] == "0.0.1" and record["sglang_dir"] == str(fake)
    assert set(record["packages"]) == set(ENGINE_PACKAGES)
    assert record["sglang_source"] is None  # not a git checkout
    wrapper = engine_provenance(["/usr/bin/srun", "python"])
    assert wrapper["probed"] is False and "not a Python interpreter" in wrapper["reason"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_sglang_source_checkout_commit_and_dirty_flag(tmp_path):
    repo = tmp_path / "sglang-src"
    package = repo / "python" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '0.5.23'\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert source_checkout(str(package)) == {"commit": head, "dirty": False, "path": str(repo)}
    (package / "__init__.py").write_text("__version__ = '0.5.23+pr29907'\n")
    assert source_checkout(str(package))["dirty"] is True
    ignored = repo / ".venv" / "sglang"  # an installed copy inside some repository's ignored venv
    ignored.mkdir(parents=True)
    (ignored / "__init__.py").write_text("")
    (repo / ".gitignore").write_text(".venv\n")
    assert source_checkout(str(ignored)) is None


COLOURED_TOPOLOGY = ("\x1b]0;nvidia-smi\x07\t\x1b[4mGPU0\x1b[0m\t\x1b[4mGPU1\x1b[0m\n"
                     "\x1b[1mGPU0\x1b[0m\t X \t\x1b[32mNV18\x1b[0m\x1b[K\n"
                     "\x1b[1mGPU1\x1b[0m\t\x1b[32mNV18\x1b[0m\t X \x1b]8;;https://x\x1b\\link\x1b]8;;\x1b\\\n")


def test_captured_tool_output_is_stored_without_terminal_escape_codes(tmp_path, monkeypatch):
    """A tool that colours its output even into a pipe: the stored topology has no CSI or OSC sequence left, and
    its matrix is still read (NVLink)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '%s' \"$DDSWEEP_FAKE_TOPOLOGY\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("DDSWEEP_FAKE_TOPOLOGY", COLOURED_TOPOLOGY)
    topology = environment._run(["nvidia-smi", "topo", "-m"])
    assert topology is not None and "\x1b" not in topology
    assert topology == "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X link\n"
    assert classify_interconnect(topology) == "NVLink"
    assert strip_escapes("plain\ttext") == "plain\ttext"
