"""Summary blocks about how the study ran rather than what it measured: failed points as results (with the
patterns they form) and comparisons between points measured on different hosts or GPU types."""

from __future__ import annotations

from typing import Any

from ddsweep.analysis.causes import failure_of, group_failures, group_text
from ddsweep.analysis.decisions import Decisions, ratio_text
from ddsweep.analysis.results import failed_cells_text, failure_patterns
from ddsweep.analysis.text import first_line


def failed_points_caveat(d: Decisions) -> dict[str, Any]:
    """Each point that did not complete, with its kind and one-line reason, and the knob patterns they form."""
    points = d.results.points
    by_id = {p.point_id: p for p in points}
    items = []
    # one line per cause: a point alone with its cause as itself, points that failed alike as their group
    for group in group_failures(failure_of(p) for p in points if p.status != "ok"):
        if group.size > 1 or group.not_started:
            items.append(group_text(group) + ("; the next invocation runs them again"
                                              if group.failure_class == "infrastructure" else ""))
            continue
        p = by_id[group.failed[0]]
        items.append(f"`{p.point_id}` **{p.status}**{f' ({p.error_kind})' if p.error_kind else ''}: "
                     f"{first_line(p.error)}" + failure_class_text(p.outcome)
                     + (f" — file problems: {'; '.join(p.issues)}" if p.issues else ""))
    items += [f"`{p.point_id}` **partial**: cell(s) it lacks, not used: {failed_cells_text(p)}; its other cells "
              "count in every regime they serve" for p in points if p.shown_status == "partial"]
    items += [f"`{p.point_id}` completed, but its server ignored SIGTERM when it was stopped ({stop}): a server "
              "that outlives its job holds the node's GPUs" for p in points if p.status == "ok"
              and str(stop := (p.outcome.get("steps") or {}).get("stop", "")).startswith("killed")]
    items += [interrupted_text(p.point_id, p.interruptions) for p in points if p.interruptions]
    block: dict[str, Any] = {"kind": "failed_points", "title": "Failed, malformed and incomplete points",
                             "items": items, "text": None if items else "None: every point completed."}
    patterns = failure_patterns(points)
    if patterns:
        block["text"] = ("A failed point is a result of the study: its configuration did not work. Pattern(s): "
                         + "; ".join(patterns) + ".")
    if items:
        block["text_after"] = "Full errors: each point's failure.json (in the bundle) and results/tables/failures.csv."
    return block


def interrupted_text(point_id: str, interruptions: list[dict[str, Any]]) -> str:
    """One line on a point whose earlier attempts were interrupted: how many, where the last one ran, and that its
    figures come from the attempt that finished (an interrupted attempt's cells are never used)."""
    last = interruptions[-1]
    return (f"`{point_id}` **interrupted** {len(interruptions)} time(s) before it finished (last: started on "
            f"{last.get('host') or '?'} at {last.get('started_utc') or '?'}; {first_line(last.get('how'))}): run again "
            "whole, its figures are from the attempt that finished")


def failure_class_text(outcome: dict[str, Any]) -> str:
    """Whose failure it was and how that was decided, e.g. ` — the machine's (infrastructure), on all 3 attempts of
    this invocation: ...; the next invocation runs it again`; empty for a record without a class."""
    why = outcome.get("classified_by")
    if outcome.get("failure_class") == "infrastructure":
        attempts = f", on all {outcome['attempts']} attempts of this invocation" if outcome.get("persisted") else ""
        return f" — the machine's failure (infrastructure{attempts}: {why}); the next invocation runs it again"
    if outcome.get("failure_class") == "configuration" and why:
        return f" — the configuration's failure: {why}"
    return ""


def _where(d: Decisions) -> dict[str, tuple[str | None, str | None]]:
    """Per completed point, (GPU model, host) from its environment and outcome records."""
    jobs = d.results.jobs_frame()
    out = {}
    for row in jobs.itertuples():
        if row.status == "ok":
            gpu = None if row.gpu_name is None or row.gpu_name != row.gpu_name else str(row.gpu_name)
            host = None if row.host is None or row.host != row.host else str(row.host)
            out[str(row.point_id)] = (gpu, host)
    return out


def mixed_hosts_caveat(d: Decisions) -> dict[str, Any] | None:
    """When completed points ran on more than one host or GPU type: every decision comparison that crosses them,
    with its figures (a difference between hosts is not only a difference between configurations)."""
    where = _where(d)
    gpus = {gpu for gpu, _ in where.values()}
    hosts = {host for _, host in where.values()}
    if len(gpus) <= 1 and len(hosts) <= 1:
        return None
    items = []
    for o in d.regimes:
        if o.leader is None or o.leader not in where:
            continue
        for c in o.comparisons:
            if c.point_id in where and where[c.point_id] != where[o.leader] and c.ratio is not None:
                (g1, h1), (g2, h2) = where[o.leader], where[c.point_id]
                items.append(f"{o.resolved.regime.name}: `{o.leader}` ({g1 or '?'} on {h1 or '?'}) vs "
                             f"`{c.point_id}` ({g2 or '?'} on {h2 or '?'}): {ratio_text(c.ratio)}")
    groups: dict[tuple[str | None, str | None], list[str]] = {}
    for point_id, key in sorted(where.items()):
        groups.setdefault(key, []).append(point_id)
    table = {"columns": ["GPU", "host", "points"],
             "rows": [[gpu or "?", host or "?", ", ".join(f"`{p}`" for p in ids)]
                      for (gpu, host), ids in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))]}
    return {"kind": "mixed_hosts", "title": "Points measured on different hosts or GPU types",
            "text": (f"The completed points ran on {len(hosts)} host(s) and {len(gpus)} GPU type(s); a comparison "
                     "between them also compares machines (pin a GPU type with resources.constraint or nodes with "
                     "resources.nodelist). Comparisons of the decisions that cross machines:"
                     if items else f"The completed points ran on {len(hosts)} host(s) and {len(gpus)} GPU type(s); "
                     "no decision compares points across machines."),
            "items": items, "table": table}
