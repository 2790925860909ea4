"""Per-repeat cell figures recomputed from the raw per-request records (bench/requests.jsonl).

Every figure the summary uses starts here: one row per (context, concurrency, repeat) cell, computed from the
measured requests with the definitions of docs/results-schema.md, so that changing the statistics reruns
only `ddsweep summarize`. Point directories without request records (made by older versions or by hand) fall
back to the per-repeat cell figures of bench/cells.json; its across-repeat bounds are never read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

REQUEST_LIMIT_FIELDS: dict[str, str] = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between order statistics; NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _num(value: Any) -> float | None:
    """A finite float, or None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def request_row(record: dict[str, Any]) -> dict[str, Any] | None:
    """One measured request as a flat row (None for warmup requests or records without cell coordinates)."""
    if record.get("warmup") or not all(isinstance(record.get(k), int) for k in ("context", "concurrency",
                                                                                  "repeat")):
        return None
    tokens = _num(record.get("completion_tokens"))
    decode = _num(record.get("decode_s"))
    ok = record.get("error") is None
    tpot = decode / (tokens - 1) if ok and tokens and tokens > 1 and decode is not None else None
    return {
        "context": record["context"], "concurrency": record["concurrency"], "repeat": record["repeat"],
        "ok": ok, "completion_tokens": tokens if ok else None, "start_ts": _num(record.get("start_ts")),
        "end_ts": _num(record.get("end_ts")), "ttft_s": _num(record.get("ttft_s")) if ok else None,
        "e2e_s": _num(record.get("e2e_s")) if ok else None, "decode_s": decode if ok else None, "tpot_s": tpot,
        "spec_verify_ct": _num(record.get("spec_verify_ct")) if ok else None,
        "itl_s": record.get("itl_s") if ok and isinstance(record.get("itl_s"), list) else [],
    }


def repeat_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one cell (one repeat) from its measured request rows (docs/results-schema.md)."""
    done = [r for r in rows if r["ok"]]
    starts = [r["start_ts"] for r in rows if r["start_ts"] is not None]
    ends = [r["end_ts"] for r in rows if r["end_ts"] is not None]
    wall = (max(ends) - min(starts)) if starts and ends else None
    tokens = sum(r["completion_tokens"] or 0 for r in done)
    decode = [(r["completion_tokens"] - 1) / r["decode_s"] for r in done
              if r["completion_tokens"] and r["completion_tokens"] > 1 and r["decode_s"]]
    ttft = [r["ttft_s"] for r in done if r["ttft_s"] is not None]
    tpot = [r["tpot_s"] for r in done if r["tpot_s"] is not None]
    e2e = [r["e2e_s"] for r in done if r["e2e_s"] is not None]
    verify = [r for r in done if r["spec_verify_ct"]]
    acceptance = (sum(r["completion_tokens"] or 0 for r in verify) / sum(r["spec_verify_ct"] for r in verify)
                  if verify else math.nan)
    return {
        "completed": len(done), "failed": len(rows) - len(done), "wall_s": wall if wall else math.nan,
        "output_throughput_tok_s": tokens / wall if wall else math.nan,
        "requests_per_s": len(done) / wall if wall else math.nan,
        "decode_tok_s_median": percentile(decode, 50),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90), "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50), "tpot_p90_s": percentile(tpot, 90), "tpot_p99_s": percentile(tpot, 99),
        "itl_p50_s": math.nan, "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
        "acceptance_length": acceptance, "source": "requests.jsonl",
    }


def figures_from_requests(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-repeat cell rows, measured request rows) from the records of one requests.jsonl."""
    by_cell: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    requests = []
    for record in records:
        row = request_row(record)
        if row is None:
            continue
        requests.append(row)
        by_cell.setdefault((row["context"], row["concurrency"], row["repeat"]), []).append(row)
    cells = [{"context": c, "concurrency": k, "repeat": rep, **repeat_figures(rows)}
             for (c, k, rep), rows in sorted(by_cell.items())]
    for cell, rows in zip(cells, (by_cell[key] for key in sorted(by_cell)), strict=True):
        cell["itl_p50_s"] = percentile([float(g) for r in rows for g in r["itl_s"] if _num(g) is not None], 50)
    for row in requests:
        del row["itl_s"]
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
            "context": cell["context"], "concurrency": cell["concurrency"],
            "repeat": cell.get("repeat") if isinstance(cell.get("repeat"), int) else 0,
            "completed": int(completed) if completed is not None else None,
            "failed": int(num(cell.get("failed"))) if _num(cell.get("failed")) is not None else None,
            "wall_s": wall, "output_throughput_tok_s": num(cell.get("output_throughput_tok_s")),
            "requests_per_s": completed / wall if completed is not None and wall and wall > 0 else math.nan,
            "decode_tok_s_median": sub(cell, "decode_tok_s", "median"),
            "ttft_p50_s": sub(cell, "ttft_s", "p50"), "ttft_p90_s": sub(cell, "ttft_s", "p90"),
            "ttft_p99_s": sub(cell, "ttft_s", "p99"), "tpot_p50_s": sub(cell, "tpot_s", "p50"),
            "tpot_p90_s": sub(cell, "tpot_s", "p90"), "tpot_p99_s": sub(cell, "tpot_s", "p99"),
            "itl_p50_s": sub(cell, "itl_s", "p50"), "e2e_p50_s": sub(cell, "e2e_s", "p50"),
            "e2e_p99_s": sub(cell, "e2e_s", "p99"), "acceptance_length": num(cell.get("acceptance_length")),
            "source": "cells.json",
        })
    return rows
