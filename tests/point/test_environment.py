"""Environment records: interconnect classification from `nvidia-smi topo -m`, and the record's fields."""

from __future__ import annotations

from ddsweep.point.environment import classify_interconnect, collect_environment

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
    assert record["engine"] == {"name": "sglang", "version": "0.5.23"}
    assert record["slurm"]["job_id"] == "4242" and record["slurm"]["node"] == "gpu07"
    assert record["gpus"] == [] and record["gpu_count"] == 0 and record["interconnect"] is None
    assert record["git_commit"] is None and record["simulated"] is False
