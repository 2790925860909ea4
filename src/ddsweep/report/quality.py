"""Caveats of the cells a decision rests on: throughput that never settled within a cell's window (its
sub-windows disagree), first-token stalls, and saturated acceptance (every draft accepted, so the acceptance
measures the verify width, not the drafter). The flags are the per-repeat cell rows' (analysis/raw.py)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ddsweep.analysis.decisions import Decisions


def _flag(value: Any) -> bool | None:
    """A cell row's flag or count as a truth value; None where the cell has none (older records)."""
    return None if value is None or pd.isna(value) else bool(value)


def cell_flags(cells: pd.DataFrame, point_id: str, context: int, concurrency: int) -> dict[str, Any]:
    """A point's repeats at one cell: how many, how many unstable (and the widest sub-window spread), how many
    stalls (and the slowest first token), and whether any repeat's acceptance is saturated."""
    rows = cells[(cells["point_id"] == point_id) & (cells["context"] == context)
                 & (cells["concurrency"] == concurrency)]
    unstable = rows[rows["stable"] == False]  # noqa: E712 (None: no window recorded, not unstable)
    return {"repeats": len(rows), "unstable": len(unstable),
            "unsettled_warmups": int((rows["warmup_settled"] == False).sum()),  # noqa: E712
            "spread": float(unstable["subwindow_spread"].max()) if len(unstable) else None,
            "stalls": int(pd.to_numeric(rows["stalls"], errors="coerce").fillna(0).sum()),
            "worst_stall_s": float(rows["worst_stall_s"].max()) if rows["stalls"].fillna(0).gt(0).any() else None,
            "saturated": bool((rows["saturated"] == True).any())}  # noqa: E712


def quality_caveats(d: Decisions, picks: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One caveat per kind for the recommended points' cells in the regimes their priorities weigh: unstable
    cells with their spread, saturated acceptance (a decision resting on it says so), stalls with the delay."""
    unstable, saturated, stalled = [], [], []
    for pick in picks:
        pid = pick.get("recommended")
        for gain in pick.get("gains") or []:
            outcome = d.regime(gain["regime"])
            r = outcome.resolved if outcome else None
            if pid is None or r is None or r.context is None or r.concurrency is None:
                continue
            flags = cell_flags(d.results.cells, pid, r.context, r.concurrency)
            where = f"`{pid}` at {r.cell()} ({pick['priority']})"
            if flags["unstable"]:
                unstable.append(f"{where}: {flags['unstable']} of {flags['repeats']} repeats, sub-windows up to "
                                f"{flags['spread']:.1%} apart")
            if flags["unsettled_warmups"]:
                unstable.append(f"{where}: {flags['unsettled_warmups']} of {flags['repeats']} repeats measured after "
                                "a warm-up that had not settled")
            if flags["saturated"]:
                saturated.append(where)
            if flags["stalls"]:
                stalled.append(f"{where}: {flags['stalls']}, slowest first token {flags['worst_stall_s']:.2f} s")
    out = []
    if unstable:
        out.append({"kind": "unstable_cells", "text": "Throughput did not settle within the window (sub-windows "
                    "disagree beyond 10%): " + "; ".join(sorted(set(unstable))) + ". Measure these cells again "
                    "(longer benchmark.max_window_s, more launches) before relying on them."})
    if saturated:
        out.append({"kind": "saturated_acceptance", "text": "Saturated acceptance (every draft accepted in every "
                    "verify step, e.g. NGRAM on prompts it has seen or a drafter identical to the target): "
                    + "; ".join(sorted(set(saturated))) + ". This decision rests on an acceptance that measures the "
                    "verify width, not the drafter."})
    if stalled:
        out.append({"kind": "stalls", "text": "First-token stalls (over 10× the cell's median TTFT; kept in the "
                    "figures): " + "; ".join(sorted(set(stalled))) + "."})
    return out


def measurement_caveat(cells: pd.DataFrame) -> dict[str, Any] | None:
    """The caveat block listing every cell (point, context, concurrency, repeat) that is unstable, saturated or
    has first-token stalls, or None when there is none."""
    items = []
    for _, row in cells.sort_values(["point_id", "context", "concurrency", "repeat"]).iterrows():
        where = f"`{row['point_id']}` context {row['context']}, C={row['concurrency']}, repeat {row['repeat']}"
        if _flag(row["stable"]) is False:
            items.append(f"{where}: unstable, sub-window throughput {row['subwindow_spread']:.1%} apart")
        if _flag(row["warmup_settled"]) is False:
            items.append(f"{where}: measured after a warm-up whose throughput had not settled at the cap")
        if _flag(row["saturated"]):
            items.append(f"{where}: saturated acceptance {row['acceptance_length']:.2f} (all drafts accepted)")
        if _flag(row["stalls"]):
            items.append(f"{where}: {int(row['stalls'])} first-token stall(s), slowest {row['worst_stall_s']:.2f} s")
    if not items:
        return None
    return {"kind": "measurement_quality", "title": "Cells to measure again or read with care", "text": (
        "Unstable: the cell's window ended at benchmark.max_window_s with its sub-windows more than "
        "benchmark.stability_tolerance apart. Saturated: every verify step accepted every draft, so the acceptance "
        "measures the verify width, not the drafter. Stalls: a first token more than 10× the cell's median and "
        "0.25 s late; stalled requests stay in every figure (docs/statistics.md)."), "items": items}
