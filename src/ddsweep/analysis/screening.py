"""The adaptive study's selection: which screened points could still be the best, and the funnel of stages.

A screening run measures each point once, briefly. Its uncertainty has two parts: the standard error of the
per-request figures within that one launch, and the variation between server launches, which one launch cannot
show and which `sweep.screen.launch_cv` states (a relative standard deviation). Per regime and per priority, a
point is dropped only when the band of its relative difference to the best point lies entirely below
`sweep.screen.tolerance`; every other point survives, together with the `ar` and DFlash baselines. The same
selection runs again after each confirmation launch but the last (a race), on every launch of each point so far,
and there keeps at most `sweep.screen.race_keep` of the remaining points per regime and priority, the best by
their figures so far. See docs/adaptive.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ddsweep.analysis.results import first_line
from ddsweep.analysis.statistics import t_quantile
from ddsweep.config.stages import (
    baseline_ids,
    confirm_launches,
    primary_workload,
    refine_candidates,
    screen_ids,
    screen_settings,
    settle_launches,
)
from ddsweep.storage import write_json_atomic, write_text_atomic

LOWER_IS_BETTER = frozenset({"ttft_p50_s", "tpot_p50_s"})


@dataclass
class Estimate:
    """One screened figure: its value and its relative standard errors within the launch and between launches
    (the second is shared by every figure of one launch); `df`, the degrees of freedom of the within-launch error
    (estimated from the requests; 0: taken as known)."""

    value: float
    within: float
    launch: float
    df: int = 0

    @property
    def rel_se(self) -> float:
        """The relative standard error of the figure."""
        return math.hypot(self.within, self.launch)

    def half_width(self, confidence: float) -> float:
        """Half the width of the figure's band on the log scale: the within-launch error at Student's t quantile
        (it is estimated from few requests), the between-launch error at the normal one (it is stated)."""
        z = _z(confidence)
        q = t_quantile(0.5 + confidence / 2, self.df) if self.df > 0 else z
        return math.hypot(q * self.within, z * self.launch)


@dataclass
class Verdict:
    """Why a point was dropped: the comparison that excluded it."""

    point_id: str
    where: str
    relative: float
    low: float
    high: float
    best: str
    level: float
    rank: int = 0
    kept: int = 0

    @property
    def reason(self) -> str:
        """A sentence such as '−18% vs best at latency (bs8-b8-t4-w2048), band −21%…−15% (±1.64 se)', with the
        point's rank when the race's cap, not the band, dropped it. The band is the selection rule's, not a
        confidence interval: the best is chosen from the same data (docs/adaptive.md)."""
        text = (f"{_pct(self.relative)} vs best at {self.where} ({self.best}), "
                f"band {_pct(self.low)}…{_pct(self.high)} (±{_z(self.level):.2f} se)")
        return text + (f"; ranked {self.rank} there, and the race keeps {self.kept}" if self.rank else "")


@dataclass
class Selection:
    """The outcome of one selection round."""

    screened: list[str]
    survivors: list[str]
    dropped: dict[str, str]
    best: dict[str, str]
    refine: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    settle: list[str] | None = None
    extra_launches: dict[str, list[int]] = field(default_factory=dict)
    race_launches: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The record written to results/screen/*.json and results/confirm/race-*.json (docs/results-schema.md);
        a race round's also lists `race_launches`, a settling round's `settle` and `extra_launches`."""
        record = {"screened": self.screened, "survivors": self.survivors, "dropped": self.dropped,
                  "best": self.best, "refine": self.refine, "failed": self.failed, "rounds": self.rounds}
        if self.race_launches:
            record["race_launches"] = self.race_launches
        if self.settle is not None:
            record.update(settle=self.settle, extra_launches=self.extra_launches)
        return record


def _pct(x: float) -> str:
    """A relative difference as a signed percentage with a real minus sign."""
    return f"{x * 100:+.0f}%".replace("-", "\u2212")


def _request_figure(metric: str, record: dict) -> float | None:
    """One request's contribution to `metric` (for the within-launch standard error)."""
    tokens, decode = record.get("completion_tokens"), record.get("decode_s")
    if metric == "decode_tok_s":
        return (tokens - 1) / decode if tokens and tokens > 1 and decode else None
    if metric == "output_throughput_tok_s":
        e2e = record.get("e2e_s")
        return tokens / e2e if tokens and e2e else None
    if metric == "acceptance_length":
        return record.get("acceptance_length")
    if metric == "ttft_p50_s":
        return record.get("ttft_s")
    if metric == "tpot_p50_s":
        return decode / (tokens - 1) if tokens and tokens > 1 and decode is not None else None
    raise ValueError(f"analysis.regimes: unknown metric {metric!r}")


