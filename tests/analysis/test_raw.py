"""Per-repeat figures recomputed from raw request records agree with the load generator's own definitions."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict
from pathlib import Path

import pytest
from resultsets import drafter_bound_set, write_results

from ddsweep.analysis.raw import figures_from_requests
from ddsweep.analysis.results import load_results
from ddsweep.bench.records import RequestRecord, cell_figures
from ddsweep.figures import steady_state


def steady_state_figures(recs: list[RequestRecord]) -> dict:
    return steady_state([vars(r) for r in recs])


def stream(rng: random.Random, ttft: float, decode: float, tokens: int) -> list[list[float]]:
    """Chunks of 1-4 tokens spread over the decode time, the first at `ttft`."""
    chunks, done = [[ttft, 1]], 1
    while done < tokens:
        done = min(tokens, done + rng.randint(1, 4))
        chunks.append([ttft + decode * (done - 1) / (tokens - 1) * 0.99, done])
    return chunks


def records(seed: int, repeat: int) -> list[RequestRecord]:
    """One cell's requests with random timings, a warmup request and a failed request."""
    rng = random.Random(seed)
    out = [RequestRecord(128, 4, repeat, -1, True, prompt_tokens=128, completion_tokens=64, finish_reason="length",
                         start_ts=0.0, end_ts=1.0, e2e_s=1.0, chunks=stream(rng, 0.1, 0.9, 64),
                         spec_verify_ct=20, acceptance_length=3.2)]
    t = 100.0 * repeat
    for i in range(8):
        tokens = rng.randint(40, 256)
        ttft, decode = rng.uniform(0.02, 0.3), rng.uniform(0.5, 3.0)
        verify = max(1, tokens // rng.randint(2, 6))
        start = t + rng.uniform(0, 0.5)
        out.append(RequestRecord(128, 4, repeat, i, False, prompt_tokens=128, completion_tokens=tokens,
                                 finish_reason="stop", start_ts=start, end_ts=start + ttft + decode,
                                 e2e_s=ttft + decode, chunks=stream(rng, ttft, decode, tokens),
                                 spec_verify_ct=verify, acceptance_length=tokens / verify))
    out.append(RequestRecord(128, 4, repeat, 8, False, start_ts=t, end_ts=t + 0.2, e2e_s=0.2, error="HTTP 500"))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_repeat_figures_match_the_load_generator(seed: int) -> None:
    recs = [r for rep in range(3) for r in records(seed, rep)]
    cells, requests = figures_from_requests([json.loads(json.dumps(asdict(r))) for r in recs])
    assert len(cells) == 3 and len(requests) == 3 * 9
    for cell in cells:
        members = [r for r in recs if r.repeat == cell["repeat"]]
        expected = cell_figures(members)
        steady = steady_state_figures([r for r in members if not r.warmup])["output_throughput_tok_s"]
        assert steady is not None and cell["throughput_window"] == "steady"
        pairs = {"whole_output_throughput_tok_s": expected["output_throughput_tok_s"],
                 "output_throughput_tok_s": steady,
                 "decode_tok_s_median": expected["decode_tok_s"]["median"],
                 "ttft_p50_s": expected["ttft_s"]["p50"], "ttft_p99_s": expected["ttft_s"]["p99"],
                 "tpot_p50_s": expected["tpot_s"]["p50"], "token_gap_p50_s": expected["token_gap_s"]["p50"],
                 "chunk_gap_p50_s": expected["chunk_gap_s"]["p50"],
                 "e2e_p50_s": expected["e2e_s"]["p50"], "acceptance_length": expected["acceptance_length"]}
        for name, value in pairs.items():
            assert math.isclose(cell[name], value, rel_tol=1e-12), name
        assert (cell["completed"], cell["failed"]) == (expected["completed"], expected["failed"])


def test_request_records_win_over_cells_json_and_stored_bounds_are_never_read(tmp_path: Path) -> None:
    spec = drafter_bound_set()
    results_dir = write_results(spec, tmp_path)
    point = results_dir / "points" / "bs8-b8-t4-w2048" / "bench"
    recs = [r for rep in range(3) for r in records(7, rep)]
    (point / "requests.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in recs))
    cells = json.loads((point / "cells.json").read_text())
    for group in cells["groups"]:  # stored bounds that would be absurd if anything read them
        for metric in ("output_throughput_tok_s", "decode_tok_s", "acceptance_length"):
            group[metric].update(ci_low=-1e9, ci_high=1e9)
    (point / "cells.json").write_text(json.dumps(cells))
    results = load_results(results_dir)
    mine = results.cells[results.cells["point_id"] == "bs8-b8-t4-w2048"]
    assert set(mine["source"]) == {"requests.jsonl"} and len(mine) == 3
    others = results.cells[results.cells["point_id"] != "bs8-b8-t4-w2048"]
    assert set(others["source"]) == {"cells.json"}
    groups = results.groups
    assert groups["ci_low"].min() > -1e9 and groups["ci_high"].max() < 1e9
    expected = sum(steady_state_figures([r for r in recs if r.repeat == rep and not r.warmup])
                   ["output_throughput_tok_s"] for rep in range(3)) / 3
    row = groups[(groups["point_id"] == "bs8-b8-t4-w2048") & (groups["metric"] == "output_throughput_tok_s")]
    assert math.isclose(float(row["mean"].iloc[0]), expected)


def test_the_gpus_energy_per_token_reaches_the_cell_rows_from_cells_json(tmp_path: Path) -> None:
    results_dir = write_results(drafter_bound_set(), tmp_path)
    point = results_dir / "points" / "bs8-b8-t4-w2048" / "bench"
    recs = [r for rep in range(3) for r in records(7, rep)]
    (point / "requests.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in recs))
    cells = json.loads((point / "cells.json").read_text())
    cells["cells"] = [{"workload": "", "context": 128, "concurrency": 4, "repeat": rep,
                       "energy_j_per_output_token": 0.5 + rep,
                       "gpu": {"power_w_mean": 600.0 + rep, "utilization_pct_mean": 90.0}} for rep in (0, 2)]
    (point / "cells.json").write_text(json.dumps(cells))
    mine = load_results(results_dir).cells.query("point_id == 'bs8-b8-t4-w2048'").set_index("repeat")
    assert list(mine["energy_j_per_output_token"].loc[[0, 2]]) == [0.5, 2.5]
    assert list(mine["gpu_power_w_mean"].loc[[0, 2]]) == [600.0, 602.0]
    assert math.isnan(mine["energy_j_per_output_token"].loc[1])  # no GPU record for that repeat: empty, not guessed
