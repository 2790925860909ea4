"""Benchmark cells a point cannot measure: a context no prompt of a workload can be sized to (shorter than its
shortest prompt as the server's tokenizer counts it, or longer than its padding allows).

Found against the running server's `/tokenize` before the benchmark starts (`bench.cells.infeasible_cells`);
those (workload, context) cells are recorded as infeasible (status.json `infeasible_cells`) and the rest of the
matrix is measured. `ddsweep plan` and the preflight find them before any server starts with the model
directory's tokenizer, where it loads. Nothing here needs the HTTP client: `ddsweep plan` runs in the analysis
environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddsweep.bench.workloads import PromptBuilder, TokenizeFn, Workload, WorkloadError


def unbuildable_cells(tokenize: TokenizeFn, bench: dict[str, Any]) -> list[dict[str, Any]]:
    """Each (workload, context) of the matrix (`benchmark`'s workloads, contexts and seed) whose first prompt cannot
    be built, with the builder's reason."""
    found = []
    for entry in bench["workloads"]:
        workload = Workload.from_config(entry)
        builder = PromptBuilder(workload, tokenize, bench["seed"])
        for context in workload.contexts or bench["contexts"]:
            try:
                builder.build(context, 0)
            except WorkloadError as exc:
                found.append({"workload": workload.name, "context": context, "reason": str(exc)})
    return found


def local_tokenizer(config: dict) -> tuple[TokenizeFn | None, str]:
    """A stand-in for the server's `/tokenize` on this host and what it is: the model directory's tokenizer through
    `transformers` (None, with the reason, for a simulated study or where it does not load)."""
    if config.get("simulated"):  # the stand-in counts tokens its own way: each point checks through /tokenize
        return None, "a simulated study's stand-in counts the tokens (each point checks through its /tokenize)"
    path = Path(str(config["target"]["model_path"]))
    if not path.is_dir():
        return None, f"target.model_path {str(path)!r} is not a directory on this host"
    try:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - any failure to load only means the check is not made here
        return None, f"its tokenizer does not load here ({type(exc).__name__}: {str(exc)[:200]})"

    def model(body: dict) -> list[int]:
        """SGLang's /tokenize: the chat template for `messages`, special tokens added to a `prompt`."""
        if body.get("messages") is not None:
            # rendered to text, then encoded as it stands (transformers 5 returns a dict, not ids, for tokenize=True)
            text = loaded.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
            return list(loaded(text, add_special_tokens=False)["input_ids"])
        return list(loaded(body["prompt"], add_special_tokens=True)["input_ids"])
    return model, f"the tokenizer of {path}"


def matrix_check(config: dict) -> tuple[list[dict[str, Any]], str]:
    """The study's unbuildable cells found on this host, and with which tokenizer (or why none was checked)."""
    tokenize, source = local_tokenizer(config)
    if tokenize is None:
        return [], f"benchmark contexts were not checked against the prompts' sizes: {source}"
    try:
        return unbuildable_cells(tokenize, config["benchmark"]), source
    except (WorkloadError, KeyError, ValueError, OSError) as exc:
        return [], f"benchmark contexts were not checked with {source}: {type(exc).__name__}: {exc}"


def describe(infeasible: list[dict[str, Any]]) -> str:
    """The infeasible cells in one line: `chat ctx=128 (no prompt can be sized ...)`."""
    return "; ".join(f"{c['workload']} ctx={c['context']} ({c['reason']})" for c in infeasible)


def matrix_report(cells: list[dict[str, Any]], source: str) -> str:
    """What `ddsweep plan` prints of `matrix_check`: the cells no point can measure, every cell measurable, or why
    the contexts were not checked."""
    if cells:
        return "\n".join([f"Benchmark cells no point can measure (checked with {source}); every point records them "
                          "as infeasible and measures the rest:"]
                         + [f"  {c['workload']} ctx={c['context']}: {c['reason']}" for c in cells])
    if source.startswith("benchmark contexts"):
        return f"Benchmark cells: {source}"
    return f"Benchmark cells: every workload's prompts can be sized to every context (checked with {source})."
