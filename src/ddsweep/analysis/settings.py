"""The study settings the analysis uses (regimes, priorities, statistical levels, the drafter's trained block
size, the reproduce command), read from the study config with defaults filled in."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddsweep.figures import LOWER_IS_BETTER


@dataclass(frozen=True)
class Regime:
    """A decision regime: one metric at one (context, concurrency) cell."""

    name: str
    metric: str
    context: int
    concurrency: int

    @property
    def lower_is_better(self) -> bool:
        """True for latency-like metrics where a smaller figure wins."""
        return self.metric in LOWER_IS_BETTER

    def describe(self) -> str:
        """Human-readable definition of the regime as configured."""
        return f"{self.metric} at context {self.context}, C={self.concurrency}"


DEFAULT_REGIMES: tuple[Regime, ...] = (
    Regime("latency", "decode_tok_s", 128, 1),
    Regime("long_context", "decode_tok_s", 4096, 1),
    Regime("throughput", "output_throughput_tok_s", 128, 32),
    Regime("max_acceptance", "acceptance_length", 128, 1),
)
DEFAULT_PRIORITIES: dict[str, dict[str, Any]] = {
    "latency_first": {"latency": 1.0},
    "throughput_first": {"throughput": 1.0},
    "balanced": {"latency": 0.5, "throughput": 0.5},
}
PRIORITY_KEYS = ("slo", "slo_cell")


@dataclass
class Priority:
    """A declared priority: weights over regimes, optional service-level limits and the cell they apply at."""

    name: str
    weights: dict[str, float]
    slo: dict[str, float] = field(default_factory=dict)
    slo_cell: tuple[int, int] | None = None


@dataclass
class Settings:
    """The parts of the study config the analysis uses, with defaults filled in."""

    study: str
    regimes: list[Regime]
    priorities: list[Priority]
    spread_warning: float
    trained_block_size: int | None
    trained_block_size_source: str
    reproduce_command: str
    confidence: float = 0.95
    equivalence_margin: float = 0.02
    min_repeats: int = 3
    diagnosis_gain: float = 0.10
    config: dict[str, Any] | None = None
    config_path: Path | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any] | None, config_path: Path | None = None) -> Settings:
        """Read study name, regimes, priorities, statistical settings, drafter block size, reproduce command."""
        config = config or {}
        analysis = config.get("analysis") or {}
        regimes = [Regime(str(r["name"]), str(r["metric"]), int(r["context"]), int(r["concurrency"]))
                   for r in analysis.get("regimes") or []] or list(DEFAULT_REGIMES)
        priorities = [_priority(str(k), v or {})
                      for k, v in (analysis.get("priorities") or DEFAULT_PRIORITIES).items()]
        trained, source = _trained_block_size(config.get("drafter") or {})
        shown_path = str(config_path) if config_path else "<path to the study config>"
        command = config.get("reproduce_command") or f"snakemake --cores all --configfile {shown_path}"
        return cls(
            study=str(config.get("study") or "study"), regimes=regimes, priorities=priorities,
            spread_warning=float(analysis.get("spread_warning", 0.10)), trained_block_size=trained,
            trained_block_size_source=source, reproduce_command=command,
            confidence=float(analysis.get("confidence", 0.95)),
            equivalence_margin=float(analysis.get("equivalence_margin", 0.02)),
            min_repeats=int(analysis.get("min_repeats_for_decision", 3)),
            diagnosis_gain=float(analysis.get("diagnosis_gain", 0.10)), config=config or None,
            config_path=config_path,
        )


def regime_weights(spec: dict[str, Any]) -> dict[str, float]:
    """A priority's regime weights from its config mapping (without its `slo` and `slo_cell` keys)."""
    return {str(r): float(w) for r, w in spec.items() if r not in PRIORITY_KEYS}


def _priority(name: str, spec: dict[str, Any]) -> Priority:
    """One priority from its config mapping: regime weights plus the optional `slo` and `slo_cell` keys."""
    weights = regime_weights(spec)
    cell = spec.get("slo_cell")
    return Priority(name, weights, {str(k): float(v) for k, v in (spec.get("slo") or {}).items()},
                    (int(cell["context"]), int(cell["concurrency"])) if cell else None)


def _trained_block_size(drafter: dict[str, Any]) -> tuple[int | None, str]:
    """The drafter's trained block size from the config, else from its model's config.json, else unknown."""
    if drafter.get("trained_block_size"):
        return int(drafter["trained_block_size"]), "drafter.trained_block_size in the study config"
    model_path = drafter.get("model_path")
    if model_path:
        path = Path(model_path) / "config.json"
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get("block_size")
        except (OSError, ValueError, AttributeError):
            value = None
        if isinstance(value, int) and value > 0:
            return value, f"block_size in {path}"
    return None, "unknown (set drafter.trained_block_size in the config)"
