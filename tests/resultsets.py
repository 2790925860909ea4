"""Builders of synthetic results directories (per docs/results-schema.md) whose right answers are known.

Each builder returns a :class:`ResultSetSpec`: the points with their true figures, the study config, and the
answers the analysis must reach, stated by construction. :func:`write_results` writes the spec to disk.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONTEXTS = (128, 4096)
CONCURRENCY = (1, 8, 32)
REPEATS = 3
Cell = tuple[int, int]


@dataclass
class SynthPoint:
    """One synthetic sweep point: knobs, headline figures, spread, outcome and coding records."""

    point_id: str
    kind: str
    budget: int | None = None
    topk: int | None = None
    block_size: int | None = None
    window: int | None = None
    decode_c1: float = 100.0
    throughput_c32: float = 600.0
    acceptance: float | None = None
    long_context_factor: float = 0.8
    spread: float = 0.02
    simulated: bool = False
    failure: dict[str, Any] | None = None
    coding: list[dict[str, Any]] = field(default_factory=list)
    interconnect: str | None = "PCIe"
    corrupt: dict[str, str | None] = field(default_factory=dict)
    contexts: tuple[int, ...] = CONTEXTS
    concurrency: tuple[int, ...] = CONCURRENCY

    def knobs(self) -> dict[str, int | None]:
        """The knob dict as written in point.json."""
        return {"budget": self.budget, "topk": self.topk, "block_size": self.block_size, "window": self.window}

    def figure(self, metric: str, context: int, concurrency: int) -> float | None:
        """The true median of `metric` at a cell, following a simple, monotone performance model."""
        scale = 1.0 if context <= min(self.contexts) else self.long_context_factor
        c_max = max(self.concurrency)
        thr_1 = self.decode_c1 * 0.97
        frac = math.log(concurrency) / math.log(c_max) if c_max > 1 else 1.0
        throughput = thr_1 * (self.throughput_c32 / thr_1) ** frac * scale
        if metric == "output_throughput_tok_s":
            return throughput
        if metric == "decode_tok_s":
            return self.decode_c1 * scale if concurrency == 1 else throughput / concurrency
        if metric == "acceptance_length":
            return self.acceptance
        if metric == "ttft_p50_s":
            return 0.02 * context / 128 * (1 + concurrency / 8)
        if metric == "tpot_p50_s":
            return 1.0 / (self.decode_c1 * scale) if concurrency == 1 else concurrency / throughput
        raise KeyError(metric)


@dataclass
class ResultSetSpec:
    """A synthetic study: its points, its config and the answers the analysis must reach."""

    name: str
    points: list[SynthPoint]
    config: dict[str, Any]
    expected: dict[str, Any] = field(default_factory=dict)
    drafter_config: dict[str, Any] | None = None

    def point(self, point_id: str) -> SynthPoint:
        """Return the spec of one point."""
        return next(p for p in self.points if p.point_id == point_id)

    def true_figures(self, metric: str, context: int, concurrency: int) -> dict[str, tuple[float, float, float]]:
        """(median, ci_low, ci_high) of every completed, uncorrupted point at a cell, from the spec alone."""
        out = {}
        for p in self.points:
            if p.failure is not None or p.corrupt or context not in p.contexts or concurrency not in p.concurrency:
                continue
            value = p.figure(metric, context, concurrency)
            if value is not None:
                _, low, high = _values(value, p.spread)
                out[p.point_id] = (value, low, high)
        return out


def _values(median: float, spread: float) -> tuple[list[float], float, float]:
    """Three repeat values around `median` and the CI implied by a relative half-width `spread`."""
    half = abs(median) * spread
    return [median - half, median, median + half], median - half, median + half


def _cells_document(p: SynthPoint) -> dict[str, Any]:
    """The bench/cells.json document of a point."""
    cells, groups = [], []
    metrics = ("output_throughput_tok_s", "decode_tok_s", "acceptance_length", "ttft_p50_s", "tpot_p50_s")
    for context in p.contexts:
        for concurrency in p.concurrency:
            group: dict[str, Any] = {"context": context, "concurrency": concurrency, "repeats": REPEATS}
            for metric in metrics:
                value = p.figure(metric, context, concurrency)
                if value is None:
                    group[metric] = None
                    continue
                values, low, high = _values(value, p.spread)
                group[metric] = {"median": value, "ci_low": low, "ci_high": high, "values": values}
            groups.append(group)
            for repeat in range(REPEATS):
                thr = group["output_throughput_tok_s"]["values"][repeat]
                dec = group["decode_tok_s"]["values"][repeat]
                ttft = group["ttft_p50_s"]["values"][repeat]
                cells.append({
                    "context": context, "concurrency": concurrency, "repeat": repeat, "requests": 8,
                    "completed": 8, "failed": 0, "wall_s": 2048 / thr, "output_tokens": 2048,
                    "output_throughput_tok_s": thr, "decode_tok_s": {"median": dec, "p10": dec, "p90": dec},
                    "ttft_s": {"p50": ttft, "p90": ttft, "p99": ttft},
                    "tpot_s": {"p50": 1 / dec, "p90": 1 / dec, "p99": 1 / dec},
                    "itl_s": {"p50": 1 / dec, "p90": 1 / dec, "p99": 1 / dec},
                    "e2e_s": {"p50": ttft + 256 / dec, "p90": ttft + 256 / dec, "p99": ttft + 256 / dec},
                    "acceptance_length": p.acceptance, "prompt_tokens_mean": float(context),
                })
    return {"simulated": p.simulated,
            "config": {"contexts": list(p.contexts), "concurrency": list(p.concurrency), "max_new_tokens": 256,
                       "requests_per_cell": 8, "repeats": REPEATS, "warmup_requests": 2},
            "cells": cells, "groups": groups}


def _environment(p: SynthPoint) -> dict[str, Any]:
    """The environment.json document of a point."""
    return {"hostname": "gpu01", "platform": "Linux-6.1", "python": "3.11.7",
            "gpus": [{"name": "NVIDIA B200", "memory_mib": 183359, "driver": "580.65"}] * 8, "gpu_count": 8,
            "interconnect": p.interconnect, "topology": "GPU0 GPU1\nGPU0 X PIX", "engine":
            {"name": "sglang", "version": "0.5.23"}, "ddsweep_version": "0.1.0", "git_commit": "abc1234",
            "git_dirty": False, "slurm": None, "cuda_visible_devices": "0,1,2,3,4,5,6,7",
            "simulated": p.simulated}


def _coding_summary(p: SynthPoint) -> dict[str, Any]:
    """The coding/summary.json document of a point."""
    n = len(p.coding)
    passed = sum(1 for r in p.coding if r["passed"])
    truncated = sum(1 for r in p.coding if r["truncated"])
    kinds: dict[str, int] = {}
    for r in p.coding:
        if r["error_kind"]:
            kinds[r["error_kind"]] = kinds.get(r["error_kind"], 0) + 1
    return {"simulated": p.simulated, "problems": n, "passed": passed, "pass_at_1": passed / n,
            "pass_at_1_excluding_truncated": passed / max(1, n - truncated), "truncated": truncated,
            "by_error_kind": kinds, "max_tokens": 4096, "retry_max_tokens": None,
            "pass_at_1_after_retry": None, "sandbox": {"isolation": "rlimits-only", "guarantees": []}}


def write_point(points_dir: Path, p: SynthPoint) -> Path:
    """Write one point directory; returns it."""
    d = points_dir / p.point_id
    (d / "bench").mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {
        "point.json": {"point_id": p.point_id, "preset": p.kind, "kind": p.kind, "knobs": p.knobs(),
                       "command": ["python", "-m", "sglang.launch_server"], "env": {}, "host": "127.0.0.1",
                       "port": 31000, "study": "synthetic", "simulated": p.simulated},
        "environment.json": _environment(p),
        "verification.json": {"ok": p.failure is None, "checks": []},
    }
    if p.failure is None:
        files["status.json"] = {"point_id": p.point_id, "status": "ok", "simulated": p.simulated,
                                "steps": {"server": "ok", "verify": "ok", "bench": "ok", "coding": "ok"}}
        files["bench/cells.json"] = _cells_document(p)
    else:
        files["failure.json"] = {"point_id": p.point_id, "status": "failed", "simulated": p.simulated,
                                 **p.failure}
    if p.coding:
        (d / "coding").mkdir(exist_ok=True)
        files["coding/summary.json"] = _coding_summary(p)
    for name, doc in files.items():
        (d / name).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    if p.coding:
        (d / "coding/problems.jsonl").write_text(
            "".join(json.dumps({**r, "simulated": p.simulated}) + "\n" for r in p.coding), encoding="utf-8")
    (d / "server.log").write_text(f"server log of {p.point_id}\n", encoding="utf-8")
    (d / "bench/requests.jsonl").write_text(json.dumps({"context": 128, "warmup": True}) + "\n",
                                            encoding="utf-8")
    for name, text in p.corrupt.items():
        if text is None:
            (d / name).unlink(missing_ok=True)
        else:
            (d / name).write_text(text, encoding="utf-8")
    return d


def write_results(spec: ResultSetSpec, root: Path) -> Path:
    """Write the spec as ROOT/results (returned); a drafter config.json goes to ROOT/drafter, named in the
    spec's study config."""
    results = root / "results"
    if spec.drafter_config is not None:
        (root / "drafter").mkdir(parents=True, exist_ok=True)
        (root / "drafter" / "config.json").write_text(json.dumps(spec.drafter_config), encoding="utf-8")
        spec.config["drafter"]["model_path"] = str(root / "drafter")
    for p in spec.points:
        write_point(results / "points", p)
    return results


