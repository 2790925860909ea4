"""The environment of a sweep point: host, GPUs, interconnect, engine version, code version, Slurm job."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from ddsweep import __version__


def _run(command: list[str], cwd: Path | None = None, timeout: float = 20.0) -> str | None:
    """Run a command and return its stdout, or None if it is missing or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def query_gpus() -> list[dict[str, Any]]:
    """GPU model, memory and driver per device from nvidia-smi; empty where there is none."""
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"])
    gpus = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            memory = int(parts[1]) if parts[1].isdigit() else None
            gpus.append({"name": parts[0], "memory_mib": memory, "driver": parts[2]})
    return gpus


def classify_interconnect(topology: str | None) -> str | None:
    """'NVLink' if the `nvidia-smi topo -m` matrix links GPUs with NV#, 'PCIe' if it has only PCIe paths."""
    if not topology:
        return None
    gpu_rows = [line for line in topology.splitlines() if re.match(r"\s*GPU\d+\s", line)]
    if any(re.search(r"\bNV\d+\b", row) for row in gpu_rows):
        return "NVLink"
    if any(re.search(r"\b(PIX|PXB|PHB|NODE|SYS)\b", row) for row in gpu_rows):
        return "PCIe"
    return None


def git_state(path: Path) -> tuple[str | None, bool | None]:
    """The commit of the repository at `path` and whether its work tree has changes."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=path)
    if commit is None:
        return None, None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path)
    return commit.strip(), bool(status and status.strip())


def collect_environment(server_info: dict | None, simulated: bool, workdir: Path | None = None) -> dict[str, Any]:
    """Everything needed to know which platform a point's figures belong to."""
    gpus = query_gpus()
    topology = _run(["nvidia-smi", "topo", "-m"])
    commit, dirty = git_state(workdir or Path.cwd())
    info = server_info or {}
    version = info.get("version")
    slurm = None
    if os.environ.get("SLURM_JOB_ID"):
        slurm = {"job_id": os.environ.get("SLURM_JOB_ID"), "node": os.environ.get("SLURMD_NODENAME"),
                 "partition": os.environ.get("SLURM_JOB_PARTITION"),
                 "gpus_on_node": os.environ.get("SLURM_GPUS_ON_NODE"),
                 "nodelist": os.environ.get("SLURM_JOB_NODELIST"), "nnodes": os.environ.get("SLURM_JOB_NUM_NODES"),
                 "cluster": os.environ.get("SLURM_CLUSTER_NAME")}
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
        "gpu_count": len(gpus),
        "interconnect": classify_interconnect(topology),
        "topology": topology,
        "engine": {"name": "sglang (simulated stand-in)" if simulated else "sglang", "version": version},
        "ddsweep_version": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "slurm": slurm,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "simulated": simulated,
    }
