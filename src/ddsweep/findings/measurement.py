"""Summary blocks about what the benchmark measured: acceptance per workload (and on the coding eval's own
requests), stopping rules, the steady-state throughput window, prompts that missed their context, and knobs
no check could verify."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ddsweep.analysis.decisions import Decisions


def _acceptance(tokens: float, verify: float) -> str:
    return f"{tokens / verify:.2f}" if verify else "—"


def workload_caveats(d: Decisions) -> list[dict[str, Any]]:
    """Acceptance per workload, from the raw request records, beside the coding eval's; the ignore_eos note;
    and how the throughput figures were windowed."""
    out: list[dict[str, Any]] = []
    requests = d.results.requests
    out.append(_acceptance_block(d, requests))
    past_eos = requests["ignore_eos"].map(lambda v: v is True) if not requests.empty else None
    if past_eos is not None and past_eos.any():
        names = sorted({str(w) for w in requests.loc[past_eos, "workload"]})
        out.append({"kind": "ignore_eos", "title": "Generation past end-of-sequence", "text": (
            f"Workload(s) {', '.join(f'`{n}`' for n in names)} ran with ignore_eos: every request generated its full "
            "max_new_tokens, and text past the natural end tends to repeat, which a drafter predicts unusually "
            "well. Acceptance and speed-ups measured there may be inflated.")})
    cells = d.results.cells
    if not cells.empty and "throughput_window" in cells:
        steady = int((cells["throughput_window"] == "steady").sum())
        out.append({"kind": "steady_state", "title": "Throughput window", "text": (
            f"Aggregate output throughput is measured over each cell's steady state (from the moment C requests "
            f"are in flight until the first of the last C completions) in {steady} of {len(cells)} cell repeats"
            + ("; the others (no steady state: too few requests) use the whole cell. " if steady < len(cells)
               else ". ") + "Both figures are in "
            "results/tables/bench_cells.csv (`output_throughput_tok_s`, `whole_output_throughput_tok_s`).")})
    return out


def _acceptance_block(d: Decisions, requests: pd.DataFrame) -> dict[str, Any]:
    """A table of acceptance length per point and workload (ratio of sums), plus the coding eval's."""
    block: dict[str, Any] = {"kind": "acceptance_by_workload", "title": "Acceptance length by workload"}
    done = requests[requests["ok"].map(lambda v: v is True)] if not requests.empty else requests
    workloads = sorted({str(w) for w in done["workload"].dropna()}) if not done.empty else []
    coding: dict[str, tuple[float, float]] = {}
    for point_id, records in d.results.coding_records.items():
        spec = [r for r in records if isinstance(r.get("spec_verify_ct"), int | float) and r.get("spec_verify_ct")
                and isinstance(r.get("completion_tokens"), int | float)]
        if spec:
            coding[point_id] = (sum(r["completion_tokens"] for r in spec), sum(r["spec_verify_ct"] for r in spec))
    rows = []
    for p in d.results.points:
        mine = done[done["point_id"] == p.point_id] if not done.empty else done
        cells = []
        any_value = False
        for w in workloads:
            part = mine[(mine["workload"] == w) & mine["spec_verify_ct"].notna()] if not mine.empty else mine
            verify = float(part["spec_verify_ct"].sum()) if not part.empty else 0.0
            any_value |= verify > 0
            cells.append(_acceptance(float(part["completion_tokens"].sum()), verify) if verify else "—")
        tokens, verify = coding.get(p.point_id, (math.nan, 0.0))
        any_value |= verify > 0
        if any_value:
            rows.append([f"`{p.point_id}`", *cells, _acceptance(tokens, verify)])
    if not rows:
        block["text"] = "No speculative acceptance was recorded (no point reported verify steps)."
        return block
    block["text"] = ("Acceptance length (output tokens per verify step, counting the bonus token; ratio of sums over "
                     "every measured request) depends on what is generated: code is more predictable than prose.")
    block["table"] = {"columns": ["point", *(f"{w}" for w in workloads), "coding eval"], "rows": rows}
    return block