def problem(task: int, passed: bool = True, error_kind: str | None = None, truncated: bool = False,
            response: str | None = None) -> dict[str, Any]:
    """One coding problem record in the problems.jsonl format."""
    return {"task_id": f"HumanEval/{task}", "passed": passed, "error_kind": error_kind,
            "error": None if passed else f"{error_kind} in HumanEval/{task}",
            "finish_reason": "length" if truncated else "stop", "truncated": truncated,
            "completion_tokens": 4096 if truncated else 300, "max_tokens": 4096,
            "response": response if response is not None else f"def f{task}():\n    return {task}\n",
            "reasoning": None, "code": None if truncated else f"def f{task}():\n    return {task}\n",
            "retry": None}


def _config(study: str, trained_block_size: int | None = 8, **extra: Any) -> dict[str, Any]:
    """A minimal study config with the drafter's trained block size."""
    drafter: dict[str, Any] = {"model_path": "/models/drafter"}
    if trained_block_size is not None:
        drafter["trained_block_size"] = trained_block_size
    return {"study": study, "drafter": drafter, **extra}


def _ddtree(budget: int, topk: int, block_size: int = 8, window: int | None = 2048, **kw: Any) -> SynthPoint:
    """A DDTree point with the conventional id."""
    pid = f"bs{block_size}-b{budget}-t{topk}-w{window if window is not None else 'off'}"
    return SynthPoint(pid, "ddtree", budget=budget, topk=topk, block_size=block_size, window=window, **kw)


