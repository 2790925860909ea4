"""The stand-in's OpenAI-compatible endpoints (/v1/chat/completions, /v1/completions) and its chat template.

`OpenAIEndpoints` is mixed into the server (sim/server.py): the endpoints use its admission faults, request
builder, metadata and scheduler, so they serve the same generations as the native `/generate`.
"""

from __future__ import annotations

import json
import time

from ddsweep.sim.http import Connection, HttpRequest
from ddsweep.sim.records import GenRequest

# The meta_info keys SGLang 0.5.23 copies into an OpenAI response's sglext.spec_tokens_details.
SPEC_DETAIL_KEYS = ("spec_accept_rate", "spec_accept_length", "spec_num_correct_drafts", "spec_num_proposed_drafts",
                    "spec_verify_ct")


class OpenAIEndpoints:
    """The OpenAI-compatible endpoints of the stand-in server."""

    def _openai(self, conn: Connection, req: HttpRequest, chat: bool) -> None:
        body = req.json()
        if chat:
            messages = body.get("messages") or []
            prompt = render_chat(messages)
            answer = self._coding(messages, self.s.seed) if self._coding else None
        else:
            prompt, answer = str(body.get("prompt", "")), None
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        max_new = int(asked or 2048)
        ignore_eos = bool(body.get("ignore_eos", False))
        stream = bool(body.get("stream", False))
        handled, malformed, cut = self._admit_generate(conn)
        if handled:
            return
        gen = self._new_request(prompt, max_new, ignore_eos, answer)
        if self._refused_too_long(conn, gen.prompt_tokens, None if asked is None else max_new, stream, openai=True):
            return
        conn.on_close = lambda: setattr(gen, "cancelled", True)
        cid = ("chatcmpl-" if chat else "cmpl-") + gen.rid
        obj = "chat.completion" if chat else "text_completion"
        model = body.get("model") or self.s.served_model_name
        created = int(time.time())

        def choice(text: str, finish: str | None, delta: bool) -> dict:
            if not chat:
                return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            key = "delta" if delta else "message"
            msg = {"role": "assistant", "content": text} if not delta or text else {}
            if not delta:
                msg["reasoning_content"] = None
                return {"index": 0, key: msg, "logprobs": None, "finish_reason": finish, "matched_stop": None}
            return {"index": 0, key: msg, "finish_reason": finish}

        def usage(r: GenRequest) -> dict:
            return {"prompt_tokens": r.prompt_tokens, "total_tokens": r.prompt_tokens + r.completion_tokens,
                    "completion_tokens": r.completion_tokens, "prompt_tokens_details": None, "reasoning_tokens": 0}

        def finish_of(r: GenRequest) -> str:
            return "length" if r.finish_type == "length" else "stop"

        spec_details = bool(body.get("return_spec_tokens_details")) and self.spec

        def sglext(r: GenRequest) -> dict:
            """SGLang's response-level extension with the request's speculative details (SpecTokensDetails)."""
            meta = self._meta(r)
            return {"spec_tokens_details": {k: meta[k] for k in SPEC_DETAIL_KEYS}}

        if stream:
            gen.cut_at = max(1, len(gen.pieces) // 2) if cut else None
            conn.start_stream()
            include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))

            def on_step(r: GenRequest, new_text: str) -> None:
                if r.cut_at is not None and r.completion_tokens >= r.cut_at:
                    r.cancelled = True
                    conn.abort()
                    return
                chunk = {"id": cid, "object": obj + ".chunk", "created": created, "model": model,
                         "choices": [choice(new_text, None, True)], "simulated": True}
                if malformed and r.done:
                    conn.send_chunk(b"data: {broken\n\n")
                else:
                    conn.send_chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")

            def on_done(r: GenRequest) -> None:
                final = {"id": cid, "object": obj + ".chunk", "created": created, "model": model,
                         "choices": [choice("", finish_of(r), True)], "simulated": True}
                if include_usage:
                    final["usage"] = usage(r)
                tail = b""
                if spec_details:
                    ext = {"id": cid, "object": obj + ".chunk", "created": created, "model": model, "choices": [],
                           "sglext": sglext(r), "simulated": True}
                    tail = b"data: " + json.dumps(ext).encode() + b"\n\n"
                conn.send_chunk(b"data: " + json.dumps(final).encode() + b"\n\n" + tail + b"data: [DONE]\n\n")
                conn.end_stream()

            gen.on_step, gen.on_done = on_step, on_done
        else:
            def on_done(r: GenRequest) -> None:
                if cut:
                    conn.abort()
                    return
                doc = {"id": cid, "object": obj, "created": created, "model": model,
                       "choices": [choice(r.text, finish_of(r), False)], "usage": usage(r), "simulated": True}
                if spec_details:
                    doc["sglext"] = sglext(r)
                if malformed:
                    conn.respond(200, json.dumps(doc).encode()[:20])
                else:
                    conn.respond_json(200, doc)

            gen.on_done = on_done
        self._submit(gen)

    def _chat(self, conn: Connection, req: HttpRequest) -> None:
        self._openai(conn, req, chat=True)

    def _completions(self, conn: Connection, req: HttpRequest) -> None:
        self._openai(conn, req, chat=False)


def render_chat(messages: list[dict]) -> str:
    """The stand-in's chat template (ChatML, with the assistant turn opened), as SGLang applies a model's."""
    return "".join(f"<|im_start|>{m.get('role', 'user')}\n{_content(m)}<|im_end|>\n"
                   for m in messages) + "<|im_start|>assistant\n"


def _content(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)
