"""The HumanEval coding eval against an OpenAI-compatible server, and the `ddsweep coding-eval` subcommand."""

from __future__ import annotations

import argparse
import sys
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ddsweep.coding.errors import stream_error
from ddsweep.coding.extraction import extract_code
from ddsweep.coding.humaneval import Problem, instruction, select_problems
from ddsweep.coding.lossless import compare_outputs
from ddsweep.coding.sandbox import ISOLATION_CHOICES, IsolationError, Sandbox
from ddsweep.config.defaults import schema_default
from ddsweep.console import ProgressLine
from ddsweep.storage import write_json_atomic, write_jsonl_atomic


@dataclass
class CodingSettings:
    """What to evaluate and how: problem subset, token limits, concurrency and time limits."""

    limit: int | None = schema_default("coding_eval.limit")
    task_ids: list[str] | None = schema_default("coding_eval.task_ids")
    max_tokens: int = schema_default("coding_eval.max_tokens")
    retry_truncated_max_tokens: int | None = schema_default("coding_eval.retry_truncated_max_tokens")
    concurrency: int = schema_default("coding_eval.concurrency")
    request_timeout_s: float = schema_default("coding_eval.request_timeout_s")
    exec_timeout_s: float = schema_default("coding_eval.exec_timeout_s")
    model: str | None = None
    max_request_failure_fraction: float = schema_default("coding_eval.max_request_failure_fraction")
    isolation: str = schema_default("coding_eval.isolation")
    require_isolation: bool = schema_default("coding_eval.require_isolation")
    repeat_answers: bool = False  # set by the point runner for `ar`: ask everything twice (the ar-vs-ar floor)


class CodingEvalError(RuntimeError):
    """The eval could not produce a meaningful result (too many requests to the server failed)."""


@dataclass
class Attempt:
    """One request for one problem and the verdict on its answer (the fields of a problems.jsonl record)."""

    passed: bool
    error_kind: str | None
    error: str | None
    finish_reason: str | None
    truncated: bool
    completion_tokens: int | None
    max_tokens: int
    response: str
    reasoning: str | None
    code: str | None
    spec_verify_ct: int | None = None


@dataclass
class Completion:
    """The parts of a chat-completion response the eval uses."""

    content: str
    reasoning: str | None
    finish_reason: str | None
    completion_tokens: int | None
    spec_verify_ct: int | None = None


def _spec_verify_ct(body: dict) -> int | None:
    """Verify steps from SGLang's `sglext.spec_tokens_details` (present when speculation ran), else None."""
    details = (body.get("sglext") or {}).get("spec_tokens_details")
    if isinstance(details, list):
        details = details[0] if details else None
    verify = details.get("spec_verify_ct") if isinstance(details, dict) else None
    return verify if isinstance(verify, int) and verify > 0 else None


def build_messages(problem: Problem) -> list[dict]:
    """The chat messages that ask the model to complete `problem`."""
    return [{"role": "user", "content": instruction(problem.prompt)}]


