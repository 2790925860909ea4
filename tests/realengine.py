"""The real-engine environment (.ci/sglang-real.sh VENV): its manifest, VENV/ddsweep-real-sglang.json, for the
virtualenv running the tests. Absent, the tests that need it skip with a reason, unless $DDSWEEP_REAL_SGLANG is
`require` (as .ci/run sets it): then they fail."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

MANIFEST = Path(sys.prefix) / "ddsweep-real-sglang.json"
REQUIRE_ENV = "DDSWEEP_REAL_SGLANG"


@dataclass(frozen=True)
class RealEngine:
    """The real SGLang environment: its Python, the tiny model, the server's environment and CPU flags."""

    python: str
    model_dir: str
    env: dict[str, str]
    server_args: list[str]


def real_engine() -> RealEngine:
    """The environment of this virtualenv's manifest; skip without one, fail when $DDSWEEP_REAL_SGLANG=require."""
    if not MANIFEST.is_file():
        reason = (f"the real SGLang environment is absent ({MANIFEST} does not exist; run "
                  f".ci/sglang-real.sh {sys.prefix})")
        if os.environ.get(REQUIRE_ENV) == "require":
            pytest.fail(f"{reason}, and ${REQUIRE_ENV}=require")
        pytest.skip(reason)
    doc = json.loads(MANIFEST.read_text(encoding="utf-8"))
    return RealEngine(python=doc["python"], model_dir=doc["model_dir"], env=dict(doc["env"]),
                      server_args=list(doc["server_args"]))
