"""The environment of a sweep point: host, GPUs, interconnect, engine version, code version, Slurm job."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddsweep import __version__

# Terminal escape sequences some tools print even into a pipe (colour, cursor moves, window titles, links):
# CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ESC \), and the other two-byte ESC sequences.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")


def strip_escapes(text: str) -> str:
    """`text` without terminal escape sequences (ANSI CSI and OSC, and 8-bit CSI)."""
    return _ESCAPES.sub("", text)


def _run(command: list[str], cwd: Path | None = None, timeout: float = 20.0) -> str | None:
    """Run a command and return its stdout without terminal escape codes, or None if it is missing or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return strip_escapes(result.stdout) if result.returncode == 0 else None


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


# Distributions whose versions identify the engine build (sgl-kernel was renamed sglang-kernel by 0.5.23).
ENGINE_PACKAGES = ("sglang", "sgl-kernel", "sglang-kernel", "torch", "flashinfer-python", "flashinfer",
                   "transformers")
# Run by the launcher's interpreter: versions by importlib.metadata, and where the sglang package lives.
PROBE = """import importlib.metadata as md, importlib.util, json, os, sys
out = {"executable": sys.executable, "python": sys.version.split()[0], "packages": {}}
for name in sys.argv[1:]:
    try:
        out["packages"][name] = md.version(name)
    except md.PackageNotFoundError:
        out["packages"][name] = None
spec = importlib.util.find_spec("sglang")
out["sglang_dir"] = os.path.dirname(spec.origin) if spec and spec.origin else None
print(json.dumps(out))
"""


def source_checkout(package_dir: str | None) -> dict[str, Any] | None:
    """Commit and dirty flag of the git work tree that tracks `package_dir` (a source checkout of SGLang), else
    None; a site-packages directory inside some other repository's ignored .venv is not a checkout."""
    if not package_dir or not Path(package_dir).is_dir():
        return None
    tracked = _run(["git", "ls-files", "--error-unmatch", "__init__.py"], cwd=Path(package_dir))
    if tracked is None:
        return None
    commit, dirty = git_state(Path(package_dir))
    top = _run(["git", "rev-parse", "--show-toplevel"], cwd=Path(package_dir))
    return {"commit": commit, "dirty": dirty, "path": top.strip() if top else None}


def engine_provenance(launcher: list[str] | None, env: Mapping[str, str] | None = None,
                      timeout: float = 120.0) -> dict[str, Any]:
    """Versions of the engine's packages as the launcher's own Python sees them, and SGLang's git state.

    The launcher's first word is run as a Python interpreter; a launcher that is not one (a wrapper script)
    is recorded as such, never replaced by ddsweep's own interpreter."""
    if not launcher:
        return {"probed": False, "reason": "no launcher command"}
    program = launcher[0]
    if "python" not in Path(program).name:
        return {"probed": False, "interpreter": program,
                "reason": f"the launcher {program!r} is not a Python interpreter; versions not probed"}
    try:
        done = subprocess.run([program, "-c", PROBE, *ENGINE_PACKAGES], capture_output=True, text=True,
                              timeout=timeout, check=False, env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"probed": False, "interpreter": program, "reason": f"{type(exc).__name__}: {exc}"}
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"probed": False, "interpreter": program,
                "reason": f"exit {done.returncode}: {(done.stderr or done.stdout)[-300:]!r}"}
    return {"probed": True, "interpreter": found["executable"], "python": found["python"],
            "packages": found["packages"], "sglang_dir": found["sglang_dir"],
            "sglang_source": source_checkout(found["sglang_dir"])}


def collect_environment(server_info: dict | None, simulated: bool, workdir: Path | None = None,
                        launcher: list[str] | None = None, launcher_env: Mapping[str, str] | None = None
                        ) -> dict[str, Any]:
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
        "engine": {"name": "sglang (simulated stand-in)" if simulated else "sglang", "version": version,
                   "launcher": engine_provenance(launcher, launcher_env)},
        "ddsweep_version": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "slurm": slurm,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "simulated": simulated,
    }
