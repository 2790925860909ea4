"""One study against another (`ddsweep compare`): for the points both studies measured (matched by kind and
knobs), each regime's figure of B over A with its interval, computed from independent launch-level figures of the
two studies (Welch's t on the logs); the picks of each study's decision object side by side; and what changed in
the environment: engine version and commit, drafter path and trained block size, GPU and interconnect, and the
server command lines of matched points. The comparison document (compare.json) is rendered by
ddsweep.report.compare."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddsweep.analysis.decisions import Decisions, ratio_text
from ddsweep.analysis.outcome import Outcome
from ddsweep.analysis.regimes import resolve_regime
from ddsweep.analysis.results import ResultSet
from ddsweep.analysis.settings import Regime
from ddsweep.analysis.statistics import log_difference, mean_interval
from ddsweep.findings.launch import launch_of
from ddsweep.findings.summary import jsonable

# Repeat indices of study B are shifted by this much so that no repeat of A is paired with one of B.
B_OFFSET = 1_000_000


@dataclass
class Study:
    """One side of the comparison: where it came from, its results, its decisions and its decision object."""

    source: Path
    results_dir: Path
    config: dict[str, Any] | None
    results: ResultSet
    decisions: Decisions
    outcome: Outcome

    @property
    def name(self) -> str:
        """The study's name (its config's `study`)."""
        return self.decisions.settings.study


def _key(record: Any) -> tuple:
    """What identifies a configuration across studies: the kind and the four knobs."""
    return (record.kind, *record.knobs().values())


def _regimes(a: Study) -> list[Regime]:
    """A's regimes, plus acceptance at the first regime's cell when no regime measures acceptance."""
    regimes = list(a.decisions.settings.regimes)
    if regimes and not any(r.metric == "acceptance_length" for r in regimes):
        regimes.append(Regime("acceptance", "acceptance_length", regimes[0].context, regimes[0].concurrency))
    return regimes


def _figure(values: dict[int, float], level: float) -> dict[str, Any] | None:
    return mean_interval(list(values.values()), level).as_dict() if values else None


def matched_ratios(a: Study, b: Study) -> dict[str, Any]:
    """Per matched point and regime: A's and B's figures and B over A (better direction, > 1: B better), from
    per-launch figures where both points ran in two or more launches, else from per-repeat figures on both sides
    (never one side's launches against the other's repeats)."""
    level = a.decisions.settings.confidence
    a_ok = {_key(p): p for p in a.results.ok_points()}
    b_ok = {_key(p): p for p in b.results.ok_points()}
    matched = [(a_ok[k], b_ok[k]) for k in a_ok if k in b_ok]
    regimes = _regimes(a)
    rows = []
    for pa, pb in sorted(matched, key=lambda pair: pair[0].point_id):
        entry: dict[str, Any] = {"point_id": pa.point_id, "point_id_b": pb.point_id, "label": pa.label(),
                                 "unit": "launch", "regimes": {}}
        for r in regimes:
            ra, rb = resolve_regime(a.results, r, [pa.point_id]), resolve_regime(b.results, r, [pb.point_id])
            launches = len(ra.launches.get(pa.point_id, {})) >= 2 and len(rb.launches.get(pb.point_id, {})) >= 2
            va, vb = ((ra.units(pa.point_id), rb.units(pb.point_id)) if launches
                      else (ra.repeats.get(pa.point_id, {}), rb.repeats.get(pb.point_id, {})))
            if va and vb and not launches:
                entry["unit"] = "repeat"
            shifted = {k + B_OFFSET: v for k, v in vb.items()}
            diff = (log_difference(va, shifted) if r.lower_is_better else log_difference(shifted, va)
                    ) if va and vb else None
            ratio = diff.ratio(level) if diff else None
            entry["regimes"][r.name] = {"a": _figure(va, level), "b": _figure(vb, level),
                                        "ratio": ratio.as_dict() if ratio else None,
                                        "text": ratio_text(ratio) if ratio else "n/a"}
        rows.append(entry)
    only_a = sorted(p.point_id for k, p in a_ok.items() if k not in b_ok)
    only_b = sorted(p.point_id for k, p in b_ok.items() if k not in a_ok)
    return {"regimes": [{"name": r.name, "metric": r.metric, "context": r.context, "concurrency": r.concurrency,
                         "lower_is_better": r.lower_is_better} for r in regimes],
            "points": rows, "only_in_a": only_a, "only_in_b": only_b, "level": level}


def _environment_values(study: Study) -> dict[str, list[str]]:
    """Each environment item's distinct values over the study's completed points (and its config)."""
    items: dict[str, set[str]] = {k: set() for k in ("engine version", "engine commit", "GPU", "GPU count",
                                                     "interconnect", "ddsweep commit")}
    for p in study.results.ok_points():
        env = p.environment
        engine = env.get("engine") if isinstance(env.get("engine"), dict) else {}
        launcher = engine.get("launcher") if isinstance(engine.get("launcher"), dict) else {}
        source = launcher.get("sglang_source") if isinstance(launcher.get("sglang_source"), dict) else {}
        gpus = env.get("gpus") if isinstance(env.get("gpus"), list) else []
        items["engine version"].add(f"{engine.get('name', '?')} {engine.get('version', '?')}")
        items["engine commit"].add(str(source.get("commit") or "unknown (installed package)"))
        items["GPU"].add(str(gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else "none recorded"))
        items["GPU count"].add(str(env.get("gpu_count")))
        items["interconnect"].add(str(env.get("interconnect") or "unknown"))
        items["ddsweep commit"].add(f"{env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''}")
    drafter = (study.config or {}).get("drafter") or {}
    settings = study.decisions.settings
    out = {k: sorted(v) for k, v in items.items()}
    out["drafter path"] = [str(drafter.get("model_path") or "unknown (no study config found)")]
    out["drafter trained block size"] = [str(settings.trained_block_size or "unknown")]
    return out


def environment_changes(a: Study, b: Study, ratios: dict[str, Any]) -> dict[str, Any]:
    """Every environment item of A and B, the ones that differ, and the command-line differences of matched
    points (port left out), grouped by difference."""
    va, vb = _environment_values(a), _environment_values(b)
    items = [{"item": k, "a": va[k], "b": vb[k], "changed": va[k] != vb[k]} for k in va]
    commands: dict[str, list[str]] = {}
    for row in ratios["points"]:
        la, lb = launch_of(a.results_dir, row["point_id"]), launch_of(b.results_dir, row["point_id_b"])
        if la and lb:
            for change in command_changes(la, lb):
                commands.setdefault(change, []).append(row["point_id"])
    return {"items": items, "changed": [i["item"] for i in items if i["changed"]],
            "commands": [{"change": c, "points": pids} for c, pids in commands.items()]}


def command_changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The words of two launch commands that differ ('`x` → `y`'), and changed environment variables."""
    out = []
    matcher = difflib.SequenceMatcher(a=a["argv"], b=b["argv"], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        old, new = " ".join(a["argv"][i1:i2]), " ".join(b["argv"][j1:j2])
        if tag == "insert":
            out.append(f"added `{new}`")
        elif tag == "delete":
            out.append(f"removed `{old}`")
        elif tag == "replace":
            flag = a["argv"][i1 - 1] + " " if i1 > 0 and a["argv"][i1 - 1].startswith("-") else ""
            out.append(f"`{flag}{old}` → `{flag}{new}`")
    for name in sorted(set(a["env"]) | set(b["env"])):
        if a["env"].get(name) != b["env"].get(name):
            out.append(f"environment `{name}={a['env'].get(name, '')}` → `{name}={b['env'].get(name, '')}`")
    return out


def picks(a: Study, b: Study) -> list[dict[str, Any]]:
    """Each priority's recommended point in A and in B, with the decision's status."""
    side = {label: {p.priority: p for p in study.outcome.decision.priorities}
            for label, study in (("a", a), ("b", b))}
    names = list(dict.fromkeys([*side["a"], *side["b"]]))
    out = []
    for name in names:
        ra, rb = side["a"].get(name), side["b"].get(name)
        out.append({"priority": name,
                    "a": {"recommended": ra.recommended, "status": ra.status} if ra else None,
                    "b": {"recommended": rb.recommended, "status": rb.status} if rb else None})
    return out


def compare(a: Study, b: Study) -> dict[str, Any]:
    """The comparison document (compare.json)."""
    ratios = matched_ratios(a, b)
    return jsonable({
        "schema_version": 1, "simulated": a.results.simulated or b.results.simulated,
        "a": {"study": a.name, "source": str(a.source), "points": len(a.results.points)},
        "b": {"study": b.name, "source": str(b.source), "points": len(b.results.points)},
        "environment": environment_changes(a, b, ratios), "picks": picks(a, b), "matched": ratios})