def _cell_value(metric: str, records: list[dict]) -> float | None:
    """The cell's figure, computed as the benchmark's cells.json computes it (docs/results-schema.md)."""
    if metric == "output_throughput_tok_s":
        starts = [r["start_ts"] for r in records if r.get("start_ts") is not None]
        ends = [r["end_ts"] for r in records if r.get("end_ts") is not None]
        wall = max(ends) - min(starts) if starts and ends else 0
        return sum(r.get("completion_tokens") or 0 for r in records if not r.get("error")) / wall if wall else None
    if metric == "acceptance_length":
        verify = [r for r in records if r.get("spec_verify_ct")]
        return (sum(r["completion_tokens"] or 0 for r in verify) / sum(r["spec_verify_ct"] for r in verify)
                if verify else None)
    values = [v for r in records if (v := _request_figure(metric, r)) is not None]
    return statistics.median(values) if values else None


def estimate(records: list[dict], metric: str, context: int, concurrency: int, launch_cv: float,
             workload: str | None = None) -> Estimate | None:
    """The screened figure of one regime cell (of `workload`, when records name one) with its relative standard
    error, or None when not measured."""
    cell = [r for r in records if r.get("context") == context and r.get("concurrency") == concurrency
            and not r.get("warmup") and not r.get("error")
            and (workload is None or r.get("workload") in (None, workload))]
    value = _cell_value(metric, cell)
    if value is None or value <= 0:
        return None
    if metric == "output_throughput_tok_s":
        return Estimate(value, _wall_rel_se(cell, concurrency), launch_cv, max(0, len(cell) - 1))
    per_request = [v for r in cell if (v := _request_figure(metric, r)) is not None]
    within = 0.0
    if len(per_request) > 1 and statistics.fmean(per_request) > 0:
        within = statistics.stdev(per_request) / statistics.fmean(per_request) / math.sqrt(len(per_request))
    return Estimate(value, within, launch_cv, max(0, len(per_request) - 1))


@functools.cache
def _normal_max_moments(n: int) -> tuple[float, float]:
    """Mean and standard deviation of the largest of `n` standard normal draws (numerical integration)."""
    step, mean, second = 0.002, 0.0, 0.0
    for i in range(-4000, 4001):
        x = i * step
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        density = n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * cdf ** (n - 1)
        mean += x * density * step
        second += x * x * density * step
    return mean, math.sqrt(max(0.0, second - mean * mean))


def _wall_rel_se(cell: list[dict], concurrency: int) -> float:
    """The relative standard error of a throughput cell's figure (tokens over the cell's wall time). Each wave of
    C requests lasts as long as its slowest request, so the wall time varies as the largest of C request times
    (normal approximation), not as their mean: with C=32 about twice the standard error of the mean. The slowest
    request is one of the longest, and every point generates the same lengths for the same prompts (decoding is
    lossless), so the spread that counts is that of the longest requests' time per output token (of every
    request's when fewer than two share the longest length), not the spread of lengths that end of sequence
    brings."""
    timed = [r for r in cell if r.get("e2e_s") and r.get("completion_tokens")]
    longest = max((r["completion_tokens"] for r in timed), default=0)
    group = [r for r in timed if r["completion_tokens"] == longest]
    per_token = [r["e2e_s"] / r["completion_tokens"] for r in (group if len(group) > 1 else timed)]
    if len(per_token) < 2:
        return 0.0
    mean, sd = statistics.fmean(per_token), statistics.stdev(per_token)
    top_mean, top_sd = _normal_max_moments(max(1, min(concurrency, len(per_token))))
    waves = max(1.0, len(timed) / max(1, concurrency))
    return math.sqrt(waves) * sd * top_sd / (waves * (mean + sd * top_mean))


