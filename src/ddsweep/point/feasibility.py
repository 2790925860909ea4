"""Benchmark cells a point cannot measure: a context no prompt of a workload can be sized to (shorter than its
shortest prompt as the server's tokenizer counts it, or longer than its padding allows).

Found against the running server's `/tokenize` before the benchmark starts; those (workload, context) cells are
recorded as infeasible (status.json `infeasible_cells`) and the rest of the matrix is measured."""

from __future__ import annotations

import dataclasses
from typing import Any

from ddsweep.bench.cells import BenchmarkError, BenchSettings, TokenizeClient, TokenizeError
from ddsweep.bench.workloads import PromptBuilder, Workload, WorkloadError


def infeasible_cells(url: str, settings: BenchSettings) -> list[dict[str, Any]]:
    """Each (workload, context) of the matrix whose first prompt cannot be built, with the builder's reason."""
    tokenizer = TokenizeClient(url)
    found = []
    try:
        for entry in settings.workloads:
            workload = Workload.from_config(entry)
            builder = PromptBuilder(workload, tokenizer, settings.seed)
            for context in workload.contexts or settings.contexts:
                try:
                    builder.build(context, 0)
                except WorkloadError as exc:
                    found.append({"workload": workload.name, "context": context, "reason": str(exc)})
    except (TokenizeError, KeyError) as exc:
        raise BenchmarkError(f"could not count prompt tokens with {url}/tokenize while checking which contexts "
                             f"the workloads can build: {type(exc).__name__}: {exc}") from exc
    except WorkloadError as exc:
        raise BenchmarkError(str(exc)) from exc
    finally:
        tokenizer.close()
    return found


def without_cells(settings: BenchSettings, infeasible: list[dict[str, Any]]) -> BenchSettings | None:
    """`settings` without the infeasible (workload, context) cells; None when no cell is left."""
    if not infeasible:
        return settings
    drop = {(cell["workload"], cell["context"]) for cell in infeasible}
    workloads = []
    for entry in settings.workloads:
        workload = Workload.from_config(entry)
        contexts = [c for c in workload.contexts or settings.contexts if (workload.name, c) not in drop]
        if contexts:
            workloads.append({**entry, "contexts": contexts})
    return dataclasses.replace(settings, workloads=workloads) if workloads else None


def describe(infeasible: list[dict[str, Any]]) -> str:
    """The infeasible cells in one line: `chat ctx=128 (no prompt can be sized ...)`."""
    return "; ".join(f"{c['workload']} ctx={c['context']} ({c['reason']})" for c in infeasible)
