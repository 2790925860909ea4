"""Is a failed point a result of its configuration, or of the machine it ran on?

A configuration result (the server refused the flags, verification found a knob not applied, the engine's own
code raised an exception, a crash that happened again on retry) is recorded with `done.json` and never rerun.
An infrastructure failure (start-up timeout, out of memory, GPUs busy, NCCL, node or filesystem errors, lost
connection, an interruption from outside) is retried by Snakemake up to `resources.retries`; on the last attempt
it is recorded as the point's result of this invocation (`done.json` with `persisted: true`), so that the
summary is written; the next invocation drops that record at its start and runs the point again
(`drop_persisted_records`). The evidence, in order: the
server-log patterns of the point's `failure_patterns` (engine defaults and the preset's own); a Python
traceback in the log of a server that died (or one SGLang reports as fatal, "Scheduler hit an exception")
whose exception is not the machine's; an exception saying the server could not load its software (a module, a
compiled library), the environment's on every attempt; a kind that happened again on retry; else infrastructure."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

CONFIGURATION = "configuration"
INFRASTRUCTURE = "infrastructure"
# Kinds that are a configuration result whatever the log says: the server answered, and not as asked; its
# argument parser refused the preset on the submit host (the preflight; no server started); no cell of the
# benchmark matrix can be built with the model's tokenizer.
ALWAYS_CONFIGURATION = frozenset({"verify", "preflight", "infeasible"})
WHY_CONFIGURATION = {"verify": "verify: the server ran and did not apply the configuration",
                     "preflight": "preflight: the installed server refused the preset's command",
                     "infeasible": "infeasible: no context of the matrix can be built with the model's tokenizer"}
# Kinds that never depend on the configuration: the machine, the filesystem, a signal from outside, a start-up
# that did not finish in time (a slow shared filesystem under many concurrent loads), busy GPUs.
ALWAYS_INFRASTRUCTURE = frozenset({"config", "io", "interrupted", "startup_timeout", "gpus_busy"})
# SGLang's refusals of a request that does not fit the model's context length (tokenizer_manager.py, 0.5.17 and
# 0.5.23): the prompt, the tokens asked and the context length are all the configuration's, so every attempt is
# refused alike.
CONTEXT_REFUSAL = re.compile(r"Requested token count exceeds the model's maximum context length of \d+ tokens"
                             r"|The input \(\d+ tokens\) is longer than the model's context length \(\d+ tokens\)")
# Kinds where the server process ended: a traceback in its log is what it died of.
SERVER_DIED = frozenset({"startup_exit", "server_crash"})
TRACEBACK = "Traceback (most recent call last):"
# SGLang's scheduler, detokenizer and tokenizer manager log a fatal exception as "<Part> hit an exception:
# Traceback ..." and then stop the whole server (managers/scheduler.py run_scheduler_process).
FATAL_MARKER = re.compile(r"hit an exception")
# Exceptions that are the machine's whoever raised them: memory, interconnect, device, filesystem, network, a
# missing package, a signal.
MACHINE_EXCEPTION = re.compile(
    r"OutOfMemoryError|[Oo]ut of memory|NCCL|RCCL|\bECC\b|CUDA error|CUDA-capable|HIP error|cudaError|"
    r"OSError|IOError|PermissionError|FileNotFoundError|Connection\w*Error|BrokenPipeError|TimeoutError|"
    r"ImportError|ModuleNotFoundError|No space left|Stale file handle|Input/output error|address already in use|"
    r"KeyboardInterrupt|CancelledError|SystemExit")
# Exceptions that say the server could not load its own software (a module, a compiled library): the environment's
# on every attempt, so never taken for a configuration result because it happened again on retry.
SOFTWARE_NOT_LOADED = re.compile(r"^(?:\w+\.)*(?:ImportError|ModuleNotFoundError)\b|"
                                 r"^(?:\w+\.)*OSError\b.*(?:\.so\b|shared object|[Ll]ibrary)")


@dataclass(frozen=True)
class Classification:
    """A failure's class and the sentence saying how it was decided."""

    failure_class: str
    why: str

    @property
    def is_result(self) -> bool:
        """Whether the failure is a result of the study (done.json, not rerun)."""
        return self.failure_class == CONFIGURATION


