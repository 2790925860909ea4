"""The coding eval end to end against a fake OpenAI-compatible server, the CLI, and the simulated answers."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from standin import FAST, Sim

from ddsweep.coding import eval as coding_eval
from ddsweep.coding.eval import CodingEvalError, CodingSettings, build_messages, run_coding_eval
from ddsweep.coding.extraction import extract_code
from ddsweep.coding.humaneval import load_problems, select_problems
from ddsweep.coding.sandbox import Sandbox
from ddsweep.sim.coding import find_problem, simulated_answer
from ddsweep.storage import read_json, read_jsonl

PROBLEMS = {p.task_id: p for p in load_problems()}
RECORD_KEYS = {
    "task_id", "passed", "error_kind", "error", "finish_reason", "truncated", "completion_tokens",
    "max_tokens", "response", "reasoning", "code", "retry", "simulated", "spec_verify_ct",
}  # fmt: skip
SUMMARY_KEYS = {
    "simulated", "problems", "answered", "request_failures", "passed", "pass_at_1",
    "pass_at_1_excluding_truncated", "truncated",
    "by_error_kind", "max_tokens", "retry_max_tokens", "pass_at_1_after_retry", "sandbox",
    "acceptance_length", "acceptance_requests",
}  # fmt: skip


def canonical_answer(task_id: str) -> str:
    """A thinking section with a wrong draft, then the canonical function in a fence."""
    problem = PROBLEMS[task_id]
    return (
        f"<think>\n```python\n{problem.prompt}    return None\n```\n</think>\n"
        f"Here it is:\n```python\n{problem.canonical_program()}```\nDone."
    )


def canned(task_id: str, max_tokens: int) -> tuple[int, object]:
    """(HTTP status, body) of the fake server for one problem."""
    problem = PROBLEMS[task_id]

    def ok(content: str, finish: str = "stop", reasoning: str | None = None, tokens: int = 100) -> tuple[int, dict]:
        message = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return 200, {
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"completion_tokens": tokens, "prompt_tokens": 50},
        }

    if task_id == "HumanEval/0":
        return ok(canonical_answer(task_id))
    if task_id == "HumanEval/1":
        if max_tokens < 1000:
            return ok("<think>\nLet me think about this for a long time", "length", tokens=max_tokens)
        return ok(canonical_answer(task_id), tokens=900)
    if task_id == "HumanEval/2":
        return ok(f"<think>\n```python\n{problem.canonical_program()}```\n</think>\nUse modulo one.")
    if task_id == "HumanEval/3":
        return 500, {"error": "internal"}
    if task_id == "HumanEval/4":
        return 200, "this is { not json"
    if task_id == "HumanEval/5":
        return ok(f"```python\n{problem.prompt}    return numbers\n```")
    if task_id == "HumanEval/6":
        return ok(f"```python\n{problem.canonical_program()}```", reasoning="The reasoning field.\n```python\nx\n```")
    if task_id == "HumanEval/7":
        return ok(canonical_answer(task_id).rsplit("Done.", 1)[0], "length", tokens=max_tokens)
    return 404, {"error": "unknown"}


class FakeServer:
    """A tiny OpenAI-compatible server in a thread whose answers come from `responder`."""

    def __init__(self, responder: Callable[[dict], tuple[int, object]]) -> None:
        """Bind to a free local port."""
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            """Serves /v1/models and /v1/chat/completions."""

            def log_message(self, *args: object) -> None:
                """Stay quiet."""

            def _send(self, status: int, body: object) -> None:
                """Write a JSON (or raw text) body."""
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                """Model list."""
                self._send(200, {"data": [{"id": "fake-model"}]})

            def do_POST(self) -> None:  # noqa: N802
                """Chat completions."""
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(request)
                self._send(*responder(request))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        """Start serving."""
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()


def canned_responder(request: dict) -> tuple[int, object]:
    """Route a request to `canned` by the HumanEval prompt it contains."""
    problem = find_problem(request["messages"][-1]["content"])
    assert problem is not None
    return canned(problem.task_id, request["max_tokens"])


@pytest.fixture
def server() -> Iterator[FakeServer]:
    """The canned fake server."""
    with FakeServer(canned_responder) as fake:
        yield fake


def test_end_to_end_records_and_summary(server: FakeServer, tmp_path: Path) -> None:
    """Passed, truncated (retried), thinking-only, request errors and wrong answers are recorded as such."""
    settings = CodingSettings(limit=8, max_tokens=512, retry_truncated_max_tokens=4096, concurrency=4,
                              max_request_failure_fraction=0.5)
    lines: list[str] = []
    summary = run_coding_eval(server.url, tmp_path, settings, simulated=False, progress=lines.append)
    records = {r["task_id"]: r for r in read_jsonl(tmp_path / "problems.jsonl")}
    assert read_json(tmp_path / "summary.json") == summary
    assert len(lines) == 8
    assert all(set(r) == RECORD_KEYS for r in records.values())
    assert set(summary) == SUMMARY_KEYS

    assert records["HumanEval/0"]["passed"] and records["HumanEval/0"]["error_kind"] is None
    assert "return None" not in records["HumanEval/0"]["code"]
    truncated = records["HumanEval/1"]
    assert truncated["truncated"] and truncated["error_kind"] == "truncated" and truncated["max_tokens"] == 512
    assert truncated["retry"]["passed"] and truncated["retry"]["max_tokens"] == 4096
    assert set(truncated["retry"]) == RECORD_KEYS - {"task_id", "retry", "simulated"}
    assert records["HumanEval/2"]["error_kind"] == "no_code" and records["HumanEval/2"]["code"] is None
    assert records["HumanEval/3"]["error_kind"] == "request" and "500" in records["HumanEval/3"]["error"]
    assert records["HumanEval/4"]["error_kind"] == "request" and "malformed" in records["HumanEval/4"]["error"]
    assert records["HumanEval/5"]["error_kind"] == "assertion"
    assert records["HumanEval/6"]["passed"] and records["HumanEval/6"]["reasoning"].startswith("The reasoning")
    assert records["HumanEval/7"]["truncated"] and records["HumanEval/7"]["passed"]
    assert records["HumanEval/7"]["retry"]["passed"]

    # The two failed requests say nothing about the model: rates count the 6 answered problems.
    assert summary["problems"] == 8 and summary["answered"] == 6 and summary["request_failures"] == 2
    assert summary["passed"] == 3
    assert summary["pass_at_1"] == pytest.approx(3 / 6)
    assert summary["truncated"] == 2
    assert summary["pass_at_1_excluding_truncated"] == pytest.approx(2 / 4)
    assert summary["pass_at_1_after_retry"] == pytest.approx(4 / 6)
    assert summary["by_error_kind"] == {"truncated": 1, "no_code": 1, "request": 2, "assertion": 1}
    assert summary["max_tokens"] == 512 and summary["retry_max_tokens"] == 4096
    assert summary["sandbox"]["isolation"] == Sandbox().isolation
    assert summary["simulated"] is False

    sent = server.requests[0]
    assert sent["model"] == "fake-model" and sent["temperature"] == 0
    assert "```python" in sent["messages"][0]["content"]


def test_too_many_failed_requests_fail_the_eval_after_writing_files(server: FakeServer, tmp_path: Path) -> None:
    """Two failed requests of eight exceed the default allowed fraction: the eval fails, the records stay."""
    settings = CodingSettings(limit=8, max_tokens=512, concurrency=4)
    with pytest.raises(CodingEvalError, match="2 of 8 coding requests .* failed .*allowed fraction 0.05"):
        run_coding_eval(server.url, tmp_path, settings, simulated=False)
    assert len(read_jsonl(tmp_path / "problems.jsonl")) == 8
    assert read_json(tmp_path / "summary.json")["request_failures"] == 2


def test_an_answer_the_server_aborted_is_a_failed_request_not_a_wrong_answer(tmp_path: Path) -> None:
    """SGLang answers an aborted chat request with HTTP 200, finish_reason abort and the partial text: the
    request failed (it says nothing about the model), and the partial answer is kept."""
    def aborted(request: dict) -> tuple[int, object]:
        return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "def f(x):\n    re"},
                                  "finish_reason": "abort"}], "usage": {"completion_tokens": 7}}

    with FakeServer(aborted) as fake:
        summary = run_coding_eval(fake.url, tmp_path, CodingSettings(task_ids=["HumanEval/0"], model="m",
                                                                     max_request_failure_fraction=1.0),
                                  simulated=False)
    record = read_jsonl(tmp_path / "problems.jsonl")[0]
    assert record["error_kind"] == "request" and record["error"].startswith("aborted by the server after 7 tokens")
    assert record["response"] == "def f(x):\n    re" and record["code"] is None
    assert summary["request_failures"] == 1 and summary["answered"] == 0


def test_no_retry_when_not_configured(server: FakeServer, tmp_path: Path) -> None:
    """Without a retry limit, truncated problems are not re-asked and pass_at_1_after_retry is null."""
    settings = CodingSettings(task_ids=["HumanEval/1"], max_tokens=256, model="m")
    summary = run_coding_eval(server.url, tmp_path, settings, simulated=True)
    record = read_jsonl(tmp_path / "problems.jsonl")[0]
    assert record["retry"] is None and record["simulated"] is True
    assert summary["pass_at_1_after_retry"] is None and summary["pass_at_1_excluding_truncated"] is None
    assert len(server.requests) == 1 and server.requests[0]["model"] == "m"


def test_server_down_raises_after_writing_files(tmp_path: Path) -> None:
    """When every request fails, the files are still written and CodingEvalError is raised."""
    with (
        FakeServer(lambda request: (503, {"error": "starting"})) as fake,
        pytest.raises(CodingEvalError, match="3 of 3 coding requests .* failed"),
    ):
        run_coding_eval(fake.url, tmp_path, CodingSettings(limit=3, request_timeout_s=5), simulated=False)
    records = read_jsonl(tmp_path / "problems.jsonl")
    assert [r["error_kind"] for r in records] == ["request"] * 3
    assert read_json(tmp_path / "summary.json")["by_error_kind"] == {"request": 3}


def test_unreachable_server_is_recorded_not_dropped(tmp_path: Path) -> None:
    """A connection refused is a `request` error for every problem, never a missing record."""
    with pytest.raises(CodingEvalError):
        run_coding_eval("http://127.0.0.1:9", tmp_path, CodingSettings(limit=2, request_timeout_s=2), False)
    assert len(read_jsonl(tmp_path / "problems.jsonl")) == 2


def test_cli_subcommand(server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`coding-eval` parses its options, runs the eval and exits 0."""
    parser = argparse.ArgumentParser()
    coding_eval.register(parser.add_subparsers())
    args = parser.parse_args(
        ["coding-eval", "--url", server.url, "--out", str(tmp_path), "--task-ids", "HumanEval/0,HumanEval/5",
         "--max-tokens", "300", "--retry-max-tokens", "2000", "--concurrency", "2", "--timeout-s", "30"]
    )  # fmt: skip
    assert args.func(args) == 0
    summary = read_json(tmp_path / "summary.json")
    assert summary["problems"] == 2 and summary["passed"] == 1 and summary["max_tokens"] == 300
    assert "pass@1 1/2 = 0.500 (0 of 2 requests failed)" in capsys.readouterr().out