def load_launch(directory: Path) -> list[dict] | None:
    """The measured requests of one job directory (DIRECTORY/bench/requests.jsonl), or None when the job did not
    complete (no status.json) or recorded no requests."""
    path = Path(directory) / "bench" / "requests.jsonl"
    if not (Path(directory) / "status.json").exists() or not path.exists():
        return None
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_screen(screen_dir: Path, point_ids: list[str]) -> tuple[dict[str, list[list[dict]]], list[str]]:
    """Per point, its screening launch's requests (SCREEN_DIR/<id>/), as a list of one launch; and the points
    whose screening did not complete."""
    found, failed = {}, []
    for pid in point_ids:
        records = load_launch(Path(screen_dir) / pid)
        if records is None:
            failed.append(pid)
        else:
            found[pid] = [records]
    return found, failed


def _z(confidence: float) -> float:
    """The two-sided normal quantile of `confidence`."""
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


def bands(scores: dict[str, Estimate], where: str, confidence: float) -> list[Verdict]:
    """Every point's relative difference to the best of `scores` with its band, ±√(h_p² + h_best²) on the log
    scale, h each figure's half width at `confidence` (z·se, the within-launch part at Student's t), best first,
    then by figure."""
    if not scores:
        return []
    ranked = sorted(scores, key=lambda p: (scores[p].value, p), reverse=True)
    best, top = ranked[0], scores[ranked[0]]
    out = []
    for pid in ranked:
        diff = math.log(scores[pid].value / top.value)
        width = math.hypot(scores[pid].half_width(confidence), top.half_width(confidence))
        out.append(Verdict(pid, where, math.expm1(diff), math.expm1(diff - width), math.expm1(diff + width),
                           best, confidence))
    return out


def _compare(scores: dict[str, Estimate], where: str, confidence: float, dropped: dict[str, Verdict],
             tolerance: float = 0.0, keep_at_most: int | None = None) -> str | None:
    """Drop from `scores` every point whose band of the relative difference to the best lies below +`tolerance`
    (clearly worse, or at most a near-tie), then, with `keep_at_most`, every remaining point ranked below that
    many; returns the best point.
    (Bonferroni-adjusted bands gave no more correct recommendations in benchmarks/bench_adaptive.py on the
    62-job grid, 27 vs 28 of 30, and confirmed about 1.7 times as many.)"""
    ranked = bands(scores, where, confidence)
    remaining = 0
    for verdict in ranked:
        if verdict.point_id != verdict.best and verdict.high < tolerance:
            dropped[verdict.point_id] = verdict
            continue
        remaining += 1
        if keep_at_most and remaining > keep_at_most:
            verdict.rank, verdict.kept = remaining, keep_at_most
            dropped[verdict.point_id] = verdict
    return ranked[0].best if ranked else None


def combine(estimates: list[Estimate]) -> Estimate | None:
    """One figure from several launches of a point: the geometric mean of the launches' figures; its within-launch
    error is the launches' errors pooled, and the between-launch error shrinks with the square root of the number
    of launches."""
    if not estimates:
        return None
    n = len(estimates)
    value = math.exp(statistics.fmean(math.log(e.value) for e in estimates))
    within = math.sqrt(sum(e.within ** 2 for e in estimates)) / n
    return Estimate(value, within, estimates[0].launch / math.sqrt(n), sum(e.df for e in estimates))


def regime_scores(config: dict, launches: dict[str, list[list[dict]]]) -> dict[str, dict[str, Estimate]]:
    """Per regime, each point's figure over its launches (higher is better: lower-is-better metrics inverted)."""
    launch_cv = screen_settings(config)["launch_cv"]
    out: dict[str, dict[str, Estimate]] = {}
    for regime in config.get("analysis", {}).get("regimes", []):
        metric, scores = regime["metric"], {}
        for pid, runs in launches.items():
            est = combine([e for records in runs
                           if (e := estimate(records, metric, regime["context"], regime["concurrency"], launch_cv,
                                             primary_workload(config))) is not None])
            if est is not None:
                value = 1.0 / est.value if metric in LOWER_IS_BETTER else est.value
                scores[pid] = Estimate(value, est.within, est.launch, est.df)
        out[regime["name"]] = scores
    return out


