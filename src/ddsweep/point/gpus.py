"""Before a launch: do the GPUs this job was given run another process's compute work?

A process left on a GPU (a crashed job's server, another user's job on a shared node) makes the next server run
out of memory at load or measure a shared GPU. NVIDIA GPUs are asked with `nvidia-smi`, AMD GPUs with `amd-smi`
(ROCm 6) or `rocm-smi`; with none of them on PATH the check is skipped and says so."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

TOOL_TIMEOUT_S = 60


@dataclass
class GpuCheck:
    """The outcome of one check: the tool asked, the GPUs it covered, the foreign processes found on them."""

    tool: str | None
    gpus: list[str] = field(default_factory=list)
    processes: list[dict] = field(default_factory=list)
    note: str = ""

    @property
    def busy(self) -> bool:
        """Whether another process computes on one of the job's GPUs."""
        return bool(self.processes)

    def as_dict(self) -> dict:
        """The record stored in the point directory (gpu_check.json)."""
        return {**asdict(self), "busy": self.busy}

    def describe(self) -> str:
        """One line naming the processes found."""
        listed = ", ".join(f"pid {p.get('pid')} ({p.get('name') or '?'}) on GPU {p.get('gpu')}"
                           for p in self.processes)
        return f"{self.tool} reports other compute processes on this job's GPUs: {listed}"


def _visible(env: Mapping[str, str], names: tuple[str, ...]) -> list[str] | None:
    """The devices named by the first of `names` set in `env` (None: unset, every GPU of the node)."""
    for name in names:
        value = env.get(name)
        if value is not None and value.strip() != "":
            return [part.strip() for part in value.split(",") if part.strip()]
    return None


def _run(command: list[str]) -> str:
    """A tool's standard output; OSError or CalledProcessError when it fails."""
    return subprocess.run(command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=True).stdout


def _csv_rows(text: str) -> list[list[str]]:
    """nvidia-smi's `--format=csv,noheader` lines as lists of stripped fields."""
    return [[part.strip() for part in line.split(",")] for line in text.splitlines() if line.strip()]


def check_nvidia(env: Mapping[str, str]) -> GpuCheck:
    """Compute processes on the job's NVIDIA GPUs (CUDA_VISIBLE_DEVICES as indices or UUIDs; unset: all)."""
    gpus = _csv_rows(_run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"]))
    visible = _visible(env, ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"))
    mine = {uuid: index for index, uuid in (row[:2] for row in gpus if len(row) >= 2)
            if visible is None or "all" in visible or index in visible or uuid in visible}
    apps = _csv_rows(_run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                           "--format=csv,noheader"]))
    processes = [{"gpu": mine[row[0]], "pid": row[1], "name": row[2], "used_memory": row[3] if len(row) > 3 else None}
                 for row in apps if len(row) >= 3 and row[0] in mine]
    return GpuCheck("nvidia-smi", sorted(mine.values()), processes)


def _amd_processes(document: object) -> list[tuple[str, dict]]:
    """(GPU, process) pairs from `amd-smi process --json`: a list of `{gpu, process_list: [{process_info}]}`."""
    found = []
    for entry in document if isinstance(document, list) else []:
        for item in entry.get("process_list") or [] if isinstance(entry, dict) else []:
            info = item.get("process_info") if isinstance(item, dict) else None
            if isinstance(info, dict) and info.get("pid") is not None:
                found.append((str(entry.get("gpu")), {"pid": str(info["pid"]), "name": info.get("name")}))
    return found


def check_amd(env: Mapping[str, str]) -> GpuCheck:
    """Compute processes on the job's AMD GPUs (ROCR/HIP/CUDA_VISIBLE_DEVICES as indices; unset: all)."""
    visible = _visible(env, ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"))
    if shutil.which("amd-smi"):
        pairs = _amd_processes(json.loads(_run(["amd-smi", "process", "--json"]) or "[]"))
        tool = "amd-smi"
    else:
        # rocm-smi --showpidgpus --json: {"system": {"PID123": "0 1", ...}} (the GPUs each process uses)
        document = json.loads(_run(["rocm-smi", "--showpidgpus", "--json"]) or "{}")
        pairs = [(gpu, {"pid": key.removeprefix("PID"), "name": None})
                 for key, value in (document.get("system") or {}).items() if key.startswith("PID")
                 for gpu in str(value).replace(",", " ").split()]
        tool = "rocm-smi"
    processes = [{"gpu": gpu, **process} for gpu, process in pairs if visible is None or gpu in visible]
    return GpuCheck(tool, visible or [], processes)


def check_gpus(env: Mapping[str, str]) -> GpuCheck:
    """Ask the first GPU tool found on PATH; a tool that fails or answers garbage leaves a note, not an error,
    because a failed check must not fail a point that would run."""
    if shutil.which("nvidia-smi"):
        checker = check_nvidia
    elif shutil.which("amd-smi") or shutil.which("rocm-smi"):
        checker = check_amd
    else:
        return GpuCheck(None, note="skipped: neither nvidia-smi nor amd-smi/rocm-smi is on PATH")
    try:
        return checker(env)
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError, KeyError) as exc:
        return GpuCheck(None, note=f"skipped: the GPU tool failed: {exc}")