def test_select_problems_subsets() -> None:
    """First-N and explicit task-id subsets; unknown ids are refused."""
    assert len(select_problems()) == 164
    assert [p.task_id for p in select_problems(limit=2)] == ["HumanEval/0", "HumanEval/1"]
    assert [p.task_id for p in select_problems(limit=2, task_ids=["HumanEval/9"])] == ["HumanEval/9"]
    with pytest.raises(ValueError, match="unknown"):
        select_problems(task_ids=["HumanEval/999"])


def test_simulated_answers_are_realistic_and_deterministic() -> None:
    """Answers carry a wrong draft in the thinking; about 10% are wrong; some have very long thinking."""
    problems = load_problems()
    answers = [simulated_answer(build_messages(p), seed=7) for p in problems]
    assert answers == [simulated_answer(build_messages(p), seed=7) for p in problems]
    assert all(a is not None and a.startswith("<think>") and "return None" in a.split("</think>")[0] for a in answers)
    programs = [extract_code(a, p).code for a, p in zip(answers, problems, strict=True)]
    results = Sandbox().run_many([p.sandbox_job(c) for p, c in zip(problems, programs, strict=True)])
    wrong = sum(not r.passed for r in results)
    assert 5 <= wrong <= 30
    lengths = sorted(len(a) for a in answers)
    assert lengths[-1] > 10 * lengths[len(lengths) // 2]
    assert simulated_answer([{"role": "user", "content": "Write a haiku."}], seed=7) is None
    assert simulated_answer(build_messages(problems[0]), seed=8) is not None


def test_repeat_answers_measure_the_ar_floor(server: FakeServer, tmp_path: Path) -> None:
    """With repeat_answers every problem is asked twice; the agreement of the two passes is in the summary."""
    settings = CodingSettings(task_ids=["HumanEval/0", "HumanEval/5"], max_tokens=512, repeat_answers=True)
    summary = run_coding_eval(server.url, tmp_path, settings, simulated=False)
    repeat = read_jsonl(tmp_path / "problems_repeat.jsonl")
    assert [r["task_id"] for r in repeat] == ["HumanEval/0", "HumanEval/5"]
    assert len(server.requests) == 4
    assert summary["repeat"] == {"compared": 2, "exact_match": 2, "exact_match_rate": 1.0}


def test_eval_refuses_without_isolation(server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When no namespace mode works, the eval stops before asking anything and says how to allow the weak mode."""
    import ddsweep.coding.sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "probe_isolation", lambda *a, **k: {"bubblewrap": "bwrap not found on PATH",
                                                                            "unshare": "unshare not found on PATH"})
    with pytest.raises(CodingEvalError, match="require_isolation: false"):
        run_coding_eval(server.url, tmp_path, CodingSettings(limit=1), simulated=False)
    assert server.requests == []
    summary = run_coding_eval(server.url, tmp_path, CodingSettings(limit=1, require_isolation=False), simulated=False)
    assert summary["sandbox"]["isolation"] == "rlimits-only"
    assert summary["sandbox"]["probe"]["bubblewrap"] == "bwrap not found on PATH"


def test_coding_eval_records_acceptance_from_its_own_requests(tmp_path: Path) -> None:
    sim = Sim("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8", *FAST)
    try:
        summary = run_coding_eval(sim.url, tmp_path, CodingSettings(limit=3, max_tokens=512, concurrency=3),
                                  simulated=True)
    finally:
        sim.close()
    problems = read_jsonl(tmp_path / "problems.jsonl")
    assert all(p["spec_verify_ct"] for p in problems)
    ratio = sum(p["completion_tokens"] for p in problems) / sum(p["spec_verify_ct"] for p in problems)
    assert summary["acceptance_length"] == pytest.approx(ratio) and summary["acceptance_requests"] == 3


def test_a_refused_request_is_recorded_with_the_servers_reason(tmp_path: Path) -> None:
    """A prompt and max_tokens over the server's context length: SGLang answers 400 with its reason, which the
    record and the eval's error name (not only the status line)."""
    sim = Sim("--context-length", "256", *FAST)
    try:
        with pytest.raises(CodingEvalError, match="1 of 1 coding requests .* failed .*maximum context length of 256"):
            run_coding_eval(sim.url, tmp_path, CodingSettings(task_ids=["HumanEval/0"], max_tokens=512),
                            simulated=True)
    finally:
        sim.close()
    (record,) = read_jsonl(tmp_path / "problems.jsonl")
    assert record["error_kind"] == "request"
    assert "HTTP 400 from " in record["error"] and "Requested token count exceeds the model's maximum context " \
        "length of 256 tokens" in record["error"] and "512 tokens for the completion" in record["error"]