def priority_scores(config: dict, per_regime: dict[str, dict[str, Estimate]]) -> dict[str, dict[str, Estimate]]:
    """Per priority, each point's weighted geometric mean of its regime figures relative to each regime's best,
    the summary's priority score (docs/statistics.md), for the points measured in every regime the priority weighs.
    On the log scale the errors add with the weights; the launch's part is one factor shared by every regime."""
    out = {}
    for name, weights in config.get("analysis", {}).get("priorities", {}).items():
        used = {r: w for r, w in weights.items() if w > 0 and per_regime.get(r)}
        if not used:
            continue
        tops = {r: max(e.value for e in per_regime[r].values()) for r in used}
        total = sum(used.values())
        common = set.intersection(*(set(per_regime[r]) for r in used))
        scores = {}
        for pid in common:
            parts = [(w / total, per_regime[r][pid], tops[r]) for r, w in used.items()]
            value = math.exp(sum(f * math.log(e.value / top) for f, e, top in parts))
            within = math.sqrt(sum((f * e.within) ** 2 for f, e, _ in parts))
            launch = sum(f * e.launch for f, e, _ in parts)  # one launch: the same factor in every regime
            scores[pid] = Estimate(value, within, launch, min(e.df for _, e, _ in parts))
        out[name] = scores
    return out


def select(config: dict, launches: dict[str, list[list[dict]]], where: str = "", race: bool = False) -> Selection:
    """Keep, per regime and priority, every point that could still be the best (in a `race` round at most
    `sweep.screen.race_keep` of them), plus the baselines. `launches` holds per point the request records of each
    of its launches (screening, then confirmation launches).

    A point survives if some regime or priority keeps it; its reason for being dropped is its worst comparison
    (prefixed with `where`, the stage that dropped it)."""
    settings = screen_settings(config)
    keep_at_most = settings.get("race_keep") if race else None
    per_regime = regime_scores(config, launches)
    verdicts: dict[str, dict[str, Verdict]] = {}
    best: dict[str, str] = {}
    for name, scores in per_regime.items():
        dropped: dict[str, Verdict] = {}
        top = _compare(scores, f"{name}", settings["confidence"], dropped, settings["tolerance"], keep_at_most)
        if top:
            best[f"regime:{name}"] = top
        verdicts[f"regime:{name}"] = dropped
    for name, scores in priority_scores(config, per_regime).items():
        dropped = {}
        top = _compare(scores, f"priority {name}", settings["confidence"], dropped, settings["tolerance"],
                       keep_at_most)
        if top:
            best[f"priority:{name}"] = top
        verdicts[f"priority:{name}"] = dropped
    always = set(baseline_ids(config))
    survivors, reasons = [], {}
    for pid in launches:
        excluded = [v[pid] for v in verdicts.values() if pid in v]
        if pid in always or len(excluded) < len(verdicts) or not verdicts:
            survivors.append(pid)
        else:
            reasons[pid] = where + max(excluded, key=lambda v: v.high).reason
    return Selection(screened=list(launches), survivors=survivors, dropped=reasons, best=best)


def select_round(config: dict, screen_dir: Path, point_ids: list[str], previous: dict | None) -> Selection:
    """Round 1 (previous None): select among the configured points and list refinement points around the
    screening's best points (`sweep.refine_around: best`) or all its survivors. Final round: select again among
    round-1 survivors and the refinement points."""
    candidates = point_ids if previous is None else list(dict.fromkeys([*previous["survivors"],
                                                                         *previous["refine"]]))
    requests, failed = load_screen(screen_dir, candidates)
    selection = select(config, requests)
    selection.failed = failed
    stage = {"stage": "screen" if previous is None else "refine", "entered": len(candidates),
             "kept": len(selection.survivors)}
    if previous is None:
        around = (selection.survivors if config["sweep"].get("refine_around") == "survivors"
                  else sorted(set(selection.best.values())))
        selection.refine = [p.point_id for p in refine_candidates(config, around)]
        selection.rounds = [stage]
    else:
        _carry_over(previous, selection, stage)
    return selection


def _carry_over(previous: dict, selection: Selection, stage: dict) -> None:
    """A later round's record keeps the earlier rounds': screened, dropped and failed points, the refinement
    points, the launches of the points the race dropped and the rounds, with this round's added."""
    selection.race_launches = {**previous.get("race_launches", {}), **selection.race_launches}
    selection.dropped = {**previous["dropped"], **selection.dropped}
    selection.screened = list(dict.fromkeys([*previous["screened"], *selection.screened]))
    selection.failed = list(dict.fromkeys([*previous.get("failed", []), *selection.failed]))
    selection.refine = list(previous.get("refine", []))
    selection.rounds = [*previous.get("rounds", []), stage]