def verification_caveats(d: Decisions) -> list[dict[str, Any]]:
    """Knobs no check verified, cells whose prompts missed their target context, cells whose prompts repeated or
    hit the prefix cache beyond their shared prefix, and comparisons above a point's admission limit."""
    out: list[dict[str, Any]] = []
    unverified: dict[str, list[str]] = {}
    for p in d.results.points:
        for entry in p.unverified:
            unverified.setdefault(str(entry.get("knob")), []).append(p.point_id)
    if unverified:
        out.append({"kind": "unverified_knobs", "title": "Knobs no check verified", "text": (
            "These knobs reached the server, but nothing the server reports shows that it applied them (for DDTree, "
            "topk travels in SGLANG_DDTREE_MAX_TOPK, which /server_info does not show); add a verify.log_patterns "
            "entry where the engine logs it."),
            "items": [f"{knob}: {len(ids)} point(s): " + ", ".join(f"`{i}`" for i in sorted(ids))
                      for knob, ids in sorted(unverified.items())]})
    off = [(p.point_id, c) for p in d.results.points for c in p.off_target_cells]
    if off:
        out.append({"kind": "context_off_target", "title": "Prompts off their target context", "text": (
            "In these cells the server counted prompt lengths further from the target context than "
            "benchmark.context_tolerance allows; their figures describe another context than the label says."),
            "items": [f"`{pid}` {c.get('workload') or ''} context {c.get('context')}, C={c.get('concurrency')}, "
                      f"repeat {c.get('repeat')}: prompt tokens {c.get('prompt_tokens_min')}–"
                      f"{c.get('prompt_tokens_max')} (worst error {_pct(c.get('prompt_tokens_max_rel_error'))})"
                      for pid, c in off[:20]]})
    cached = [(p.point_id, c) for p in d.results.points for c in p.cache_cells]
    if cached:
        out.append({"kind": "prefix_cache", "title": "Prompts served from the prefix cache", "text": (
            "In these cells prompts repeated, or the server reported more cached prompt tokens (meta_info "
            "cached_tokens) than the prefix all the cell's prompts share (chat template and instruction): their "
            "time to first token partly measures cache hits, which the workload does not intend."),
            "items": [f"`{pid}` {c.get('workload') or ''} context {c.get('context')}, C={c.get('concurrency')}, "
                      f"repeat {c.get('repeat')}: {c.get('repeated_prompts') or 0} repeated prompt(s), "
                      f"{c.get('cached_beyond_common_prefix') or 0} request(s) cached beyond the shared "
                      f"{c.get('common_prefix_tokens')} tokens, cached share {_pct(c.get('cached_share'))}"
                      for pid, c in cached[:20]]})
    out.extend(_admission_caveat(d))
    return out


def _admission_caveat(d: Decisions) -> list[dict[str, Any]]:
    """Concurrency levels at which a compared point admits fewer requests than are in flight (its
    max_running_requests from /server_info): the rest queue on that point only."""
    cells = d.results.cells
    levels = sorted({int(c) for c in cells["concurrency"].dropna()}) if not cells.empty else []
    rows = [[f"`{p.point_id}`", str(limit), ", ".join(str(c) for c in levels if c > limit)]
            for p in d.results.points if (limit := p.limits.get("max_running_requests")) and levels[-1:] > [limit]]
    if not rows:
        return []
    return [{"kind": "admission_limits", "title": "Concurrency above a point's admission limit", "text": (
        "These points admit at most max_running_requests requests at once (the server's resolved value; SGLang "
        "sets 48 for DFLASH when it is unset). At the concurrency levels listed, their extra requests wait in the "
        "server's queue, so a comparison there with a point that admits them all compares queueing with serving; "
        "set the same --max-running-requests on every preset to compare like with like."),
        "table": {"columns": ["point", "max_running_requests", "concurrency above it"], "rows": rows}}]


def _pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else "unknown"
