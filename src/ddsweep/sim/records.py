"""The stand-in's records: its settings and injected faults, and one generation in flight in its scheduler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddsweep.sim.contract import Contract
from ddsweep.sim.model import AcceptanceSampler, Knobs, ModelParams

EOS_TOKEN_ID = 151645


@dataclass(frozen=True)
class Fault:
    """One injected fault: its kind and optional argument (a count, a fraction, seconds or a knob name)."""

    kind: str
    arg: str | None = None


@dataclass
class SimSettings:
    """Everything the stand-in needs to run: address, applied knobs, model parameters, faults."""

    host: str
    port: int
    model_path: str
    served_model_name: str
    knobs: Knobs
    params: ModelParams
    seed: int = 0
    startup_delay_s: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    server_args: dict[str, Any] = field(default_factory=dict)
    strict: bool = False
    contract: Contract = field(default_factory=lambda: Contract(False, "built without a contract"))
    launch_command: str = ""
    prompt_log: str | None = None

    def fault(self, kind: str) -> Fault | None:
        """The first fault of `kind`, if injected."""
        return next((f for f in self.faults if f.kind == kind), None)


@dataclass
class GenRequest:
    """One generation in flight in the scheduler."""

    rid: str
    prompt: str
    prompt_tokens: int
    pieces: list[str]
    finish_type: str
    max_new_tokens: int
    sampler: AcceptanceSampler
    on_step: Callable[[GenRequest, str], None]
    on_done: Callable[[GenRequest], None]
    record: bool = True
    arrival_ts: float = 0.0
    first_token_ts: float | None = None
    last_token_ts: float | None = None
    completion_tokens: int = 0
    verify_ct: int = 0
    correct_drafts: list[int] = field(default_factory=list)  # per verify step, for the histogram
    text: str = ""
    text_json: bytes = b""
    cancelled: bool = False
    cut_at: int | None = None
    abort_at: int | None = None
    malformed_at: int | None = None
    cached_tokens: int = 0
    steps: int = 0

    @property
    def done(self) -> bool:
        """Whether every output token has been produced."""
        return self.completion_tokens >= len(self.pieces)

    def finish_reason(self) -> dict | None:
        """SGLang's finish_reason object, or None while running."""
        if not self.done:
            return None
        if self.finish_type == "length":
            return {"type": "length", "length": self.max_new_tokens}
        return {"type": "stop", "matched": EOS_TOKEN_ID}
