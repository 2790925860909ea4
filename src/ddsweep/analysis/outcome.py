"""The decision object: the study's whole outcome, computed once by the analysis (ddsweep.findings.summary) and
rendered by every report (the Markdown summary and its first screen, the HTML report, the bundle, `ddsweep
compare`). `reports/summary.json` is exactly its JSON form (docs/results-schema.md), so a report rendered from
that file equals one rendered from the analysis (`ddsweep summarize --from`).

Types only: the report imports this module and nothing else from the analysis. The parts are JSON-shaped
(figures as `{value, ci_low, ci_high, n, level}`, caveats and sections as generic blocks `{kind, title, text,
table, items, code, code2, text_after}`), so they read the same from memory and from the file.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

SCHEMA_VERSION = 3

Json = dict[str, Any]


class SchemaError(ValueError):
    """A summary.json this version cannot read (another schema version, or a key missing)."""


@dataclass
class Outcome:
    """Everything a report shows of a study: picks with intervals and ties, regimes, load levels, Pareto set,
    diagnosis, caveats (failures grouped by cause among them) and reference sections (launch commands, platform,
    every point, the adaptive funnel)."""

    schema_version: int
    study: str
    note: str | None
    simulated: bool
    results_dir: str
    decision: Json  # the first screen: per priority the point to deploy, its gains, launch; failures by cause
    points: Json  # {total, by_status}
    statistics: Json  # method, confidence, equivalence margin, minimum repeats, data source
    metrics: dict[str, str]  # the regimes' metrics and their labels
    regimes: list[Json]  # per regime: cell, leader or winner, figure, tied set, speed-up over `ar`
    load_levels: Json  # a generic block: the best point per concurrency, with the schedule
    priorities: list[Json]  # per priority: pick, score, tied set, runner-up, limits, trade-offs
    pareto: Json  # the latency–throughput Pareto set and who dominates whom
    diagnosis: Json  # the acceptance verdict with its matched series
    caveats: list[Json]  # generic blocks: every limit on the conclusions found in the data
    sections: list[Json]  # generic blocks: chain comparison, platform, reproduce, all points, funnel, full coding

    def to_json(self) -> Json:
        """The JSON form (summary.json), keys in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, doc: Json) -> Outcome:
        """Read the JSON form back; SchemaError when it is another schema version or lacks a part."""
        version = doc.get("schema_version") if isinstance(doc, dict) else None
        if version != SCHEMA_VERSION:
            raise SchemaError(f"summary.json schema_version {version!r}; this version reads {SCHEMA_VERSION} "
                              "(run `ddsweep summarize` on the results again)")
        missing = [f.name for f in fields(cls) if f.name not in doc]
        if missing:
            raise SchemaError(f"summary.json lacks {', '.join(missing)}")
        return cls(**{f.name: doc[f.name] for f in fields(cls)})
