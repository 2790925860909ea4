"""The adaptive study's screening statistics: each screened figure with its uncertainty, per regime and priority.

A screening run measures each point once, briefly. Its uncertainty has two parts: the standard error of the
per-request figures within that one launch, and the variation between server launches, which one launch cannot
show and which `sweep.screen.launch_cv` states (a relative standard deviation). A figure whose cell did not settle
carries a third, its instability: half the spread of its cell's sub-windows (over several launches, also half the
range of the launches' figures), which widens its band as a bound, not as noise. The selection (adaptive/selection.py)
compares these figures. See docs/adaptive.md.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from ddsweep import figures
from ddsweep.adaptive.stages import primary_workload, screen_settings, selected_regimes
from ddsweep.analysis.settings import regime_weights
from ddsweep.analysis.statistics import t_quantile
from ddsweep.figures import LOWER_IS_BETTER, METRICS, Metric, failed, whole_output_throughput


@dataclass
class ScreenedFigure:
    """One screened figure: its value and its relative standard errors within the launch and between launches
    (the second is shared by every figure of one launch); `df`, the degrees of freedom of the within-launch error
    (estimated from the requests; 0: taken as known); `instability`, how far on the log scale a figure whose cell
    did not settle may be off besides that noise (0 for a settled one)."""

    value: float
    within: float
    launch: float
    df: int = 0
    stable: bool | None = None  # whether every launch's cell settled (None: counted cells, not checked)
    instability: float = 0.0

    @property
    def rel_se(self) -> float:
        """The relative standard error of the figure."""
        return math.hypot(self.within, self.launch)

    def half_width(self, confidence: float) -> float:
        """Half the width of the figure's band on the log scale: the within-launch error at Student's t quantile
        (it is estimated from few requests), the between-launch error at the normal one (it is stated)."""
        z = two_sided_z(confidence)
        q = t_quantile(0.5 + confidence / 2, self.df) if self.df > 0 else z
        return math.hypot(q * self.within, z * self.launch)


def _metric(metric: str) -> Metric:
    """The definition of a regime's metric; one that screening cannot rank on is refused (as `ddsweep validate`
    refuses it in an adaptive study's config)."""
    found = METRICS.get(metric)
    if found is None or not found.screenable:
        raise ValueError(f"analysis.regimes: metric {metric!r} cannot rank screened points; use one of "
                         f"{', '.join(name for name, m in METRICS.items() if m.screenable)}")
    return found


def estimate(records: list[dict], metric: str, context: int, concurrency: int, launch_cv: float,
             workload: str | None = None, stability: tuple[int, float] | None = None) -> ScreenedFigure | None:
    """The screened figure of one regime cell (of `workload`, when records name one) with its relative standard
    error, or None when not measured. Every figure is ddsweep.figures'; throughput is over the whole cell, the
    figure whose within-launch error `_wall_rel_se` models (the decisions take the steady-state window). With
    `stability` (sub-windows, tolerance: a windowed benchmark) the figure says whether the cell settled, recomputed
    from its records as the benchmark records it."""
    definition = _metric(metric)
    measured = [r for r in records if r.get("context") == context and r.get("concurrency") == concurrency
                and not r.get("warmup") and (workload is None or r.get("workload") in (None, workload))]
    cell = [r for r in measured if not failed(r)]
    stable, instability = (settling(measured, *stability) if stability and measured and definition.windowed
                           else (None, 0.0))
    if metric == "output_throughput_tok_s":
        value = whole_output_throughput(measured)
        if value is None or value <= 0:
            return None
        return ScreenedFigure(value, _wall_rel_se(cell, concurrency), launch_cv, max(0, len(cell) - 1), stable,
                              instability)
    value = definition.cell(measured)
    if value is None or value <= 0:
        return None
    per_request = [v for r in cell if (v := definition.per_request(r)) is not None] if definition.per_request else []
    within = 0.0
    if len(per_request) > 1 and statistics.fmean(per_request) > 0:
        within = statistics.stdev(per_request) / statistics.fmean(per_request) / math.sqrt(len(per_request))
    return ScreenedFigure(value, within, launch_cv, max(0, len(per_request) - 1), stable, instability)


def settling(records: list[dict], parts: int, tolerance: float) -> tuple[bool, float]:
    """Whether a cell settled (its sub-windows agreeing within `tolerance`, as the benchmark records it) and, when
    not, its instability: log(1 + half the sub-windows' spread), the spread taken as at least `tolerance` (a cell
    without a window to cut has none to show). The figure is the window's mean; where the window drifts, the speed
    it would settle at lies towards one end of the sub-windows, about half their spread from the mean."""
    check = figures.stability(records, parts, tolerance)
    if check["stable"]:
        return True, 0.0
    return False, math.log1p(max(check["spread"] or 0.0, tolerance) / 2)