def drafter_bound_set() -> ResultSetSpec:
    """The seed study's shape: bs16 buys ~6% acceptance over the trained bs8; b8t4 fastest at C=1 (with a
    statistical tie at b12t4), b4t4 best at C=32; one point with wide run-to-run spread."""
    acc = {4: 4.2, 8: 4.9, 12: 5.0, 16: 5.05}
    decode = {(4, 4): 140.0, (8, 4): 160.0, (12, 4): 157.0, (16, 4): 145.0,
              (4, 2): 130.0, (8, 2): 142.0, (12, 2): 138.0, (16, 2): 128.0}
    thr = {(4, 4): 897.0, (8, 4): 791.0, (12, 4): 720.0, (16, 4): 650.0,
           (4, 2): 850.0, (8, 2): 760.0, (12, 2): 700.0, (16, 2): 640.0}
    points = [
        SynthPoint("ar", "ar", decode_c1=65.0, throughput_c32=700.0, coding=[problem(i) for i in range(5)]),
        SynthPoint("dflash-bs8", "dflash", block_size=8, window=2048, decode_c1=120.0, throughput_c32=720.0,
                   acceptance=4.0),
    ]
    for (budget, topk), d in decode.items():
        spread = 0.15 if (budget, topk) == (16, 2) else 0.02
        points.append(_ddtree(budget, topk, decode_c1=d, throughput_c32=thr[(budget, topk)],
                              acceptance=acc[budget] - (0.4 if topk == 2 else 0.0), spread=spread))
    points.append(_ddtree(8, 4, block_size=16, decode_c1=150.0, throughput_c32=700.0, acceptance=5.2))
    points.append(_ddtree(8, 4, window=None, decode_c1=148.0, throughput_c32=770.0, acceptance=4.8))
    return ResultSetSpec("drafter_bound", points, _config("drafter-bound"), expected={
        "drafter_bound": True, "wide_spread_point": "bs8-b16-t2-w2048",
        "block_pair": ("bs8-b8-t4-w2048", "bs16-b8-t4-w2048")})


