"""Caveats of the cells a decision rests on: throughput that never settled within a cell's window (its
sub-windows disagree), server launches of one point that disagree on a cell, first-token stalls, and saturated
acceptance (every draft accepted, so the acceptance measures the verify width, not the drafter). The flags are the
per-repeat cell rows' (analysis/raw.py)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ddsweep.analysis.decisions import Decisions


def _flag(value: Any) -> bool | None:
    """A cell row's flag or count as a truth value; None where the cell has none (older records)."""
    return None if value is None or pd.isna(value) else bool(value)


# Two launches of one server configuration should agree on a cell's output throughput within this fraction; on an
# H200 a DDTree point's launches were up to 2.1x apart on cells whose own sub-windows agreed within 1%
# (benchmarks/records/2026-12-03-h200-stability), so a settled window alone does not make a cell reproducible.
LAUNCH_AGREEMENT = 0.05


def launches_apart(rows: pd.DataFrame) -> tuple[float, list[float]] | None:
    """How far the server launches of one point's cell are apart on output throughput (max/min - 1) and each
    launch's mean, in launch order; None for a cell measured in one launch."""
    rows = rows.dropna(subset=["launch", "output_throughput_tok_s"])
    means = rows.groupby("launch", sort=True)["output_throughput_tok_s"].mean()
    if len(means) < 2 or means.min() <= 0:
        return None
    return float(means.max() / means.min() - 1), [float(v) for v in means]


def cell_flags(cells: pd.DataFrame, point_id: str, context: int, concurrency: int) -> dict[str, Any]:
    """A point's repeats at one cell: how many, how many unstable (and the widest sub-window spread), how far its
    launches are apart when beyond LAUNCH_AGREEMENT, how many stalls (and the slowest first token), and whether any
    repeat's acceptance is saturated."""
    rows = cells[(cells["point_id"] == point_id) & (cells["context"] == context)
                 & (cells["concurrency"] == concurrency)]
    unstable = rows[rows["stable"] == False]  # noqa: E712 (None: no window recorded, not unstable)
    apart = launches_apart(rows)
    return {"repeats": len(rows), "unstable": len(unstable),
            "launches_apart": apart[0] if apart and apart[0] > LAUNCH_AGREEMENT else None,
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
            if flags["launches_apart"] is not None:
                unstable.append(f"{where}: its server launches {flags['launches_apart']:.1%} apart on output "
                                "throughput")
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
                    f"disagree beyond 10%) or between server launches (beyond {LAUNCH_AGREEMENT:.0%}): "
                    + "; ".join(sorted(set(unstable))) + ". Measure these cells again (longer "
                    "benchmark.max_window_s, more launches) before relying on them."})
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
    for (point_id, workload, context, concurrency), rows in cells.groupby(
            ["point_id", "workload", "context", "concurrency"], sort=True):
        apart = launches_apart(rows)
        if apart and apart[0] > LAUNCH_AGREEMENT:
            items.append(f"`{point_id}` {workload} context {context}, C={concurrency}: server launches "
                         f"{apart[0]:.1%} apart, output throughput "
                         + ", ".join(f"{v:.0f}" for v in apart[1]) + " tok/s per launch")
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
        "Unstable: the cell's sub-windows, recomputed from its requests, are more than "
        "benchmark.stability_tolerance apart (mostly cells that ran to benchmark.max_window_s unsettled; near the "
        "tolerance, also cells the running check stopped as settled). Launches apart: the point's server "
        "launches disagree on the cell's "
        f"output throughput by more than {LAUNCH_AGREEMENT:.0%}, although each window may have settled; the launch, "
        "not the window, is then the unit of variation (more launches narrow it). Saturated: every verify step "
        "accepted every draft, so the acceptance measures the verify width, not the drafter. Stalls: a first token "
        "more than 10× the cell's median and 0.25 s late; stalled requests stay in every figure "
        "(docs/statistics.md)."), "items": items}