@functools.cache
def _normal_max_moments(n: int) -> tuple[float, float]:
    """Mean and standard deviation of the largest of `n` standard normal draws: the moments of the density
    n·φ(x)·Φ(x)^(n−1), integrated numerically (Φ^(n−1) on the log scale, so a large `n` does not underflow)."""
    from scipy import integrate, special  # about a second of CPU to import: only a throughput cell's screening needs it

    def density(x: float) -> float:
        return n * math.exp(-x * x / 2 + (n - 1) * special.log_ndtr(x)) / math.sqrt(2 * math.pi)

    mean = integrate.quad(lambda x: x * density(x), -math.inf, math.inf)[0]
    second = integrate.quad(lambda x: x * x * density(x), -math.inf, math.inf)[0]
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


def combine(estimates: list[ScreenedFigure]) -> ScreenedFigure | None:
    """One figure from several launches of a point: the geometric mean of the launches' figures; its within-launch
    error is the launches' errors pooled, and the between-launch error shrinks with the square root of the number
    of launches. When a launch's cell did not settle, the instability is the launches' mean instability (a bound
    on the mean's bias) or half the range of the launches' figures on the log scale, whichever is larger."""
    if not estimates:
        return None
    n = len(estimates)
    logs = [math.log(e.value) for e in estimates]
    value = math.exp(statistics.fmean(logs))
    within = math.sqrt(sum(e.within ** 2 for e in estimates)) / n
    stable = all_stable([e.stable for e in estimates])
    instability = (max(statistics.fmean(e.instability for e in estimates), (max(logs) - min(logs)) / 2)
                   if stable is False else 0.0)
    return ScreenedFigure(value, within, estimates[0].launch / math.sqrt(n), sum(e.df for e in estimates), stable,
                          instability)


def all_stable(flags: list[bool | None]) -> bool | None:
    """False when any cell did not settle, True when all were checked and settled, None when none was checked."""
    if any(f is False for f in flags):
        return False
    return True if any(f for f in flags) else None


def window_check(config: dict) -> tuple[int, float] | None:
    """(sub-windows, tolerance) of the benchmark's stability rule when its cells are windowed, else None."""
    bench = config.get("benchmark", {})
    if not bench.get("min_window_s"):
        return None
    return (int(bench.get("stability_subwindows", figures.STABILITY_SUBWINDOWS)),
            float(bench.get("stability_tolerance", figures.STABILITY_TOLERANCE)))


def regime_scores(config: dict, launches: dict[str, list[list[dict]]]) -> dict[str, dict[str, ScreenedFigure]]:
    """Per selected regime (`selected_regimes`), each point's figure over its launches (higher is better:
    lower-is-better metrics inverted)."""
    launch_cv, check = screen_settings(config)["launch_cv"], window_check(config)
    out: dict[str, dict[str, ScreenedFigure]] = {}
    for regime in selected_regimes(config):
        metric, scores = regime["metric"], {}
        for pid, runs in launches.items():
            est = combine([e for records in runs
                           if (e := estimate(records, metric, regime["context"], regime["concurrency"], launch_cv,
                                             primary_workload(config), check)) is not None])
            if est is not None:
                value = 1.0 / est.value if metric in LOWER_IS_BETTER else est.value
                scores[pid] = ScreenedFigure(value, est.within, est.launch, est.df, est.stable, est.instability)
        out[regime["name"]] = scores
    return out


def priority_scores(config: dict, per_regime: dict[str, dict[str, ScreenedFigure]]
                    ) -> dict[str, dict[str, ScreenedFigure]]:
    """Per priority, each point's weighted geometric mean of its regime figures relative to each regime's best,
    the summary's priority score (docs/statistics.md), for the points measured in every regime the priority weighs.
    On the log scale the errors add with the weights; the launch's part is one factor shared by every regime, and
    the instabilities, bounds, add with the weights too."""
    out = {}
    for name, spec in config.get("analysis", {}).get("priorities", {}).items():
        used = {r: w for r, w in regime_weights(spec).items() if w > 0 and per_regime.get(r)}
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
            scores[pid] = ScreenedFigure(value, within, launch, min(e.df for _, e, _ in parts),
                                         all_stable([e.stable for _, e, _ in parts]),
                                         sum(f * e.instability for f, e, _ in parts))
        out[name] = scores
    return out


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


def two_sided_z(confidence: float) -> float:
    """The two-sided normal quantile of `confidence`."""
    from scipy import special  # imported when first needed: the workflow loads this module at every invocation

    return float(special.ndtri(0.5 + confidence / 2))