def resolve_model(client: httpx.Client, url: str, configured: str | None) -> str:
    """The `model` field for requests: the configured one, else the first id from /v1/models, else "default"."""
    if configured:
        return configured
    try:
        response = client.get(f"{url}/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return "default"


def error_message(response: httpx.Response) -> str:
    """The reason an error answer gives (`stream_error`), else the start of its body."""
    return stream_error(response.content) or response.text[:300] or response.reason_phrase


def request_completion(
    client: httpx.Client, url: str, model: str, problem: Problem, max_tokens: int, timeout_s: float
) -> Completion:
    """POST one greedy chat completion; raises httpx.HTTPError or ValueError on any failure."""
    response = client.post(
        f"{url}/v1/chat/completions",
        json={
            "model": model,
            "messages": build_messages(problem),
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": False,
            "return_spec_tokens_details": True,
        },
        timeout=timeout_s,
    )
    if response.is_error:  # SGLang's own reason, e.g. a prompt and max_tokens over the context length
        raise httpx.HTTPStatusError(f"HTTP {response.status_code} from {url}/v1/chat/completions: "
                                    f"{error_message(response)}", request=response.request, response=response)
    try:
        body = response.json()
        choice = body["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise TypeError(f"content is {type(content).__name__}")
        usage = body.get("usage") or {}
        return Completion(
            content=content,
            reasoning=message.get("reasoning_content"),
            finish_reason=choice.get("finish_reason"),
            completion_tokens=usage.get("completion_tokens"),
            spec_verify_ct=_spec_verify_ct(body),
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed chat-completion response: {type(exc).__name__}: {exc}") from exc


def attempt(
    client: httpx.Client,
    url: str,
    model: str,
    problem: Problem,
    max_tokens: int,
    settings: CodingSettings,
    sandbox: Sandbox,
) -> Attempt:
    """Ask the server for one problem, extract the code from the final answer and test it in the sandbox."""
    try:
        completion = request_completion(client, url, model, problem, max_tokens, settings.request_timeout_s)
    except (httpx.HTTPError, ValueError) as exc:
        message = f"{type(exc).__name__}: {exc}".strip()
        return Attempt(False, "request", message[:500], None, False, None, max_tokens, "", None, None)
    if completion.finish_reason == "abort":  # SGLang answers an aborted request with HTTP 200 and the partial text
        return Attempt(False, "request", f"aborted by the server after {completion.completion_tokens} tokens "
                       "(finish_reason abort): the answer was cut by the server, not by the model",
                       completion.finish_reason, False, completion.completion_tokens, max_tokens, completion.content,
                       completion.reasoning, None, spec_verify_ct=completion.spec_verify_ct)
    truncated = completion.finish_reason == "length"
    extraction = extract_code(completion.content, problem, completion.finish_reason, completion.reasoning is not None)
    if extraction.code is None:
        passed, kind, error = False, "no_code", extraction.reason
    else:
        result = sandbox.run_problem(problem, extraction.code, timeout_s=settings.exec_timeout_s)
        passed = result.passed
        kind, error = (None, None) if passed else (result.status, result.error)
    if truncated and not passed:
        error = f"response hit max_tokens={max_tokens}; then {kind}: {error}"
        kind = "truncated"
    return Attempt(
        passed=passed,
        error_kind=kind,
        error=error,
        finish_reason=completion.finish_reason,
        truncated=truncated,
        completion_tokens=completion.completion_tokens,
        max_tokens=max_tokens,
        response=completion.content,
        reasoning=completion.reasoning,
        code=extraction.code,
        spec_verify_ct=completion.spec_verify_ct,
    )


def summarize(records: list[dict], settings: CodingSettings, simulated: bool, sandbox: Sandbox) -> dict:
    """The summary.json document for a list of problems.jsonl records."""
    # A failed request says nothing about the model: pass rates count only the problems it answered.
    answered = [r for r in records if r["error_kind"] != "request"]
    total = len(answered)
    passed = sum(r["passed"] for r in answered)
    truncated = sum(r["truncated"] for r in answered)
    untruncated = [r for r in answered if not r["truncated"]]
    spec = [r for r in answered if r.get("spec_verify_ct") and r.get("completion_tokens")]
    after_retry = None
    if settings.retry_truncated_max_tokens is not None and total:
        final = [r["retry"]["passed"] if r["retry"] else r["passed"] for r in answered]
        after_retry = sum(final) / total
    return {
        "simulated": simulated,
        "problems": len(records),
        "answered": total,
        "request_failures": len(records) - total,
        "passed": passed,
        "pass_at_1": passed / total if total else None,
        "pass_at_1_excluding_truncated": (
            sum(r["passed"] for r in untruncated) / len(untruncated) if untruncated else None
        ),
        "truncated": truncated,
        "by_error_kind": dict(Counter(r["error_kind"] for r in records if r["error_kind"])),
        "max_tokens": settings.max_tokens,
        "retry_max_tokens": settings.retry_truncated_max_tokens,
        "pass_at_1_after_retry": after_retry,
        "acceptance_length": (sum(r["completion_tokens"] for r in spec) / sum(r["spec_verify_ct"] for r in spec)
                              if spec else None),
        "acceptance_requests": len(spec),
        "sandbox": {
            "isolation": sandbox.isolation,
            "requested": sandbox.requested,
            "require_isolation": sandbox.require_isolation,
            "probe": sandbox.probe,
            "guarantees": sandbox.guarantees,
        },
    }


def run_coding_eval(
    url: str,
    out_dir: Path,
    settings: CodingSettings,
    simulated: bool,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the eval, write out_dir/problems.jsonl and out_dir/summary.json, and return the summary."""
    url = url.rstrip("/")
    problems = select_problems(settings.limit, settings.task_ids)
    try:
        sandbox = Sandbox(timeout_s=settings.exec_timeout_s, isolation=settings.isolation,
                          require_isolation=settings.require_isolation)
    except IsolationError as exc:
        raise CodingEvalError(f"coding sandbox: {exc}") from exc
    lock = threading.Lock()
    done = [0]

    def evaluate(problem: Problem) -> dict:
        """Evaluate one problem, with the re-ask when it was truncated and a larger limit is configured."""
        first = attempt(client, url, model, problem, settings.max_tokens, settings, sandbox)
        retry = None
        if first.truncated and settings.retry_truncated_max_tokens is not None:
            retry = asdict(attempt(client, url, model, problem, settings.retry_truncated_max_tokens, settings, sandbox))
        record = {"task_id": problem.task_id, **asdict(first), "retry": retry, "simulated": simulated}
        if progress is not None:
            with lock:
                done[0] += 1
                verdict = "passed" if first.passed else first.error_kind
                progress(f"[{done[0]}/{len(problems)}] {problem.task_id}: {verdict}")
        return record

    limits = httpx.Limits(max_connections=max(1, settings.concurrency))
    try:
        # only an https URL loads the certificate store (about 30 ms of CPU per client)
        verify = urlsplit(url).scheme == "https"
        with sandbox, httpx.Client(timeout=settings.request_timeout_s, limits=limits, verify=verify) as client:
            model = resolve_model(client, url, settings.model)
            with ThreadPoolExecutor(max_workers=max(1, settings.concurrency)) as pool:
                records = list(pool.map(evaluate, problems))
                repeat = None
                if settings.repeat_answers:
                    answers = pool.map(
                        lambda p: attempt(client, url, model, p, settings.max_tokens, settings, sandbox), problems)
                    repeat = [{"task_id": p.task_id, **asdict(a), "retry": None, "simulated": simulated}
                              for p, a in zip(problems, answers, strict=True)]
    except IsolationError as exc:
        raise CodingEvalError(f"coding sandbox: {exc}") from exc
    out_dir = Path(out_dir)
    summary = summarize(records, settings, simulated, sandbox)
    if repeat is not None:
        agreement = compare_outputs(records, repeat)
        summary["repeat"] = {k: agreement[k] for k in ("compared", "exact_match", "exact_match_rate")}
        write_jsonl_atomic(out_dir / "problems_repeat.jsonl", repeat)
    write_jsonl_atomic(out_dir / "problems.jsonl", records)
    write_json_atomic(out_dir / "summary.json", summary)
    failed = [r for r in records if r["error_kind"] == "request"]
    if records and len(failed) > settings.max_request_failure_fraction * len(records):
        raise CodingEvalError(f"{len(failed)} of {len(records)} coding requests to {url} failed (allowed fraction "
                              f"{settings.max_request_failure_fraction:g}); first error: {failed[0]['error']}")
    return summary


def _task_ids(text: str) -> list[str]:
    """Parse a comma-separated list of task ids."""
    return [t.strip() for t in text.split(",") if t.strip()]


def main(args: argparse.Namespace) -> int:
    """Run `ddsweep coding-eval` and print the headline figures; returns the exit code."""
    settings = CodingSettings(
        limit=args.limit,
        task_ids=args.task_ids,
        max_tokens=args.max_tokens,
        retry_truncated_max_tokens=args.retry_max_tokens,
        concurrency=args.concurrency,
        request_timeout_s=args.timeout_s,
        exec_timeout_s=args.exec_timeout_s,
        model=args.model,
        isolation=args.isolation,
        require_isolation=not args.allow_weak_isolation,
    )
    progress = ProgressLine()
    try:
        summary = run_coding_eval(
            args.url,
            Path(args.out),
            settings,
            simulated=args.simulated,
            progress=progress,
        )
    except (CodingEvalError, ValueError) as exc:
        progress.close()
        print(f"coding-eval failed: {exc}", file=sys.stderr)
        return 1
    progress.close()
    print(
        f"pass@1 {summary['passed']}/{summary['answered']} = {summary['pass_at_1']:.3f} "
        f"({summary['request_failures']} of {summary['problems']} requests failed); "
        f"truncated {summary['truncated']}; sandbox {summary['sandbox']['isolation']}; "
        f"written to {args.out}"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `coding-eval` subcommand."""
    parser = subparsers.add_parser(
        "coding-eval",
        help="run HumanEval against a running OpenAI-compatible server",
        description="Ask the server to solve HumanEval problems (greedy) and test the answers in a sandbox.",
    )
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--out", required=True, help="directory for problems.jsonl and summary.json")
    parser.add_argument("--limit", type=int, default=CodingSettings.limit, help="first N problems (default: all 164)")
    parser.add_argument(
        "--task-ids", type=_task_ids, default=CodingSettings.task_ids,
        help="comma-separated, e.g. HumanEval/0,HumanEval/5",
    )
    parser.add_argument("--max-tokens", type=int, default=CodingSettings.max_tokens)
    parser.add_argument("--retry-max-tokens", type=int, default=CodingSettings.retry_truncated_max_tokens,
                        help="re-ask truncated answers with this limit")
    parser.add_argument("--concurrency", type=int, default=CodingSettings.concurrency, help="requests in flight")
    parser.add_argument("--timeout-s", type=float, default=CodingSettings.request_timeout_s,
                        help="per-request timeout")
    parser.add_argument("--exec-timeout-s", type=float, default=CodingSettings.exec_timeout_s,
                        help="sandbox wall clock per problem")
    parser.add_argument("--model", default=None, help="model field (default: first id from /v1/models)")
    parser.add_argument("--isolation", default=CodingSettings.isolation, choices=ISOLATION_CHOICES,
                        help="sandbox isolation mode (default: the strongest that works)")
    parser.add_argument("--allow-weak-isolation", action="store_true",
                        help="run in rlimits-only mode when no namespace isolation works (default: refuse)")
    parser.add_argument("--simulated", action="store_true", help="label results as coming from the stand-in server")
    parser.set_defaults(func=main)
