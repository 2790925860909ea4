"""Per-repeat cell figures recomputed from the raw per-request records (bench/requests.jsonl).

Every figure the summary uses starts here: one row per (context, concurrency, repeat) cell, computed from the
measured requests with the definitions of docs/results-schema.md, so that changing the statistics reruns
only `ddsweep summarize`. Point directories without request records (made by older versions or by hand) fall
back to the per-repeat cell figures of bench/cells.json; its across-repeat bounds are never read.
"""

from __future__ import annotations

import math
from typing import Any

from ddsweep import figures

REQUEST_LIMIT_FIELDS: dict[str, str] = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def _num(value: Any) -> float | None:
    """A finite float, or None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _pct(values: list[float], q: float) -> float:
    return figures.percentile(values, q) if values else math.nan


def request_row(record: dict[str, Any]) -> dict[str, Any] | None:
    """One measured request as a flat row (None for warmup requests or records without cell coordinates)."""
    if record.get("warmup") or not all(isinstance(record.get(k), int) for k in ("context", "concurrency",
                                                                                  "repeat")):
        return None
    ok = not figures.failed(record)
    times = figures.request_times(record)
    return {
        "workload": str(record.get("workload") or ""), "ignore_eos": record.get("ignore_eos"),
        "context": record["context"], "concurrency": record["concurrency"], "repeat": record["repeat"],
        "ok": ok, "completion_tokens": _num(record.get("completion_tokens")) if ok else None,
        "spec_verify_ct": _num(record.get("spec_verify_ct")) if ok else None,
        "cached_tokens": _num(record.get("cached_tokens")), "prompt_tokens": _num(record.get("prompt_tokens")),
        "start_ts": _num(record.get("start_ts")), "end_ts": _num(record.get("end_ts")),
        "ttft_s": times.ttft_s if ok else None, "tpot_s": times.tpot_s if ok else None,
        "e2e_s": times.e2e_s if ok else None,
    }


def repeat_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one cell (one repeat) from its measured request records (ddsweep.figures)."""
    with figures.one_cell():
        return _repeat_figures(records)


def _repeat_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """repeat_figures, inside figures.one_cell()."""
    done = [r for r in records if not figures.failed(r)]
    wall = figures.wall_s(records)
    samples = figures.cell_samples(records)
    throughput, window = figures.output_throughput(records)
    fingerprints = {r["prompt_fingerprint"] for r in records if r.get("prompt_fingerprint")}
    return {
        "completed": len(done), "failed": len(records) - len(done), "wall_s": _nan(wall),
        # the decision figure: over the steady-state window where the cell has one, else over the whole cell
        "output_throughput_tok_s": _nan(throughput), "throughput_window": window,
        "whole_output_throughput_tok_s": _nan(figures.whole_output_throughput(records)),
        "requests_per_s": len(done) / wall if wall else math.nan,
        "decode_tok_s_median": _pct(samples.decode_tok_s, 50),
        "ttft_p50_s": _pct(samples.ttft_s, 50), "ttft_p90_s": _pct(samples.ttft_s, 90),
        "ttft_p99_s": _pct(samples.ttft_s, 99), "tpot_p50_s": _pct(samples.tpot_s, 50),
        "tpot_p90_s": _pct(samples.tpot_s, 90), "tpot_p99_s": _pct(samples.tpot_s, 99),
        "chunk_gap_p50_s": _pct(samples.chunk_gaps_s, 50), "token_gap_p50_s": _pct(samples.token_gaps_s, 50),
        "e2e_p50_s": _pct(samples.e2e_s, 50), "e2e_p99_s": _pct(samples.e2e_s, 99),
        "acceptance_length": _nan(figures.acceptance_length(records)),
        "cached_share": _nan(figures.cached_share(records)),
        "distinct_prompts": len(fingerprints) if fingerprints else None, "source": "requests.jsonl",
        **quality(figures.stability(records), figures.stalls(records), figures.saturation(records)),
    }


def quality(stability: dict[str, Any], stalls: dict[str, Any], saturation: dict[str, Any]) -> dict[str, Any]:
    """How far a cell can be trusted (ddsweep.figures at its default settings): whether its sub-windows agree,
    its first-token stalls and the slowest one, whether its acceptance is saturated."""
    worst = max((s["ttft_s"] for s in stalls.get("requests") or []), default=None)
    return {"subwindow_spread": _nan(_num(stability.get("spread"))), "stable": stability.get("stable"),
            "stalls": stalls.get("count"), "worst_stall_s": _nan(worst), "saturated": saturation.get("saturated")}


