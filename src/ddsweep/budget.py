"""An invocation's time budget: no point job starts that its estimate says will not finish in the time left.

The workflow fixes the deadline when it starts (`budget_s` seconds from then, and no later than the end of the
Slurm allocation it runs in) and passes it, with the estimate of one point job, to every point job through
DDSWEEP_TIME_BUDGET; a job, as it starts, takes instead the median of the study's jobs of its kind finished by
then, when there are some. A job that would not fit records itself as not started (`error_kind: time_budget`,
persisted): the summary names it, and the next invocation drops the record and runs it."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from ddsweep.config.launches import grid_launches
from ddsweep.config.plan import estimate_minutes

ENV = "DDSWEEP_TIME_BUDGET"
KIND = "time_budget"


@dataclass(frozen=True)
class TimeBudget:
    """The deadline of an invocation (Unix time), what set it, and the seconds one point job is expected to take."""

    deadline: float
    job_estimate_s: float
    source: str

    def left_s(self, now: float | None = None) -> float:
        """Seconds left before the deadline."""
        return self.deadline - (time.time() if now is None else now)

    def refusal(self, now: float | None = None, observed: Iterable[float] = ()) -> str | None:
        """Why a job starting now would not fit, or None when it fits. The estimate is the median of the study's jobs
        finished by now (`observed`) when there are some, else the one the invocation started with: the jobs that
        ended since the invocation began show the machine's pace better than the configured estimate."""
        seen = list(observed)
        estimate = statistics.median(seen) if seen else self.job_estimate_s
        left = self.left_s(now)
        if estimate <= left:
            return None
        basis = f", the median of the study's {len(seen)} finished job(s)" if seen else ""
        return (f"not started: its estimate ({estimate:.0f} s{basis}) does not fit the {max(left, 0):.0f} s left "
                f"of {self.source}")

    def to_env(self) -> str:
        """The JSON the workflow exports in DDSWEEP_TIME_BUDGET."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls, text: str | None) -> TimeBudget | None:
        """The budget a point job was given, or None (no budget, or an empty variable)."""
        if not text:
            return None
        return cls(**json.loads(text))


# The status records of the jobs that measure a point in full (a point, a grid launch, a confirmation launch), and
# of the adaptive study's short screening jobs: each kind's estimate comes from its own kind.
FULL_JOBS = ("points/*/status.json", "launches/*/launch-*/status.json", "confirm/*/launch-*/status.json")
SCREENING_JOBS = ("screen/*/status.json",)


def observed_job_seconds(results_dir: Path, patterns: tuple[str, ...] = FULL_JOBS) -> list[float]:
    """Wall times of the point jobs of this study that completed (status.json `duration_s`), for the estimate. A
    point merged from its launches (launches.json beside it) is not one job: its duration is their sum."""
    found = []
    for pattern in patterns:
        for path in sorted(Path(results_dir).glob(pattern)):
            if (path.parent / "launches.json").exists():
                continue
            try:
                duration = json.loads(path.read_text(encoding="utf-8")).get("duration_s")
            except (OSError, ValueError):
                continue
            if isinstance(duration, (int, float)) and duration > 0:
                found.append(float(duration))
    return found


def job_estimate_s(config: dict, observed: Iterable[float] = ()) -> float:
    """Seconds one point job is expected to take: the median of this study's completed jobs when it has some (the
    machine's own pace), else `resources.estimate` for one launch (docs: config/README.md, `budget_s`)."""
    seen = list(observed)
    if seen:
        return statistics.median(seen)
    return estimate_minutes(config, 1)["per_point_min"] * 60 / grid_launches(config)


def make_budget(config: dict, results_dir: Path, started: float, slurm_left_s: float | None) -> TimeBudget | None:
    """The invocation's budget from `budget_s` and the Slurm allocation's time left, or None when neither is set.
    A point job in the allocation stops itself `resources.signal_lead_s` before its end, so that much of it is no
    time to measure in."""
    limits = []
    if config.get("budget_s"):
        limits.append((started + float(config["budget_s"]), f"the time budget (budget_s={config['budget_s']:g})"))
    if slurm_left_s is not None:
        lead = float((config.get("resources") or {}).get("signal_lead_s") or 0)
        limits.append((started + slurm_left_s - lead, f"the Slurm allocation's time left less the {lead:g} s a point "
                                                      "keeps to stop itself (resources.signal_lead_s)"))
    if not limits:
        return None
    deadline, source = min(limits)
    return TimeBudget(deadline, job_estimate_s(config, observed_job_seconds(results_dir)), source)


def observed_like(out_dir: Path) -> list[float]:
    """Wall times of the study's finished jobs of the kind of the job writing OUT_DIR (`<results>/points/<id>`,
    `<results>/screen/<id>`, `<results>/launches/<id>/launch-<k>`, `<results>/confirm/<id>/launch-<k>`): a
    screening job is compared with screening jobs, every other job with the jobs that measure a point in full."""
    results_dir = out_dir.parents[2] if out_dir.name.startswith("launch-") else out_dir.parents[1]
    return observed_job_seconds(results_dir, SCREENING_JOBS if out_dir.parent.name == "screen" else FULL_JOBS)


def not_started(results_dir: Path) -> list[str]:
    """The points this invocation did not start for lack of time (their done.json says `time_budget`)."""
    found = []
    for path in sorted(Path(results_dir).glob("points/*/done.json")) + sorted(
            Path(results_dir).glob("launches/*/launch-*/done.json")):
        try:
            done = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if done.get("error_kind") == KIND:
            found.append(path.parent.relative_to(results_dir).as_posix())
    return found


def resume_message(results_dir: Path, command: str) -> str | None:
    """The end-of-run lines when the time budget left jobs unstarted: which, and the command that resumes."""
    missing = not_started(results_dir)
    if not missing:
        return None
    return (f"ddsweep: {len(missing)} job(s) not started within the time budget: {', '.join(missing)}. "
            f"The summary covers what was measured. Resume the study with: {command}")