def race_round(config: dict, screen_dir: Path, confirm_dir: Path, previous: dict, launch: int) -> Selection:
    """The selection after confirmation launch LAUNCH (0-based) of the points still in the race (`previous`'s
    survivors): each point's screening launch and its confirmation launches 0..LAUNCH count as launches. A point
    none of whose launches completed stays in (its merged result records the failure); the baselines always stay.
    From the last configured launch on, the round settles the priorities' picks instead (`settle_round`)."""
    if launch >= confirm_launches(config) - 1:
        return settle_round(config, confirm_dir, previous, launch)
    candidates = list(previous["survivors"])
    launches: dict[str, list[list[dict]]] = {}
    for pid in candidates:
        dirs = [Path(screen_dir) / pid, *(Path(confirm_dir) / pid / f"launch-{k}" for k in range(launch + 1))]
        launches[pid] = [records for d in dirs if (records := load_launch(d))]
    measured = {pid: runs for pid, runs in launches.items() if runs}
    selection = select(config, measured, where=f"after confirmation launch {launch + 1}: ", race=True)
    selection.survivors = [p for p in candidates if p in selection.survivors or p not in measured]
    selection.race_launches = {p: launch + 1 for p in candidates if p not in selection.survivors}
    selection.screened = []  # the race screens nothing new
    _carry_over(previous, selection, {"stage": f"confirm launch {launch + 1}", "entered": len(candidates),
                                      "kept": len(selection.survivors)})
    return selection


def settle_round(config: dict, confirm_dir: Path, previous: dict, launch: int) -> Selection:
    """After confirmation launch LAUNCH (the last configured one or a settling launch): per priority, over the
    confirmed points' confirmation launches, the leader and the rivals whose band of their difference to it reaches
    `analysis.equivalence_margin` (they could beat it by more than the margin) run one more settling launch, at
    most `sweep.screen.race_keep` of them per priority, until none is unsettled or `sweep.screen.settle_launches`
    have run. The confirmed points do not change; the record lists the next launch's points (`settle`) and the
    settling launches each point ran (`extra_launches`)."""
    configured, settings = confirm_launches(config), screen_settings(config)
    extra = {pid: list(ks) for pid, ks in previous.get("extra_launches", {}).items()}
    if launch >= configured:
        for pid in previous.get("settle", []):
            extra.setdefault(pid, []).append(launch)
    confirmed = list(previous["survivors"])
    launches = {pid: [records for k in [*range(configured), *extra.get(pid, [])]
                      if (records := load_launch(Path(confirm_dir) / pid / f"launch-{k}"))]
                for pid in confirmed}
    measured = {pid: runs for pid, runs in launches.items() if runs}
    margin = float(config.get("analysis", {}).get("equivalence_margin", 0.02))
    keep = settings.get("race_keep")
    unsettled: dict[str, None] = {}
    best = dict(previous.get("best", {}))
    for name, scores in priority_scores(config, regime_scores(config, measured)).items():
        ranked = bands(scores, f"priority {name}", settings["confidence"])
        if not ranked:
            continue
        best[f"priority:{name}"] = ranked[0].point_id
        rivals = [v.point_id for v in ranked[1:] if v.high >= margin][:keep - 1 if keep else None]
        if rivals:
            unsettled.update(dict.fromkeys([ranked[0].point_id, *rivals]))
    settle = list(unsettled) if launch + 1 < configured + settle_launches(config) else []
    selection = Selection(screened=[], survivors=confirmed, dropped={}, best=best)
    _carry_over(previous, selection, {"stage": f"settle after launch {launch + 1}", "entered": len(confirmed),
                                      "kept": len(settle)})
    selection.settle, selection.extra_launches = settle, extra
    return selection


def _status_minutes(paths: list[Path]) -> float:
    """Total job minutes recorded in status.json / failure.json files."""
    total = 0.0
    for path in paths:
        try:
            total += float(json.loads(path.read_text(encoding="utf-8")).get("duration_s") or 0) / 60
        except (OSError, ValueError, TypeError):
            continue
    return total


def _job_files(directories: list[Path]) -> list[Path]:
    """The job records (status.json or failure.json) in DIRECTORIES that exist."""
    return [d / name for d in directories for name in ("status.json", "failure.json") if (d / name).exists()]


