"""Benchmark cells a point cannot measure: a context no prompt of a workload can be sized to (shorter than its
shortest prompt as the server's tokenizer counts it, or longer than its padding allows), or one whose prompts and
new tokens do not fit the server's context length (SGLang refuses a request whose prompt tokens and
`max_new_tokens` add up to more than its context length).

Found against the running server's `/tokenize` and `/v1/models` before the benchmark starts
(`bench.cells.infeasible_cells`);
those (workload, context) cells are recorded as infeasible (status.json `infeasible_cells`) and the rest of the
matrix is measured. `ddsweep plan` and the preflight find them before any server starts with the model
directory's tokenizer, where it loads. Nothing here needs the HTTP client: `ddsweep plan` runs in the analysis
environment."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ddsweep.bench.workloads import TOLERANCE, PromptBuilder, TokenizeFn, Workload, WorkloadError
from ddsweep.config.study import context_length_flag


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


def over_context_cells(bench: dict[str, Any], context_length: int, source: str) -> list[dict[str, Any]]:
    """Each (workload, context) of the matrix whose prompts (sized to the context within the builder's tolerance)
    with the workload's new tokens may not fit `context_length` (as `source` gives it): SGLang would refuse them."""
    found = []
    for entry in bench["workloads"]:
        workload = Workload.from_config(entry)
        new_tokens = workload.max_new_tokens or bench["max_new_tokens"]
        for context in workload.contexts or bench["contexts"]:
            if math.floor(context * (1 + TOLERANCE)) + new_tokens > context_length:
                found.append({"workload": workload.name, "context": context,
                              "reason": f"prompts of about {context} tokens (within {TOLERANCE:.0%}) and {new_tokens} "
                                        f"new tokens may exceed the context length of {context_length} tokens "
                                        f"({source}); SGLang refuses such a request"})
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
    """The study's unmeasurable cells found on this host, and how they were checked (or why not): the prompts'
    sizes with the model directory's tokenizer, and where `target.server_args` sets `--context-length`, the fit."""
    length = context_length_flag([str(a) for a in config["target"].get("server_args") or []])
    flag = f"--context-length {length} in target.server_args"
    over = over_context_cells(config["benchmark"], length, flag) if length else []
    tokenize, source = local_tokenizer(config)
    try:
        built = unbuildable_cells(tokenize, config["benchmark"]) if tokenize is not None else []
    except (WorkloadError, KeyError, ValueError, OSError) as exc:
        tokenize, source = None, f"{source}: {type(exc).__name__}: {exc}"
    if tokenize is None and not over:
        return [], f"benchmark contexts were not checked against the prompts' sizes: {source}"
    if tokenize is None:  # each point checks the prompts' sizes through its server's /tokenize
        return over, flag
    seen = {(c["workload"], c["context"]) for c in built}
    cells = built + [c for c in over if (c["workload"], c["context"]) not in seen]
    return cells, f"{source} and {flag}" if over else source


def feasible_workloads(workloads: list[dict[str, Any]], contexts: list[int],
                       infeasible: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workload entries without the infeasible (workload, context) cells, each listing the contexts it keeps
    (`contexts`: the matrix's, for a workload without its own); a workload with none left is dropped."""
    drop = {(cell["workload"], cell["context"]) for cell in infeasible}
    kept = []
    for entry in workloads:
        workload = Workload.from_config(entry)
        left = [c for c in workload.contexts or contexts if (workload.name, c) not in drop]
        if left:
            kept.append({**entry, "contexts": left})
    return kept


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
