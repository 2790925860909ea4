"""NVML sampling of the GPUs while a benchmark cell runs: power, memory, utilisation, SM clock and energy.

`pynvml` (the `nvidia-ml-py` package, the `gpu` extra) is imported lazily. Without it, when nvmlInit fails or when
there is no GPU to sample, the sampler is disabled: it records nothing and says why (`reason`); no value is ever
made up. The GPUs sampled are those of CUDA_VISIBLE_DEVICES when it is a list of indices, else all of them. A
background thread reads every GPU each `interval_s` (ctypes releases the GIL during NVML calls, so the event loop
timing the requests is barely touched); `stop` summarises the samples over a window of wall time (time.time(),
the clock of the request records). Energy is the difference of NVML's total-energy counter at the window's ends
(interpolated between the samples around them), or, where a GPU has no counter, power integrated over the window.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

INTERVAL_S = 0.2
MIB = 2**20


@dataclass(frozen=True)
class _Sample:
    """One reading of every sampled GPU at wall time `t` (None where NVML could not read the value)."""

    t: float
    power_w: tuple[float | None, ...]
    memory_mib: tuple[float | None, ...]
    utilization_pct: tuple[float | None, ...]
    sm_clock_mhz: tuple[float | None, ...]
    energy_j: tuple[float | None, ...]


def visible_indices(env: str | None) -> list[int] | None:
    """The GPU indices CUDA_VISIBLE_DEVICES names, or None (all GPUs) when it is unset or not a list of indices."""
    parts = [p.strip() for p in (env or "").split(",")]
    return [int(p) for p in parts] if env and all(p.isdigit() for p in parts) else None


def _interpolate(points: list[tuple[float, float]], t: float) -> float:
    """The piecewise-linear value of time-sorted `points` at `t` (the nearest end outside them)."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return points[-1][1]


def _integrate(points: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The integral of the piecewise-linear `points` over [lo, hi] (trapezoids)."""
    clipped = [(lo, _interpolate(points, lo)), *((t, v) for t, v in points if lo < t < hi),
               (hi, _interpolate(points, hi))]
    return sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(clipped, clipped[1:], strict=False))


def _mean(values: list[float]) -> float | None:
    """The mean, None of nothing."""
    return sum(values) / len(values) if values else None


class GpuSampler:
    """Samples the GPUs through NVML in a thread between `start` and `stop`; disabled (with `reason`) without NVML."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        """Initialise NVML and find the GPUs to sample; any failure leaves the sampler disabled."""
        self.interval_s = interval_s
        self.reason: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._counter = True  # every GPU answers the total-energy counter so far
        self._samples: list[_Sample] = []
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            self.reason = f"pynvml is not importable (install the gpu extra, nvidia-ml-py): {exc}"
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError, or a library that is missing (OSError) or too old
            self.reason = f"nvmlInit failed: {type(exc).__name__}: {exc}"
            return
        try:
            indices = visible_indices(os.environ.get("CUDA_VISIBLE_DEVICES"))
            if indices is None:
                indices = list(range(nvml.nvmlDeviceGetCount()))
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        except nvml.NVMLError as exc:
            self.reason = f"NVML could not list the GPUs: {exc}"
            self._handles = []
        if not self._handles and self.reason is None:
            self.reason = "NVML sees no GPU"
        if self._handles:
            self._nvml = nvml
        else:
            nvml.nvmlShutdown()

    @property
    def enabled(self) -> bool:
        """Whether there are GPUs to sample."""
        return self._nvml is not None

    def _read(self, call: str, *args: Any) -> Any:
        """An NVML call's answer, or None when NVML cannot give it (not supported, GPU lost)."""
        try:
            return getattr(self._nvml, call)(*args)
        except self._nvml.NVMLError:
            return None

    def _energy_j(self, handle: Any) -> float | None:
        """The GPU's total-energy counter in J; a GPU without it turns the counter off for the rest of the run."""
        if not self._counter:
            return None
        value = self._read("nvmlDeviceGetTotalEnergyConsumption", handle)
        self._counter = value is not None
        return value / 1000 if value is not None else None

    def sample(self) -> None:
        """Read every GPU once and keep the reading."""
        t = time.time()
        power, memory, util, clock, energy = [], [], [], [], []
        for h in self._handles:
            mw = self._read("nvmlDeviceGetPowerUsage", h)
            mem = self._read("nvmlDeviceGetMemoryInfo", h)
            rates = self._read("nvmlDeviceGetUtilizationRates", h)
            power.append(mw / 1000 if mw is not None else None)
            memory.append(mem.used / MIB if mem is not None else None)
            util.append(float(rates.gpu) if rates is not None else None)
            clock.append(self._read("nvmlDeviceGetClockInfo", h, self._nvml.NVML_CLOCK_SM))
            energy.append(self._energy_j(h))
        self._samples.append(_Sample(t, tuple(power), tuple(memory), tuple(util), tuple(clock), tuple(energy)))

    def _loop(self) -> None:
        """The thread: a reading every `interval_s` until halted."""
        while not self._halt.wait(self.interval_s):
            self.sample()

    def start(self) -> None:
        """Forget earlier samples, read the GPUs now and then every `interval_s` in a thread (no-op when disabled)."""
        if not self.enabled:
            return
        self._halt_thread()
        self._samples.clear()
        self.sample()
        self._halt.clear()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()

    def _halt_thread(self) -> None:
        """Stop the sampling thread, if one runs."""
        if self._thread is not None:
            self._halt.set()
            self._thread.join()
            self._thread = None

    def stop(self, start_ts: float | None = None, end_ts: float | None = None) -> dict[str, Any] | None:
        """Stop sampling (with a last reading) and summarise [start_ts, end_ts] (default: all that was sampled);
        None, with `reason`, when disabled or when no sample falls in the window."""
        if not self.enabled:
            return None
        if self._thread is None:
            self.reason = "the sampler was not started"
            return None
        self._halt_thread()
        self.sample()
        lo = self._samples[0].t if start_ts is None else start_ts
        hi = self._samples[-1].t if end_ts is None else end_ts
        inside = [s for s in self._samples if lo <= s.t <= hi]
        if not inside or hi <= lo:
            self.reason = "no GPU sample inside the window"
            return None
        self.reason = None
        power = [(s.t, sum(s.power_w)) for s in self._samples if None not in s.power_w]
        counter = [(s.t, sum(s.energy_j)) for s in self._samples if None not in s.energy_j]
        if len(counter) == len(self._samples):
            energy, source = _interpolate(counter, hi) - _interpolate(counter, lo), "counter"
        else:
            energy = _integrate(power, lo, hi) if power else None
            source = "integrated power" if energy is not None else None
        in_window = [p for t, p in power if lo <= t <= hi]
        memory_max = [max(known) for m in zip(*(s.memory_mib for s in inside), strict=True)
                      if (known := [v for v in m if v is not None])]
        return {"gpus": len(self._handles), "samples": len(inside),
                "power_w_mean": _mean(in_window), "power_w_max": max(in_window, default=None),
                "memory_used_mib_max": _mean(memory_max),
                "utilization_pct_mean": _mean([u for s in inside for u in s.utilization_pct if u is not None]),
                "sm_clock_mhz_mean": _mean([c for s in inside for c in s.sm_clock_mhz if c is not None]),
                "energy_j": energy, "energy_source": source}

    def close(self) -> None:
        """Stop the thread and shut NVML down."""
        self._halt_thread()
        if self.enabled:
            self._nvml.nvmlShutdown()
            self._nvml = None