def figures_from_requests(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-repeat cell rows, measured request rows) from the records of one requests.jsonl."""
    by_cell: dict[tuple[str, int, int, int], list[dict[str, Any]]] = {}
    requests = []
    for record in records:
        row = request_row(record)
        if row is None:
            continue
        requests.append(row)
        by_cell.setdefault((row["workload"], row["context"], row["concurrency"], row["repeat"]), []).append(record)
    cells = [{"workload": w, "context": c, "concurrency": k, "repeat": rep, **repeat_figures(members)}
             for (w, c, k, rep), members in sorted(by_cell.items())]
    return cells, requests


def figures_from_cells_document(cells: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-repeat cell rows from bench/cells.json's `cells` list (its `groups` bounds are ignored)."""
    def sub(cell: dict[str, Any], key: str, name: str) -> float:
        inner = cell.get(key)
        value = _num(inner.get(name)) if isinstance(inner, dict) else None
        return math.nan if value is None else value

    def num(value: Any) -> float:
        x = _num(value)
        return math.nan if x is None else x

    rows = []
    for cell in cells.get("cells") or []:
        if not isinstance(cell, dict) or not all(isinstance(cell.get(k), int) and not isinstance(cell.get(k), bool)
                                                 for k in ("context", "concurrency")):
            continue
        wall = num(cell.get("wall_s"))
        completed = _num(cell.get("completed"))
        rows.append({
            "workload": str(cell.get("workload") or ""), "context": cell["context"], "concurrency": cell["concurrency"],
            "repeat": cell.get("repeat") if isinstance(cell.get("repeat"), int) else 0,
            "completed": int(completed) if completed is not None else None,
            "failed": int(num(cell.get("failed"))) if _num(cell.get("failed")) is not None else None,
            "wall_s": wall, "output_throughput_tok_s": num(cell.get("output_throughput_tok_s")),
            "throughput_window": "whole", "whole_output_throughput_tok_s": num(cell.get("output_throughput_tok_s")),
            "requests_per_s": completed / wall if completed is not None and wall and wall > 0 else math.nan,
            "decode_tok_s_median": sub(cell, "decode_tok_s", "median"),
            "ttft_p50_s": sub(cell, "ttft_s", "p50"), "ttft_p90_s": sub(cell, "ttft_s", "p90"),
            "ttft_p99_s": sub(cell, "ttft_s", "p99"), "tpot_p50_s": sub(cell, "tpot_s", "p50"),
            "tpot_p90_s": sub(cell, "tpot_s", "p90"), "tpot_p99_s": sub(cell, "tpot_s", "p99"),
            "chunk_gap_p50_s": sub(cell, "chunk_gap_s", "p50"), "token_gap_p50_s": sub(cell, "token_gap_s", "p50"),
            "e2e_p50_s": sub(cell, "e2e_s", "p50"),
            "e2e_p99_s": sub(cell, "e2e_s", "p99"), "acceptance_length": num(cell.get("acceptance_length")),
            "cached_share": num(cell.get("cached_share")), "distinct_prompts": cell.get("distinct_prompts"),
            "source": "cells.json",
            **quality(cell.get("window") or {}, cell.get("stalls") or {}, cell.get("saturation") or {}),
        })
    return rows


def gpu_figures(cell: dict[str, Any] | None) -> dict[str, float]:
    """What the GPUs did during a cell, from its cells.json record (NVML; no request record holds it): energy per
    output token, mean power and utilisation; NaN where the cell has no GPU record (simulated, or no NVML)."""
    cell = cell or {}
    gpu = cell.get("gpu") if isinstance(cell.get("gpu"), dict) else {}
    return {"energy_j_per_output_token": _nan(_num(cell.get("energy_j_per_output_token"))),
            "gpu_power_w_mean": _nan(_num(gpu.get("power_w_mean"))),
            "gpu_utilization_pct_mean": _nan(_num(gpu.get("utilization_pct_mean")))}


def warmups_settled(cells: dict[str, Any] | None) -> dict[tuple, bool | None]:
    """(workload, context, concurrency, launch) -> whether the warm-up before those cells settled (cells.json
    `warmups`; launch None for a point whose cells ran in one launch); absent for a counted warm-up or older
    records."""
    warmups = [w for w in (cells or {}).get("warmups") or [] if isinstance(w, dict)]
    one_launch = len({w.get("launch") for w in warmups}) == 1
    out: dict[tuple, bool | None] = {}
    for warm in warmups:
        window = warm.get("window")
        if isinstance(window, dict) and window.get("stopped_by") != "count":
            key = (warm.get("workload", ""), warm.get("context"), warm.get("concurrency"))
            out[(*key, None if one_launch else warm.get("launch"))] = window.get("stable")
    return out
