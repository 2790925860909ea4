"""The decision object: the study's whole outcome, computed once (ddsweep.findings.summary) and rendered by
every report (the Markdown summary and its first screen, `ddsweep summarize --from`, the bundle, `ddsweep
compare`). `reports/summary.json` is exactly its JSON form (docs/results-schema.md), so a report rendered from
that file equals one rendered from the analysis.

Types only: the report imports this module and nothing else from the analysis. The decision (picks, ties, gains
with their intervals, launch commands, failures by cause), regimes, priorities, Pareto set and diagnosis are
records; figures are JSON-shaped estimates (`{value, ci_low, ci_high, n, level}`), and the load levels, caveats
and sections generic blocks (`{kind, title, text, table, items, code, code2, text_after}`, plus what a kind
carries), so they read the same from memory and from the file.
"""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

Json = dict[str, Any]


class SchemaError(ValueError):
    """A summary.json this version cannot read (another schema version, or a part missing)."""


class Record:
    """A part of the decision object with a JSON form: its fields as keys, in field order, records within
    records converted both ways."""

    def to_json(self) -> Json:
        """The JSON form, keys in field order."""
        return {f.name: Record.plain(getattr(self, f.name)) for f in fields(self)}

    @staticmethod
    def plain(value: Any) -> Any:
        """A value with every record in it replaced by its JSON form."""
        if isinstance(value, Record):
            return value.to_json()
        if isinstance(value, list):
            return [Record.plain(v) for v in value]
        if isinstance(value, dict):
            return {k: Record.plain(v) for k, v in value.items()}
        return value

    @classmethod
    def from_json(cls, data: Json) -> Record:
        """Read the JSON form back; SchemaError when a key without a default is missing."""
        if not isinstance(data, dict):
            raise SchemaError(f"{cls.__name__}: expected an object, found {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        values = {}
        for f in fields(cls):
            if f.name in data:
                values[f.name] = Record.typed(hints[f.name], data[f.name])
            elif f.default is MISSING and f.default_factory is MISSING:
                raise SchemaError(f"{cls.__name__} lacks `{f.name}`")
        return cls(**values)

    @staticmethod
    def typed(hint: Any, value: Any) -> Any:
        """A JSON value as the type `hint` names: records built, lists and dicts of records converted."""
        if value is None:
            return None
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            return Record.typed(next(a for a in args if a is not type(None)), value)
        if isinstance(hint, type) and issubclass(hint, Record) and is_dataclass(hint):
            return hint.from_json(value)
        if origin is list:
            return [Record.typed(args[0], v) for v in value]
        if origin is dict and len(args) == 2:
            return {k: Record.typed(args[1], v) for k, v in value.items()}
        return value


@dataclass
class Cost(Record):
    """What a point costs to serve, the tie-break among equivalent points (docs/statistics.md)."""

    verify_width: int | None
    block_size: int | None
    source: str | None


@dataclass
class Launch(Record):
    """A point's server launch as its preset rendered it, without the job's port (`removed`)."""

    argv: list[str]
    env: dict[str, str]
    shell: str
    source: str
    removed: list[str]


@dataclass
class Gain(Record):
    """The recommended point in a regime its priority weighs: its figure, and its ratios over `ar` and over the
    best DFlash chain of that regime (> 1: the recommended point is better)."""

    regime: str
    weight: float
    metric: str
    cell_text: str
    figure: Json | None
    vs_ar: Json | None
    chain: str | None
    vs_chain: Json | None


@dataclass
class GiveUp(Record):
    """The recommended point against the leader of a regime its priority does not weigh."""

    regime: str
    best: str
    is_best: bool
    ratio: Json | None


@dataclass
class Recommendation(Record):
    """One priority's decision: firm, tied, undecided or none; the point to deploy and why, its gains and what it
    gives up, its launch command. The details from `label` on are present only with a recommended point."""

    DETAILS: ClassVar[tuple[str, ...]] = ("label", "kind", "preset", "knobs", "cost", "gains", "gives_up",
                                          "launch")

    priority: str
    weights: dict[str, float]
    status: str
    leader: str | None
    tied_set: list[str]
    recommended: str | None
    no_decision: str | None
    rule: str | None
    label: str | None = None
    kind: str | None = None
    preset: str | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    cost: Cost | None = None
    gains: list[Gain] = field(default_factory=list)
    gives_up: list[GiveUp] = field(default_factory=list)
    launch: Launch | None = None

    def to_json(self) -> Json:
        """The JSON form; without a recommended point, only the decision's status and its reason."""
        out = super().to_json()
        return out if self.recommended is not None else {k: v for k, v in out.items() if k not in self.DETAILS}


@dataclass
class DecisionCaveat(Record):
    """A caveat that would change the decision (simulated data, lost points, unstable cells, ...)."""

    kind: str
    text: str


@dataclass
class FailureGroup(Record):
    """Points that failed with one cause, those not started because of it, and the builds whose canary it was."""

    error_kind: str | None
    cause: str
    failure_class: str | None
    failed: list[str]
    not_started: list[str]
    canaries: dict[str, str]
    text: str


@dataclass
class Failures(Record):
    """The points that did not complete, grouped by cause, with what to do next; `alarm` when nothing was measured
    or more than half of the points were lost."""

    total: int
    measured: int
    lost: int
    not_started: int
    alarm: bool
    headline: str
    groups: list[FailureGroup]
    next: list[str]


@dataclass
class Decision(Record):
    """The first screen: per priority the point to deploy, the caveats that would change it, the load schedule
    when the best point changes with concurrency, and the failures by cause."""

    priorities: list[Recommendation]
    caveats: list[DecisionCaveat]
    more_caveats: int
    schedule: list[list[Any]] | None
    schedule_context: int | None
    failures: Failures


@dataclass
class TiedPoint(Record):
    """A point the data cannot separate from a regime's leader: its figure and the leader's ratio over it."""

    point_id: str
    figure: Json | None
    leader_ratio: Json | None


@dataclass
class RegimeResult(Record):
    """One regime's decision: its cell, the leader (the winner when decided), its figure, the tied set, the point
    recommended and the speed-up over `ar`."""

    name: str
    metric: str
    lower_is_better: bool
    cell: Json | None
    cell_text: str
    cell_note: str | None
    leader: str | None
    winner: str | None
    decided: bool
    no_decision: str | None
    figure: Json | None
    recommended: str | None
    tied: list[TiedPoint]
    speedup_vs_ar: Json | None
    speedup_vs_ar_text: str | None


@dataclass
class RunnerUp(Record):
    """The point next to a priority's pick, with the pick's ratio over it and its score."""

    point_id: str
    pick_ratio: Json | None
    score: float | None


@dataclass
class SloCheck(Record):
    """One service-level limit at one point: meets (the interval's upper bound within it), fails or uncertain."""

    limit: str
    bound: float | None
    status: str
    estimate: Json | None


@dataclass
class SloPoint(Record):
    """A point against every limit of a priority, with its throughput and goodput."""

    meets_all: bool
    checks: list[SloCheck]
    requests_per_s: Json | None
    goodput_requests_per_s: Json | None


@dataclass
class Slo(Record):
    """A priority's service-level limits at their cell, every point's checks, and who does not meet each limit."""

    limits: dict[str, float]
    cell: Json | None
    points: dict[str, SloPoint]
    not_meeting: dict[str, list[str]]


@dataclass
class PriorityResult(Record):
    """One priority's scoring: the leader (`pick`), its score, the tied set, the point recommended, the runner-up,
    the trade-offs between recommended points and the service-level limits."""

    name: str
    weights: dict[str, float]
    pick: str | None
    decided: bool
    score: float | None
    recommended: str | None
    tied: list[str]
    no_decision: str | None
    unknown_regimes: list[str]
    runner_up: RunnerUp | None
    tradeoffs: list[str]
    slo: Slo | None


@dataclass
class PointCounts(Record):
    """How many points the study has, by status."""

    total: int
    by_status: dict[str, int]


@dataclass
class Statistics(Record):
    """How the figures and decisions were computed (docs/statistics.md)."""

    method: str
    confidence: float
    equivalence_margin: float
    min_repeats_for_decision: int
    diagnosis_gain: float
    data_source: list[str]


@dataclass
class ParetoAxis(Record):
    """One axis of the Pareto set: a regime's metric at its cell."""

    metric: str
    cell_text: str


@dataclass
class ParetoAxes(Record):
    """The latency and throughput axes of the Pareto set."""

    latency: ParetoAxis
    throughput: ParetoAxis


@dataclass
class ParetoRow(Record):
    """A point of the Pareto set with its figure on each axis."""

    point_id: str
    latency: Json | None
    throughput: Json | None


@dataclass
class Pareto(Record):
    """The points no other dominates with confidence, and who dominates each other point; no axes when the
    latency or throughput regime is missing."""

    axes: ParetoAxes | None
    set: list[ParetoRow]
    dominated: dict[str, str]


@dataclass
class Series(Record):
    """Acceptance along one knob with the others fixed: the gain from the lowest to the highest value."""

    fixed: str
    values: list[Any]
    acceptance: list[float]
    point_ids: list[str]
    gain: Json | None
    gain_text: str
    top_step: Json | None
    top_step_text: str
    flat: list[str]


@dataclass
class BlockPair(Record):
    """Two points that differ in block size only, with the acceptance gain between them."""

    low: str
    high: str
    low_block_size: int
    high_block_size: int
    fixed: str
    straddles_trained: bool
    gain: Json | None
    gain_text: str


@dataclass
class Diagnosis(Record):
    """The acceptance verdict (drafter-bound, budget-bound, inconclusive) with its evidence."""

    cell_text: str
    verdict: str
    text: str
    threshold: float
    series: dict[str, list[Series]]
    block_pairs: list[BlockPair]
    trained_block_size: int | None
    trained_block_size_source: str | None


@dataclass
class Outcome(Record):
    """Everything a report shows of a study: the decision, regimes, priorities, load levels, Pareto set,
    diagnosis, caveats (failed points among them) and reference sections (chain comparison, platform, how to
    reproduce, every point, the adaptive funnel, the full coding eval)."""

    VERSION: ClassVar[int] = 3

    schema_version: int
    study: str
    note: str | None
    simulated: bool
    results_dir: str
    decision: Decision
    points: PointCounts
    statistics: Statistics
    metrics: dict[str, str]  # the regimes' metrics and their labels
    regimes: list[RegimeResult]
    load_levels: Json  # a generic block: the best point per concurrency, with the schedule
    priorities: list[PriorityResult]
    pareto: Pareto
    diagnosis: Diagnosis
    caveats: list[Json]  # generic blocks: every limit on the conclusions found in the data
    sections: list[Json]  # generic blocks: chain comparison, platform, reproduce, all points, funnel, full coding

    @classmethod
    def from_json(cls, data: Json) -> Outcome:
        """Read summary.json back; SchemaError when it is another schema version or lacks a part."""
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != cls.VERSION:
            raise SchemaError(f"summary.json schema_version {version!r}; this version reads {cls.VERSION} "
                              "(run `ddsweep summarize` on the results again)")
        return super().from_json(data)
