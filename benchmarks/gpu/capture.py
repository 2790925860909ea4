"""Capture what a real SGLang server answers, as fixtures for the stand-in's conformance test
(tests/contract/test_gpu_fixtures.py): for each named point of a study, start its server through ddsweep's own
launcher (render_server, ManagedServer), then record /server_info, a plain and a streamed native /generate (the
raw server-sent events), a chat completion, and the engine's start-up lines; also the installed SGLang's
argument-parser options (what the preflight reads to tell builds apart).
Usage: python3 capture.py --config config/config.yaml STUDY.yaml --points ID [ID ...] --out DIR"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import httpx

from ddsweep.config.records import point_record
from ddsweep.config.study import find_point, load_config
from ddsweep.point.lifecycle import ManagedServer, find_free_port, render_server

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
STARTUP_LINE = re.compile(r"Initialized .*(worker|draft runner).*|.*max_running_requests.*")


def parser_options() -> list[str]:
    """The option strings of the installed SGLang's server parser."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return sorted(parser._option_string_actions)  # noqa: SLF001 - the parser's own option table


def capture_point(config: dict, point_id: str, out: Path) -> dict:
    """Start one point's server, send the requests, save every answer under out/point_id; returns a summary."""
    record = point_record(config, find_point(config, point_id))
    folder = out / point_id
    folder.mkdir(parents=True, exist_ok=True)
    spec = render_server(record, find_free_port(record["engine"]["host"]))
    summary: dict = {"point": point_id, "command": spec.command}
    with ManagedServer(spec, folder / "server.log", 30.0) as server:
        summary["startup_s"] = round(server.wait_until_healthy(record["engine"]["startup_timeout_s"]), 1)
        with httpx.Client(base_url=spec.url, timeout=120.0) as client:
            (folder / "server_info.json").write_text(json.dumps(client.get("/server_info").json(), indent=1))
            body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
            plain = client.post("/generate", json=body)
            (folder / "generate.json").write_text(json.dumps(plain.json(), indent=1))
            started = time.monotonic()
            with client.stream("POST", "/generate", json={**body, "stream": True}) as stream:
                raw = "".join(stream.iter_text())
            summary["stream_s"] = round(time.monotonic() - started, 3)
            (folder / "generate_stream.txt").write_text(raw)
            chat = {"model": record["target"]["served_model_name"], "max_tokens": 32, "temperature": 0,
                    "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]}
            answer = client.post("/v1/chat/completions", json=chat)
            (folder / "chat.json").write_text(json.dumps({"status": answer.status_code, "body": answer.json()},
                                                         indent=1))
            details = client.post("/v1/chat/completions", json={**chat, "return_spec_tokens_details": True})
            (folder / "chat_spec_details.json").write_text(json.dumps(
                {"status": details.status_code, "body": details.json()}, indent=1))
    lines = [line for line in (folder / "server.log").read_text(errors="replace").splitlines()
             if STARTUP_LINE.search(line)]
    (folder / "startup_lines.txt").write_text("\n".join(lines) + "\n")
    summary["meta_info"] = plain.json().get("meta_info", {})
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", required=True)
    parser.add_argument("--points", nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = load_config(*args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sglang_options.json").write_text(json.dumps(parser_options(), indent=0))
    summaries = []
    for point_id in args.points:
        try:
            summaries.append(capture_point(config, point_id, args.out))
        except Exception as exc:  # noqa: BLE001 - one failed capture must not lose the others
            summaries.append({"point": point_id, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(summaries[-1])[:600], flush=True)
    (args.out / "captures.json").write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    main()