def matching_pattern(text: str, patterns: list[str]) -> str | None:
    """The first of `patterns` (regular expressions) found in `text`, if any."""
    return next((p for p in patterns if re.search(p, text, re.MULTILINE)), None)


@dataclass(frozen=True)
class EngineException:
    """One Python traceback of a server log: its exception line, innermost frame, and whether it was fatal."""

    line: str
    frame: str | None
    fatal: bool

    def describe(self) -> str:
        """`RuntimeError: ... (File "x.py", line 872, in f)`."""
        return self.line + (f" ({self.frame})" if self.frame else "")


def engine_exceptions(log_text: str) -> list[EngineException]:
    """Every Python traceback of a log, in order: the exception line that ends it and its innermost frame."""
    lines = log_text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if TRACEBACK not in line:
            continue
        fatal = bool(FATAL_MARKER.search(line) or (i and FATAL_MARKER.search(lines[i - 1])))
        frame = None
        for after in lines[i + 1:]:
            if after.startswith((" ", "\t")):
                frame = after.strip() if after.strip().startswith("File ") else frame
                continue
            if after.strip():
                found.append(EngineException(after.strip(), frame, fatal))
            break
    return found


def engine_failure(kind: str, log_text: str) -> EngineException | None:
    """The last exception the engine's own code raised, when it ended the server and is not the machine's."""
    candidates = [e for e in engine_exceptions(log_text) if e.fatal or kind in SERVER_DIED]
    if not candidates or MACHINE_EXCEPTION.search(candidates[-1].line):
        return None
    return candidates[-1]


def software_not_loaded(kind: str, log_text: str) -> EngineException | None:
    """The exception a server died of when it says that the server could not load its software."""
    candidates = [e for e in engine_exceptions(log_text) if e.fatal or kind in SERVER_DIED]
    return candidates[-1] if candidates and SOFTWARE_NOT_LOADED.search(candidates[-1].line) else None