def screen_failure(directory: Path) -> dict:
    """Why a screening job left no results: the error kind and one-line reason of its failure.json."""
    try:
        record = json.loads((directory / "failure.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"error_kind": "no_results", "reason": f"no status.json or failure.json in {directory}"}
    return {"error_kind": record.get("error_kind") or "unknown", "reason": first_line(record.get("error")) or ""}


def _failure_text(pid: str, doc: dict) -> str:
    """'`pid` failed in screening (server_crash: the server exited …)', or without the reason in older records."""
    failure = doc.get("failures", {}).get(pid)
    return f"`{pid}` failed in screening" + (f" ({failure['error_kind']}: {failure['reason']})" if failure else "")


def funnel(selection: dict, screen_dir: Path, confirm_dir: Path, gpus: int, launches: int) -> dict:
    """How many points entered each stage, why each dropped one was dropped, and the GPU time of each stage.
    Only the jobs of this study count: the confirmed points' `launches` configured launches, the launches of the
    points the race dropped (`race_launches`) and the listed settling launches, so launch directories left by
    another study in the same results directory do not."""
    screen_dir, confirm_dir = Path(screen_dir), Path(confirm_dir)
    refine = set(selection.get("refine", []))
    grid_screened = [p for p in selection["screened"] if p not in refine]
    ran = {**{pid: launches for pid in selection["survivors"]}, **selection.get("race_launches", {})}
    confirm = [confirm_dir / pid / f"launch-{k}" for pid, n in ran.items() for k in range(n)]
    settling = [confirm_dir / pid / f"launch-{k}" for pid, ks in selection.get("extra_launches", {}).items()
                for k in ks]
    races = [r for r in selection.get("rounds", []) if r["stage"].startswith("confirm")]
    entered_confirm = races[0]["entered"] if races else len(selection["survivors"])
    minutes = {"screen": _status_minutes(_job_files([screen_dir / p for p in grid_screened])),
               "refine": _status_minutes(_job_files([screen_dir / p for p in refine])),
               "confirm": _status_minutes(_job_files(confirm)),
               "settle": _status_minutes(_job_files(settling))}
    return {
        "stages": {
            "screen": {"points": len(grid_screened), "job_min": minutes["screen"]},
            "refine": {"points": len(refine), "job_min": minutes["refine"]},
            "confirm": {"points": entered_confirm, "job_min": minutes["confirm"]},
            "settle": {"points": len(selection.get("extra_launches", {})), "job_min": minutes["settle"]},
        },
        "rounds": selection.get("rounds", []),
        "gpus_per_job": gpus,
        "gpu_hours": {k: v * gpus / 60 for k, v in minutes.items()},
        "dropped": selection["dropped"], "failed": selection.get("failed", []),
        "failures": {pid: screen_failure(screen_dir / pid) for pid in selection.get("failed", [])},
        "best_in_screening": selection.get("best", {}), "survivors": selection["survivors"],
    }


def render_funnel(doc: dict, simulated: bool) -> str:
    """The Markdown section of the summary that shows the adaptive study's funnel."""
    label = " (SIMULATED)" if simulated else ""
    out = [f"## Adaptive study: screening funnel{label}", "",
           "| stage | points | job time (min) | GPU-hours |", "|---|---|---|---|"]
    for name, stage in doc["stages"].items():
        out.append(f"| {name} | {stage['points']} | {stage['job_min']:.1f} | {doc['gpu_hours'][name]:.2f} |")
    if doc.get("rounds"):
        out += ["", "| selection | points in | points kept |", "|---|---|---|"]
        out += [f"| {r['stage']} | {r['entered']} | {r['kept']} |" for r in doc["rounds"]]
    out += ["", f"{len(doc['survivors'])} point(s) confirmed: " + ", ".join(f"`{p}`" for p in doc["survivors"]), ""]
    if doc["dropped"]:
        out += ["Dropped (each with its closest comparison to the best at that stage):", ""]
        out += [f"- `{pid}`: {reason}" for pid, reason in sorted(doc["dropped"].items())]
    if doc["failed"]:
        out += ["", "Failed in screening (not confirmed; each point's results/screen/<point>/failure.json):", ""]
        out += [f"- {_failure_text(pid, doc)}" for pid in doc["failed"]]
    return "\n".join(out) + "\n"


def funnel_block(results_dir: Path) -> dict | None:
    """The funnel as a summary block (docs/results-schema.md, summary.json `sections`), or None without one."""
    path = Path(results_dir) / "screen" / "funnel.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    rows = [[name, stage["points"], round(stage["job_min"], 1), round(doc["gpu_hours"][name], 2)]
            for name, stage in doc["stages"].items()]
    items = [f"`{pid}` dropped: {reason}" for pid, reason in sorted(doc["dropped"].items())]
    items += [_failure_text(pid, doc) for pid in doc.get("failed", [])]
    return {"kind": "adaptive_funnel", "title": "Adaptive study: screening funnel",
            "text": (f"{len(doc['survivors'])} point(s) were confirmed ("
                     + ", ".join(f"`{p}`" for p in doc["survivors"]) + "); only they enter the decisions above."
                     + (" SIMULATED." if doc.get("simulated") else "")),
            "table": {"columns": ["stage", "points", "job time (min)", "GPU-hours"], "rows": rows},
            "items": items}


def funnel_markdown(results_dir: Path) -> str:
    """The funnel section for the optimization summary, or "" when RESULTS_DIR holds no adaptive study."""
    path = Path(results_dir) / "screen" / "funnel.json"
    if not path.exists():
        return ""
    doc = json.loads(path.read_text(encoding="utf-8"))
    return render_funnel(doc, bool(doc.get("simulated")))


def _read_config(path: str) -> dict:
    """The validated study configuration written by the workflow (results/study_config.yaml)."""
    return yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}


