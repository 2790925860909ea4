"""SGLang's own contract for the stand-in: its argument parser, request classes and `/server_info` builder.

When the `sglang` package imports (CI installs its CPU build), the stand-in is *strict*: it parses its command
line with `ServerArgs.add_cli_args` (plus PR #29907's `--speculative-ddtree-budget`, the only flag upstream
lacks), validates every request body with the class SGLang's route declares, rejects what SGLang rejects with
SGLang's status and error body, and builds `/server_info` with SGLang's `build_server_info`. Otherwise it is
lenient and says so (`strict: false` in `/server_info` and in its log).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# What PR #29907 adds to SGLang 0.5.23's parser. `--speculative-algorithm` takes any registered name in 0.5.23
# (no `choices`), so the PR's DDTREE algorithm needs no parser change; the budget flag is new.
DDTREE_FLAGS = {"--speculative-ddtree-budget": {"type": int, "default": None, "dest": "speculative_ddtree_budget",
                                                "help": "DDTree node budget (SGLang PR #29907)"}}
# Request classes by route (SGLang 0.5.23 http_server.py).
OPENAI_CLASSES = {"/tokenize": "TokenizeRequest", "/v1/tokenize": "TokenizeRequest",
                  "/v1/chat/completions": "ChatCompletionRequest", "/v1/completions": "CompletionRequest"}


@dataclass
class Contract:
    """What of SGLang's code the stand-in could load; `strict` only when all of it imported."""

    strict: bool
    reason: str
    server_args_cls: Any = None
    openai: dict[str, Any] = field(default_factory=dict)
    generate_adapter: Any = None
    generate_contract_error: Callable[[Any], str | None] | None = None
    build_server_info: Callable[[Any, dict], dict] | None = None
    version: str | None = None
    missing: list[str] = field(default_factory=list)

    def label(self) -> str:
        """One line for the log and /server_info."""
        if self.strict:
            extra = f" (not loaded: {'; '.join(self.missing)})" if self.missing else ""
            return f"strict: request bodies validated with SGLang {self.version}'s own classes{extra}"
        return f"lenient (strict: false): {self.reason}"


def load(mode: str = "auto") -> Contract:
    """Load SGLang's contract; `mode` is auto (strict when importable), on (fail if not) or off."""
    if mode == "off":
        return Contract(False, "--sim-strict off")
    try:
        import sglang
        server_args = importlib.import_module("sglang.srt.server_args")
        protocol = importlib.import_module("sglang.srt.entrypoints.openai.protocol")
        common = importlib.import_module("sglang.srt.utils.common")
        api_contract = importlib.import_module("sglang.srt.entrypoints.api_contract")
    except Exception as exc:  # any import failure means: not strict (the reason is logged)
        if mode == "on":
            raise RuntimeError(f"--sim-strict on, but SGLang's contract does not import: "
                               f"{type(exc).__name__}: {exc}") from exc
        return Contract(False, f"the sglang package does not import here ({type(exc).__name__}: {exc})")
    contract = Contract(True, "", server_args_cls=server_args.ServerArgs,
                        openai={path: getattr(protocol, name) for path, name in OPENAI_CLASSES.items()},
                        generate_contract_error=api_contract.generate_contract_error,
                        build_server_info=common.build_server_info, version=sglang.__version__)
    try:  # io_struct pulls in SGLang's model configs, which import torchvision
        from pydantic import TypeAdapter

        io_struct = importlib.import_module("sglang.srt.managers.io_struct")
        contract.generate_adapter = TypeAdapter(io_struct.GenerateReqInput)
    except Exception as exc:
        contract.missing.append(f"GenerateReqInput ({type(exc).__name__}: {exc}); /generate is checked with "
                                "SGLang's api_contract schema only")
    return contract


def add_server_args(parser: argparse.ArgumentParser, contract: Contract) -> None:
    """SGLang's own server flags, plus exactly PR #29907's DDTree budget flag."""
    contract.server_args_cls.add_cli_args(parser)
    for flag, options in DDTREE_FLAGS.items():
        parser.add_argument(flag, **options)