def budget_bound_set() -> ResultSetSpec:
    """Acceptance grows strongly with budget and a block size above the trained one buys +30% acceptance."""
    points = [SynthPoint("ar", "ar", decode_c1=60.0, throughput_c32=650.0)]
    for budget, acc in ((4, 2.0), (8, 3.0), (16, 4.0)):
        points.append(_ddtree(budget, 4, decode_c1=60.0 + 20 * acc, throughput_c32=600 + 50 * acc,
                              acceptance=acc))
    points.append(_ddtree(16, 4, block_size=16, decode_c1=170.0, throughput_c32=850.0, acceptance=5.2))
    return ResultSetSpec("budget_bound", points, _config("budget-bound"), expected={
        "drafter_bound": False, "block_pair": ("bs8-b16-t4-w2048", "bs16-b16-t4-w2048")})


def confounded_set() -> ResultSetSpec:
    """The only bs16 point also changed topk (8 vs 4): no matched block-size pair exists; the trained block
    size comes from the drafter's config.json rather than the study config."""
    points = [
        SynthPoint("ar", "ar", decode_c1=65.0, throughput_c32=700.0),
        _ddtree(4, 4, decode_c1=140.0, throughput_c32=880.0, acceptance=4.2),
        _ddtree(8, 4, decode_c1=160.0, throughput_c32=790.0, acceptance=4.9),
        _ddtree(8, 8, block_size=16, decode_c1=150.0, throughput_c32=700.0, acceptance=5.2),
    ]
    config = _config("confounded", trained_block_size=None)
    return ResultSetSpec("confounded", points, config, expected={
        "confounded_point": "bs16-b8-t8-w2048", "closest": "bs8-b8-t4-w2048", "trained_block_size": 8},
        drafter_config={"architectures": ["DFlashDraftModel"], "block_size": 8})