def _run_select(args: argparse.Namespace) -> int:
    """`ddsweep select`: one selection round over the screening results."""
    try:
        config = _read_config(args.config)
        previous = json.loads(Path(args.previous).read_text(encoding="utf-8")) if args.previous else None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"ddsweep select: cannot read {args.previous or args.config}: {exc}", file=sys.stderr)
        return 2
    if args.launch is not None:
        if previous is None:
            print("ddsweep select: --launch needs --previous (the selection before that launch)", file=sys.stderr)
            return 2
        selection = race_round(config, Path(args.screen), Path(args.confirm), previous, args.launch)
    else:
        selection = select_round(config, Path(args.screen), screen_ids(config), previous)
    write_json_atomic(args.out, {"simulated": bool(config.get("simulated")), **selection.to_json()})
    last = selection.rounds[-1] if selection.rounds else {"stage": "selection", "entered": len(selection.screened)}
    print(f"{last['stage']}: {len(selection.survivors)} of {last['entered']} point(s) kept; "
          f"{len(selection.refine)} refinement point(s): {args.out}")
    return 0


def _run_funnel(args: argparse.Namespace) -> int:
    """`ddsweep funnel`: write the funnel record and its Markdown section."""
    try:
        config = _read_config(args.config)
        selection = json.loads(Path(args.selection).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"ddsweep funnel: cannot read {args.selection} or {args.config}: {exc}", file=sys.stderr)
        return 2
    doc = funnel(selection, Path(args.screen), Path(args.confirm), config.get("resources", {}).get("gpus", 8),
                 confirm_launches(config))
    doc["simulated"] = bool(config.get("simulated"))
    write_json_atomic(args.out, doc)
    write_text_atomic(args.markdown, render_funnel(doc, doc["simulated"]))
    print(args.markdown)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `select` and `funnel` subcommands."""
    parser = subparsers.add_parser("select", help="adaptive study: keep the screened points that could be best",
                                   description=_run_select.__doc__)
    parser.add_argument("--config", required=True, help="the validated study config (results/study_config.yaml)")
    parser.add_argument("--screen", default="results/screen", help="the screening results directory")
    parser.add_argument("--previous", help="the previous selection: round 1 (for the selection after refinement), "
                        "or the selection before confirmation launch --launch")
    parser.add_argument("--confirm", default="results/confirm", help="the confirmation results directory")
    parser.add_argument("--launch", type=int, help="select after this confirmation launch (0-based) of the points "
                        "still in the race")
    parser.add_argument("--out", required=True, help="the selection JSON to write")
    parser.set_defaults(func=_run_select)
    parser = subparsers.add_parser("funnel", help="adaptive study: points and GPU time of each stage",
                                   description=_run_funnel.__doc__)
    parser.add_argument("--config", required=True, help="the validated study config")
    parser.add_argument("--selection", required=True, help="the final selection (results/screen/selection.json)")
    parser.add_argument("--screen", default="results/screen")
    parser.add_argument("--confirm", default="results/confirm")
    parser.add_argument("--out", required=True, help="the funnel JSON to write")
    parser.add_argument("--markdown", required=True, help="the Markdown section to write")
    parser.set_defaults(func=_run_funnel)
