"""`ddsweep compare STUDY_A STUDY_B`: one study against another (a new drafter, a new SGLang build).

For the points both studies measured (matched by kind and knobs), each regime's figure of B over A with its
interval, computed from independent launch-level figures of the two studies (Welch's t on the logs); the
picks of each study side by side; and what changed in the environment: engine version and commit, drafter
path and trained block size, GPU and interconnect, and the server command lines of matched points. A study is
a results directory, a directory holding `results/`, or a report bundle (`.tar.gz`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddsweep.analysis.decisions import Decisions, Settings, analyse, ratio_text
from ddsweep.analysis.regimes import Regime, resolve_regime
from ddsweep.analysis.results import ResultSet, load_results
from ddsweep.analysis.statistics import log_difference
from ddsweep.report.bundle import BundleError, extract_bundle
from ddsweep.report.document import jsonable
from ddsweep.report.first_screen import recommend
from ddsweep.report.launch import launch_of
from ddsweep.storage import write_text_atomic

# Repeat indices of study B are shifted by this much so that no repeat of A is paired with one of B.
B_OFFSET = 1_000_000


@dataclass
class Study:
    """One side of the comparison: where it came from, its results and its decisions."""

    source: Path
    results_dir: Path
    config: dict[str, Any] | None
    results: ResultSet
    decisions: Decisions

    @property
    def name(self) -> str:
        """The study's name (its config's `study`)."""
        return self.decisions.settings.study


class StudyError(ValueError):
    """A path given to `ddsweep compare` is not a study."""


def _results_dir(root: Path) -> Path:
    """ROOT itself when it holds points/, else ROOT/results."""
    if (root / "points").is_dir():
        return root
    if (root / "results" / "points").is_dir():
        return root / "results"
    raise StudyError(f"{root}: neither {root}/points/ nor {root}/results/points/ exists (not a results directory)")


def _config_near(results_dir: Path) -> dict[str, Any] | None:
    """The study config the workflow wrote (results/study_config.yaml), else the one archived beside the results
    (a bundle's config/*.yaml) if there is exactly one."""
    configs = [results_dir / "study_config.yaml"]
    if not configs[0].is_file():
        configs = sorted((results_dir.parent / "config").glob("*.yaml"))
    if len(configs) != 1:
        return None
    try:
        loaded = yaml.safe_load(configs[0].read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None


def open_study(path: Path, scratch: Path, config: dict[str, Any] | None = None) -> Study:
    """Load a results directory or a bundle (extracted under SCRATCH) and decide it as `summarize` would."""
    path = Path(path)
    if path.is_file():
        if not path.name.endswith(".tar.gz"):
            raise StudyError(f"{path}: a file must be a report bundle (.tar.gz)")
        try:  # stored and referenced files alike (a bundle may hold only what changed since its base)
            root = extract_bundle(path, scratch)
        except (OSError, tarfile.TarError, BundleError) as exc:
            raise StudyError(f"{path}: cannot read the bundle: {exc}") from exc
    elif path.is_dir():
        root = path
    else:
        raise StudyError(f"{path}: no such file or directory")
    results_dir = _results_dir(root)
    config = config if config is not None else _config_near(results_dir)
    settings = Settings.from_config(config)
    results = load_results(results_dir, None, settings.confidence)
    return Study(path, results_dir, config, results, analyse(results, settings))


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
    from ddsweep.analysis.statistics import mean_interval

    return mean_interval(list(values.values()), level).as_dict() if values else None


def matched_ratios(a: Study, b: Study) -> dict[str, Any]:
    """Per matched point and regime: A's and B's figures and B over A (better direction, > 1: B better), from
    per-launch figures where both points ran in two or more launches, else from per-repeat figures."""
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
            va, vb = ra.units(pa.point_id), rb.units(pb.point_id)
            if va and vb and not (len(ra.launches.get(pa.point_id, {})) >= 2
                                  and len(rb.launches.get(pb.point_id, {})) >= 2):
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
    side = {}
    for label, study in (("a", a), ("b", b)):
        side[label] = {p.name: recommend(study.decisions, p) for p in study.decisions.priorities}
    names = list(dict.fromkeys([*side["a"], *side["b"]]))
    out = []
    for name in names:
        ra, rb = side["a"].get(name), side["b"].get(name)
        out.append({"priority": name,
                    "a": {"recommended": ra["recommended"], "status": ra["status"]} if ra else None,
                    "b": {"recommended": rb["recommended"], "status": rb["status"]} if rb else None})
    return out


def compare(a: Study, b: Study) -> dict[str, Any]:
    """The comparison document (compare.json)."""
    ratios = matched_ratios(a, b)
    return jsonable({
        "schema_version": 1, "simulated": a.results.simulated or b.results.simulated,
        "a": {"study": a.name, "source": str(a.source), "points": len(a.results.points)},
        "b": {"study": b.name, "source": str(b.source), "points": len(b.results.points)},
        "environment": environment_changes(a, b, ratios), "picks": picks(a, b), "matched": ratios})


def render_compare(doc: dict[str, Any]) -> str:
    """The comparison as Markdown, from the comparison document alone."""
    a, b, m = doc["a"], doc["b"], doc["matched"]
    out = [f"# Study comparison: B `{b['study']}` against A `{a['study']}`", ""]
    if doc["simulated"]:
        out += ["> **SIMULATED RESULTS.** At least one study ran against the stand-in server, not real hardware.", ""]
    out += [f"A: `{a['source']}` ({a['points']} points). B: `{b['source']}` ({b['points']} points).", "",
            "## What changed in the environment", ""]
    env = doc["environment"]
    out += ["| item | A | B | changed |", "|---|---|---|---|"]
    out += [f"| {i['item']} | {', '.join(i['a'])} | {', '.join(i['b'])} | {'**yes**' if i['changed'] else 'no'} |"
            for i in env["items"]]
    out.append("")
    if env["commands"]:
        out += ["Server command differences of matched points (the job's port left out):", ""]
        out += [f"- {c['change']}: {len(c['points'])} point(s)" for c in env["commands"]]
    else:
        out.append("The matched points' server commands are identical (the job's port left out).")
    out += ["", "## Picks", "", "| priority | A | B |", "|---|---|---|"]
    for p in doc["picks"]:
        cells = [f"`{s['recommended']}` ({s['status']})" if s and s["recommended"] else "—" for s in (p["a"], p["b"])]
        out.append(f"| {p['priority']} | {cells[0]} | {cells[1]} |")
    out += ["", "## Matched points: B over A", "",
            f"Points with the same kind and knobs in both studies. Each cell is B's figure over A's in the better "
            f"direction (> 1: B better), with a {m['level'] * 100:.3g}% interval from Welch's t on the logs of the "
            "two studies' independent figures: one per server launch where both points ran in two or more launches "
            "(units `launch`), else one per repeat (units `repeat`: the interval then covers the variation between "
            "repeats within a launch only, not between launches; docs/statistics.md).", ""]
    columns = [f"{r['name']} ({r['metric']} at context {r['context']}, C={r['concurrency']})" for r in m["regimes"]]
    out += ["| point | units | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for row in m["points"]:
        out.append(f"| `{row['point_id']}` | {row['unit']} | "
                   + " | ".join(row["regimes"][r["name"]]["text"] for r in m["regimes"]) + " |")
    if not m["points"]:
        out.append("| (no point was measured in both studies) | |" + " |" * len(columns))
    out.append("")
    for label, ids in (("A", m["only_in_a"]), ("B", m["only_in_b"])):
        if ids:
            out.append(f"- Only in {label}: " + ", ".join(f"`{i}`" for i in ids) + ".")
    return "\n".join(out).rstrip() + "\n"


def compare_plot(doc: dict[str, Any], path: Path) -> Path:
    """B over A per matched point with interval bars, one panel per regime, the line of no change at 1."""
    import matplotlib.pyplot as plt

    from ddsweep.report.plots import SIMULATED_LABEL, save_figure

    m = doc["matched"]
    regimes = m["regimes"]
    rows = m["points"]
    panels = max(1, len(regimes))
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 1.2 + 0.45 * max(3, len(rows))), squeeze=False,
                             sharey=True)
    title = f"B ({doc['b']['study']}) over A ({doc['a']['study']}) per matched point"
    fig.suptitle(("[SIMULATED] " if doc["simulated"] else "") + title, fontsize=12, fontweight="bold")
    for ax, r in zip(axes[0], regimes, strict=False):
        ys, xs, lows, highs = [], [], [], []
        for i, row in enumerate(rows):
            ratio = row["regimes"][r["name"]]["ratio"]
            if ratio and ratio["value"] is not None:
                ys.append(i)
                xs.append(ratio["value"])
                lows.append(ratio["value"] - (ratio["ci_low"] if ratio["ci_low"] is not None else ratio["value"]))
                highs.append((ratio["ci_high"] if ratio["ci_high"] is not None else ratio["value"]) - ratio["value"])
        ax.errorbar(xs, ys, xerr=[lows, highs], fmt="o", capsize=3, color="tab:blue")
        ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_ylim(-0.6, max(1, len(rows)) - 0.4)
        ax.set_title(f"{r['name']}\n{r['metric']} at context {r['context']}, C={r['concurrency']}", fontsize=9)
        ax.set_xlabel(f"B / A (> 1: B better; bars {m['level']:.0%} CI)")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(rows)), [row["point_id"] for row in rows], fontsize=8)
    axes[0][0].set_ylabel("matched point")
    if not rows:
        axes[0][0].text(0.5, 0.5, "no data for matched points", ha="center", transform=axes[0][0].transAxes)
    if doc["simulated"]:
        fig.text(0.5, 0.005, SIMULATED_LABEL, ha="center", va="bottom",
                 color="red", fontsize=11, fontweight="bold")
    fig.tight_layout(rect=(0, 0.04, 1, 0.93))
    return save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    """Run `ddsweep compare` from parsed arguments; returns the exit code."""
    configs = []
    for name in (args.config_a, args.config_b):
        try:
            configs.append(yaml.safe_load(Path(name).read_text(encoding="utf-8")) or {} if name else None)
        except (OSError, yaml.YAMLError) as exc:
            print(f"ddsweep compare: cannot read config {name}: {exc}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="ddsweep-compare-") as scratch:
        try:
            a = open_study(Path(args.study_a), Path(scratch) / "a", configs[0])
            b = open_study(Path(args.study_b), Path(scratch) / "b", configs[1])
        except StudyError as exc:
            print(f"ddsweep compare: {exc}", file=sys.stderr)
            return 2
        doc = compare(a, b)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "compare.json", json.dumps(doc, indent=1) + "\n")
    markdown = write_text_atomic(out / "compare.md", render_compare(doc))
    compare_plot(doc, out / "compare.png")
    print(markdown)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `compare` subcommand."""
    parser = subparsers.add_parser(
        "compare", help="compare two studies: matched points' ratios, picks, environment changes",
        description="Compare study B with study A (each a results directory, a directory holding results/, or a "
                    "report bundle): OUT/compare.md, OUT/compare.json and OUT/compare.png.")
    parser.add_argument("study_a", metavar="STUDY_A")
    parser.add_argument("study_b", metavar="STUDY_B")
    parser.add_argument("--out", default="reports/compare", help="output directory (default: reports/compare)")
    parser.add_argument("--config-a", help="study A's config (default: results/study_config.yaml, or the config "
                                           "archived in the bundle)")
    parser.add_argument("--config-b", help="study B's config (default: as for A)")
    parser.set_defaults(func=run)