def broken_set() -> ResultSetSpec:
    """A failed point, a malformed point.json, a completed point whose cells.json is corrupt, a point that
    never finished, and a coding file with a garbage line, next to two healthy points."""
    points = [
        SynthPoint("ar", "ar", decode_c1=65.0, throughput_c32=700.0, coding=[problem(i) for i in range(3)]),
        _ddtree(8, 4, decode_c1=160.0, throughput_c32=790.0, acceptance=4.9,
                coding=[problem(i) for i in range(3)]),
        _ddtree(4, 4, failure={"error_kind": "startup_timeout",
                               "error": "server did not become healthy within 1200 s"}),
        _ddtree(12, 4, corrupt={"point.json": "{not json"}),
        _ddtree(16, 4, corrupt={"bench/cells.json": "[1, 2"}),
        _ddtree(4, 2, corrupt={"status.json": None, "bench/cells.json": None}),
    ]
    good = points[1]
    good.corrupt = {"coding/problems.jsonl": "".join(json.dumps(problem(i)) + "\n" for i in range(3))
                    + "garbage line\n"}
    return ResultSetSpec("broken", points, _config("broken"), expected={
        "ok": {"ar", "bs8-b8-t4-w2048"}, "failed": {"bs8-b4-t4-w2048": "startup_timeout"},
        "malformed": {"bs8-b12-t4-w2048", "bs8-b16-t4-w2048"}, "incomplete": {"bs8-b4-t2-w2048"}})


def simulated_set() -> ResultSetSpec:
    """A small sweep produced entirely by the simulated server."""
    points = [
        SynthPoint("ar", "ar", decode_c1=65.0, throughput_c32=700.0, simulated=True,
                   coding=[problem(i) for i in range(2)]),
        _ddtree(4, 4, decode_c1=140.0, throughput_c32=880.0, acceptance=4.2, simulated=True,
                coding=[problem(i) for i in range(2)]),
        _ddtree(8, 4, decode_c1=160.0, throughput_c32=790.0, acceptance=4.9, simulated=True),
        _ddtree(8, 4, block_size=16, decode_c1=150.0, throughput_c32=700.0, acceptance=5.2, simulated=True),
    ]
    return ResultSetSpec("simulated", points, _config("simulated"))


def coding_set() -> ResultSetSpec:
    """Coding outcomes: truncation failures separate from real failures, and an output mismatch vs ar."""
    ar = [problem(i) for i in range(5)]
    truncating = [problem(0), problem(1, passed=False, error_kind="truncated", truncated=True),
                  problem(2, passed=False, error_kind="assertion"),
                  problem(3, passed=False, error_kind="truncated", truncated=True), problem(4)]
    diverging = [problem(i) for i in range(5)]
    diverging[2]["response"] = "def f2():\n    return 99\n"
    points = [
        SynthPoint("ar", "ar", decode_c1=65.0, throughput_c32=700.0, coding=ar),
        _ddtree(8, 4, decode_c1=160.0, throughput_c32=790.0, acceptance=4.9, coding=truncating),
        _ddtree(4, 4, decode_c1=140.0, throughput_c32=880.0, acceptance=4.2, coding=diverging),
    ]
    return ResultSetSpec("coding", points, _config("coding"), expected={
        "truncating": "bs8-b8-t4-w2048", "truncated": 2, "real_failures": 1,
        "diverging": "bs8-b4-t4-w2048", "diverging_task": "HumanEval/2"})


def nearest_cell_set() -> ResultSetSpec:
    """The benchmark ran other contexts and concurrencies than the default regimes name."""
    grid = {"contexts": (256, 8192), "concurrency": (1, 16)}
    points = [
        SynthPoint("ar", "ar", decode_c1=65.0, throughput_c32=500.0, **grid),
        _ddtree(4, 4, decode_c1=140.0, throughput_c32=700.0, acceptance=4.2, **grid),
        _ddtree(8, 4, decode_c1=160.0, throughput_c32=650.0, acceptance=4.9, interconnect="NVLink", **grid),
    ]
    return ResultSetSpec("nearest", points, _config("nearest"), expected={
        "latency_cell": (256, 1), "throughput_cell": (256, 16), "long_context_cell": (8192, 1)})