def _validation_message(exc: Any) -> str:
    """The message SGLang's RequestValidationError handler puts in its 400 answer (FastAPI's wording)."""
    errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
    try:
        from fastapi.exceptions import RequestValidationError
    except ImportError:
        return f"{len(errors)} validation error{'s' if len(errors) > 1 else ''}: {errors}"
    rve = RequestValidationError(errors)
    text, listed = str(rve), str(rve.errors())
    return f"{text} {listed}" if listed and listed != text else text


def check_request(contract: Contract, path: str, body: Any) -> tuple[int, dict] | None:
    """SGLang's answer to an invalid body for `path` (status, JSON body), or None when SGLang accepts it."""
    if not contract.strict:
        return None
    import pydantic

    if path in contract.openai:
        try:
            contract.openai[path].model_validate(body)
        except pydantic.ValidationError as exc:
            return 400, {"object": "error", "message": _validation_message(exc), "type": "Bad Request",
                         "param": None, "code": 400}
        return None
    if path == "/generate":
        if contract.generate_adapter is not None:
            try:
                obj = contract.generate_adapter.validate_python(body)
            except pydantic.ValidationError as exc:
                return 400, {"object": "error", "message": _validation_message(exc), "type": "Bad Request",
                             "param": None, "code": 400}
            try:
                obj.normalize_batch_and_arguments()
            except ValueError as exc:
                return 400, {"error": {"message": str(exc)}}
        error = contract.generate_contract_error(body)
        if error is not None:
            return 400, {"error": error}
    return None


def context_refusal(prompt_tokens: int, max_new_tokens: int | None, context_length: int, stream: bool,
                    openai: bool) -> tuple[int, dict] | None:
    """SGLang 0.5.23's answer to a prompt of `prompt_tokens` with `max_new_tokens` asked (None: not in the request)
    that does not fit the context (tokenizer_manager.py `_validate_one_request`: refused when prompt_tokens >=
    context_length, or when prompt_tokens + max_new_tokens > context_length), or None when it fits. Streamed
    /generate answers HTTP 200 with this one event before [DONE] (http_server.py); the others answer HTTP 400."""
    if prompt_tokens >= context_length:
        message = (f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                   f"({context_length} tokens).")
    elif max_new_tokens is not None and prompt_tokens + max_new_tokens > context_length:
        message = (f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
                   f"You requested a total of {prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens from "
                   f"the input messages and {max_new_tokens} tokens for the completion. Please reduce the number of "
                   "tokens in the input messages or the completion to fit within the limit.")
    else:
        return None
    if openai:
        return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    if stream:
        return 200, {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}
    return 400, {"error": {"message": message}}


class _Resolved:
    """What `build_server_info` reads from a ServerArgs: the resolved fields and the launch command."""

    def __init__(self, resolved: dict[str, Any], launch_command: str) -> None:
        self._resolved = resolved
        self.launch_command = launch_command

    def resolved_dict(self) -> dict[str, Any]:
        """The resolved arguments, as SGLang's ServerArgs.resolved_dict."""
        return dict(self._resolved)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_resolved"][name]
        except KeyError:
            raise AttributeError(name) from None


def server_info(contract: Contract, resolved: dict[str, Any], launch_command: str, scheduler_info: dict,
                extra: dict[str, Any]) -> dict:
    """The /server_info document: SGLang's build_server_info when strict, the same layout otherwise."""
    if contract.strict:
        try:
            info = contract.build_server_info(_Resolved(resolved, launch_command), scheduler_info)
        except Exception as exc:  # a build_server_info this code does not know: keep the layout, say why
            info = {**resolved, "launch_command": launch_command, **scheduler_info,
                    "ddsweep_build_server_info_error": f"{type(exc).__name__}: {exc}"}
    else:
        info = {**resolved, "launch_command": launch_command, **scheduler_info}
    info.update(extra)
    return info
