"""In-memory synthetic studies with known truth and random noise, for decision tests over many seeds.

Each point has true figures per regime cell; a repeat's figure is truth × exp(shared prompt effect of that
repeat + the point's own launch noise), so repeats are paired across points the way the real benchmark is
(same prompts per repeat index). No files are written: the ResultSet is built directly, which keeps hundreds
of seeds fast.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ddsweep.analysis.results import CELL_COLUMNS, KNOBS, REQUEST_COLUMNS, PointRecord, ResultSet, group_table

LATENCY_CELL = (128, 1)
THROUGHPUT_CELL = (128, 32)
REGIMES_CONFIG = {
    "analysis": {
        "regimes": [
            {"name": "latency", "metric": "decode_tok_s", "context": 128, "concurrency": 1},
            {"name": "throughput", "metric": "output_throughput_tok_s", "context": 128, "concurrency": 32},
            {"name": "max_acceptance", "metric": "acceptance_length", "context": 128, "concurrency": 1},
        ],
        "priorities": {"latency_first": {"latency": 1.0}},
    },
    "drafter": {"trained_block_size": 8},
}


@dataclass
class TruePoint:
    """A point's knobs and true figures: decode speed (C=1), throughput (C=32), acceptance length."""

    point_id: str
    kind: str = "ddtree"
    budget: int | None = 8
    topk: int | None = 4
    block_size: int | None = 8
    window: int | None = 2048
    decode: float = 100.0
    throughput: float = 600.0
    acceptance: float | None = 4.0
    ttft_p99: float = 0.5
    knobs: dict = field(init=False)

    def __post_init__(self) -> None:
        """Collect the knobs."""
        self.knobs = {k: getattr(self, k) for k in KNOBS}


def build(points: list[TruePoint], seed: int, noise: float = 0.02, shared: float = 0.02, repeats: int = 3,
          acceptance_noise: float | None = None) -> ResultSet:
    """A ResultSet of `repeats` noisy repeats per point at the latency and throughput cells."""
    rng = random.Random(seed)
    prompt_effect = [rng.gauss(0, shared) for _ in range(repeats)]
    acc_noise = noise if acceptance_noise is None else acceptance_noise
    rows, requests = [], []
    for p in points:
        for rep in range(repeats):
            def draw(value: float, sd: float, rep: int = rep) -> float:
                return value * math.exp(prompt_effect[rep] + rng.gauss(0, sd))
            base = {"point_id": p.point_id, "kind": p.kind, **p.knobs, "repeat": rep, "simulated": False,
                    "source": "synthetic", "completed": 8, "failed": 0}
            accept = draw(p.acceptance, acc_noise) if p.acceptance else math.nan
            rows.append({**base, "context": LATENCY_CELL[0], "concurrency": LATENCY_CELL[1],
                         "decode_tok_s_median": draw(p.decode, noise), "acceptance_length": accept})
            ttft = draw(p.ttft_p99, noise)
            wall = 10.0
            rows.append({**base, "context": THROUGHPUT_CELL[0], "concurrency": THROUGHPUT_CELL[1],
                         "output_throughput_tok_s": draw(p.throughput, noise), "ttft_p99_s": ttft,
                         "wall_s": wall, "requests_per_s": 32 / wall, "acceptance_length": accept})
            for i in range(32):
                requests.append({"point_id": p.point_id, "context": THROUGHPUT_CELL[0],
                                 "concurrency": THROUGHPUT_CELL[1], "repeat": rep, "ok": True,
                                 "ttft_s": ttft * (i + 1) / 32})
    cells = pd.DataFrame(rows, columns=list(CELL_COLUMNS))
    for knob in KNOBS:
        cells[knob] = pd.array(cells[knob].tolist(), dtype="Int64")
    records = [PointRecord(p.point_id, kind=p.kind, preset=p.kind, status="ok", **p.knobs) for p in points]
    return ResultSet(results_dir=Path("synthetic"), points=records, cells=cells, groups=group_table(cells),
                     coding=pd.DataFrame(), coding_records={}, coding_summaries={},
                     requests=pd.DataFrame(requests, columns=list(REQUEST_COLUMNS)))
