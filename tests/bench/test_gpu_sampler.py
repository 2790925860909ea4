"""NVML sampling of a cell's window against a fake `pynvml`: the figures as the fake reports them, the energy
counter and its fallback, the disabled sampler, and what a cell records of it."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from ddsweep.bench import gpu_sampler
from ddsweep.bench.cells import gpu_fields
from ddsweep.bench.gpu_sampler import GpuSampler, visible_indices


class FakeClock:
    """Wall time the test sets."""

    def __init__(self) -> None:
        """Start at t = 100 s."""
        self.now = 100.0

    def time(self) -> float:
        """The set time."""
        return self.now


def fake_nvml(clock: FakeClock, gpus: int = 2, watts: float = 300.0, counter: bool = True) -> types.ModuleType:
    """A `pynvml` of `gpus` GPUs drawing `watts` each, GPU i using (i + 1) GiB at 50 + 10·i % and 1500 MHz; the
    energy counter is watts x the clock (or raises when `counter` is false)."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        """NVML's error."""

    def energy(h: int) -> int:
        if not counter:
            raise NVMLError("Not Supported")
        return round(watts * clock.now * 1000)

    nvml.NVMLError = NVMLError
    nvml.NVML_CLOCK_SM = 1
    nvml.calls = []
    nvml.nvmlInit = lambda: nvml.calls.append("init")
    nvml.nvmlShutdown = lambda: nvml.calls.append("shutdown")
    nvml.nvmlDeviceGetCount = lambda: gpus
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetPowerUsage = lambda h: round(watts * 1000)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=50 + 10 * h, memory=5)
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: 1500 if kind == 1 else 0
    nvml.nvmlDeviceGetTotalEnergyConsumption = energy
    return nvml


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The sampler's wall clock, set by the test; all GPUs visible."""
    fake = FakeClock()
    monkeypatch.setattr(gpu_sampler, "time", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def _sampled(clock: FakeClock) -> GpuSampler:
    """A sampler started at t = 100 and read at 101, 102 and 103 (its thread waits an hour between readings)."""
    sampler = GpuSampler(interval_s=3600)
    sampler.start()
    for t in (101.0, 102.0, 103.0):
        clock.now = t
        sampler.sample()
    clock.now = 104.0
    return sampler


def test_figures_are_what_nvml_reports_and_energy_is_the_counter_difference(clock, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(clock))
    sampler = _sampled(clock)
    gpu = sampler.stop(100.5, 103.5)
    assert gpu == {"gpus": 2, "samples": 3, "power_w_mean": 600.0, "power_w_max": 600.0,
                   "memory_used_mib_max": 1536.0, "utilization_pct_mean": 55.0, "sm_clock_mhz_mean": 1500.0,
                   "energy_j": pytest.approx(1800.0), "energy_source": "counter"}  # 2 x 300 W x 3 s
    assert sampler.reason is None
    sampler.close()
    assert sys.modules["pynvml"].calls == ["init", "shutdown"]


def test_without_the_counter_energy_is_power_integrated_over_the_window(clock, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(clock, gpus=1, watts=250.0, counter=False))
    gpu = _sampled(clock).stop(100.5, 102.5)
    assert gpu["energy_source"] == "integrated power" and gpu["energy_j"] == pytest.approx(500.0)
    assert gpu["gpus"] == 1 and gpu["samples"] == 2 and gpu["power_w_mean"] == 250.0


def test_only_the_gpus_of_cuda_visible_devices_are_sampled(clock, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(clock, gpus=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    gpu = _sampled(clock).stop()
    assert gpu["gpus"] == 1 and gpu["memory_used_mib_max"] == 3072.0 and gpu["utilization_pct_mean"] == 70.0
    assert gpu["samples"] == 5 and gpu["energy_j"] == pytest.approx(1200.0)  # 100..104 s at 300 W
    assert visible_indices("0, 3") == [0, 3] and visible_indices("GPU-1a2b") is None and visible_indices(None) is None


def test_without_pynvml_or_nvml_the_sampler_records_nothing_and_says_why(clock, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    sampler = GpuSampler()
    sampler.start()
    assert not sampler.enabled and sampler.stop() is None and "pynvml is not importable" in sampler.reason
    broken = fake_nvml(clock)
    broken.nvmlInit = lambda: (_ for _ in ()).throw(broken.NVMLError("Driver Not Loaded"))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert GpuSampler().reason == "nvmlInit failed: NVMLError: Driver Not Loaded"
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(clock, gpus=0))
    assert GpuSampler().reason == "NVML sees no GPU"


def test_a_cell_records_the_window_figures_and_energy_per_output_token(clock, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(clock))
    steady = {"start_ts": 100.5, "end_ts": 103.5, "output_tokens": 900}
    fields = gpu_fields(_sampled(clock), steady)
    assert fields["gpu"]["energy_j"] == pytest.approx(1800.0) and fields["gpu_reason"] is None
    assert fields["energy_j_per_output_token"] == pytest.approx(2.0)
    assert gpu_fields(_sampled(clock), {**steady, "output_tokens": 0})["energy_j_per_output_token"] is None
    unwindowed = gpu_fields(_sampled(clock), {"start_ts": None, "end_ts": None, "output_tokens": None})
    assert unwindowed == {"gpu": None, "gpu_reason": "the cell has no steady-state window",
                          "energy_j_per_output_token": None}
    simulated = gpu_fields(None, steady)
    assert simulated["gpu"] is None and "simulated" in simulated["gpu_reason"]
    monkeypatch.setitem(sys.modules, "pynvml", None)
    absent = gpu_fields(GpuSampler(), steady)
    assert absent["gpu"] is None and absent["energy_j_per_output_token"] is None and "pynvml" in absent["gpu_reason"]