def previous_failure(out_dir: Path) -> dict | None:
    """failure.json of the latest earlier attempt in OUT_DIR/attempts/, if that attempt failed."""
    attempts = sorted((Path(out_dir) / "attempts").glob("*/"), key=lambda p: p.name)
    if not attempts or not (attempts[-1] / "failure.json").exists():
        return None
    try:
        return json.loads((attempts[-1] / "failure.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def classify(kind: str, log_text: str, patterns: Mapping[str, list[str]], digest: str,
             previous: Mapping | None, error: str = "") -> Classification:
    """The class of a failure of `kind`, from the server log, the preset's patterns, the failure's own message
    (`error`: the answers its requests got) and the previous attempt."""
    if kind in ALWAYS_CONFIGURATION:
        return Classification(CONFIGURATION, WHY_CONFIGURATION[kind])
    if kind in ALWAYS_INFRASTRUCTURE:
        return Classification(INFRASTRUCTURE, f"{kind} does not depend on the point's configuration")
    found = matching_pattern(log_text, list(patterns.get("infrastructure") or []))
    if found:
        return Classification(INFRASTRUCTURE, f"the server log matches the preset's infrastructure pattern {found!r}")
    found = matching_pattern(log_text, list(patterns.get("configuration") or []))
    if found:
        return Classification(CONFIGURATION, f"the server log matches the preset's configuration pattern {found!r}")
    raised = engine_failure(kind, log_text)
    if raised:
        return Classification(CONFIGURATION, f"the engine's own code raised an exception: {raised.describe()}")
    missing = software_not_loaded(kind, log_text)
    if missing:
        return Classification(INFRASTRUCTURE, f"the server could not load its software: {missing.describe()}; the "
                              "environment's, whatever the configuration")
    refused = CONTEXT_REFUSAL.search(error)
    if refused:
        return Classification(CONFIGURATION, f"the server refused its requests as longer than its context length "
                              f"({refused.group(0)}): the configuration's context length and request sizes, the "
                              "same on every attempt")
    if previous and previous.get("error_kind") == kind and previous.get("record_sha256") == digest:
        return Classification(CONFIGURATION, f"{kind} happened again on retry (attempt "
                              f"{int(previous.get('attempt') or 1) + 1}): deterministic")
    return Classification(INFRASTRUCTURE, f"{kind} on its first occurrence: retried to tell a deterministic failure "
                          "from the machine's")


def read_record(path: Path) -> dict:
    """A job's record (done.json, failure.json) as a dict; {} when it is missing, unreadable or not an object."""
    try:
        done = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return done if isinstance(done, dict) else {}


def is_persisted(done: Mapping) -> bool:
    """Whether a done.json records an infrastructure failure that outlasted an invocation's retries."""
    return bool(done.get("persisted")) and done.get("status") == "failed"


# The stages whose records are launches of a point merged into results/points/<id>/done.json: Snakemake rebuilds
# no missing file whose consumers are up to date, so a dropped launch runs again only once that merged record,
# which the summary reads, is gone too.
MERGED_STAGES = frozenset({"launches", "confirm"})


def _consumers(results_dir: Path, stage: str, point_id: str) -> list[Path]:
    """The records built from a dropped record of `stage`, removed with it so that Snakemake runs it again. An
    adaptive study's screening records lead through its selections and race rounds (checkpoints) to the merged
    point records and the summary (workflow/rules/adaptive.smk): all of them go, so this invocation derives them
    again in order (the summary, a target, pulls the chain); no launch that already ran is repeated (launches take
    no input on the selections)."""
    if stage in MERGED_STAGES:
        return [results_dir / "points" / point_id / "done.json"]
    if stage == "screen":
        return [results_dir / "screen" / "round1.json", results_dir / "screen" / "selection.json",
                *sorted((results_dir / "confirm").glob("race-*.json")),
                *sorted((results_dir / "points").glob("*/done.json")), results_dir.parent / "reports" / "summary.json"]
    return []


def drop_persisted_records(results_dir: Path, point_ids: Collection[str], stages: Collection[str],
                           canaries: Collection[Path] = ()) -> list[str]:
    """Remove the done.json files under RESULTS_DIR/<stage>/ that record a persisted infrastructure failure of one
    of `point_ids` (with the records built from it: a launch's merged point record, a screening's selections), so
    that this invocation runs those jobs again; returns the removed records. When one of them is a canary's
    record (`canaries`: ddsweep.config.families.canary_records), the canaries' verdict goes too, with the summary
    that pulls it in again (workflow/rules/canary.smk): the build's other points wait for the canary again."""
    results_dir = Path(results_dir)
    if any(is_persisted(read_record(Path(c))) for c in canaries):
        (results_dir / "canary.json").unlink(missing_ok=True)
        (results_dir.parent / "reports" / "summary.json").unlink(missing_ok=True)
    dropped = []
    for stage in stages:
        for path in sorted((results_dir / stage).rglob("done.json")):
            if "attempts" in path.relative_to(results_dir).parts:
                continue
            done = read_record(path)
            if is_persisted(done) and done.get("point_id") in point_ids:
                path.unlink(missing_ok=True)
                dropped.append(path.as_posix())
                for consumer in _consumers(results_dir, stage, str(done["point_id"])):
                    consumer.unlink(missing_ok=True)
    return dropped


def note_reruns(path: Path, dropped: list[str]) -> None:
    """Rewrite the reruns file when records were dropped (or it is missing): an input of the summary, it makes
    Snakemake rebuild the summary and with it the dropped jobs (it rebuilds no missing file whose consumers are
    up to date)."""
    if dropped or not Path(path).exists():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"dropped": dropped, "time": time.time()}, indent=1) + "\n")
