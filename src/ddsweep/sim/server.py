"""The stand-in SGLang server: endpoints, a continuous-batching scheduler loop, fault injection.

The endpoints, the scheduler loop and the faults share one server state. Sibling modules: the HTTP layer (`http`),
the records, the OpenAI endpoints, the timing and acceptance `model`, SGLang's request checks (`contract`)."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

from ddsweep import __version__
from ddsweep.sim import tokenizer
from ddsweep.sim.cache import PrefixCache
from ddsweep.sim.contract import check_request, context_refusal
from ddsweep.sim.contract import server_info as build_info
from ddsweep.sim.http import Connection, HttpRequest
from ddsweep.sim.model import (
    AcceptanceSampler,
    Heat,
    expected_accept_length,
    generate_pieces,
    is_lossy_prompt,
    natural_length,
    prefill_time_s,
    prompt_kind,
    stable_hash,
    step_time_s,
)
from ddsweep.sim.openai import OpenAIEndpoints, render_chat
from ddsweep.sim.records import GenRequest, SimSettings

CONTEXT_LENGTH = 262144
FAULT_KINDS = ("exit-during-startup", "never-healthy", "crash-after", "hang", "error-rate", "malformed-rate",
               "cut-stream-rate", "ignore-sigterm", "slow-shutdown", "spawn-child", "ignore-knob", "lossy",
               "refuse-flags", "never-healthy-first", "abort-every", "engine-exception", "stall-every", "drift")
STALL_S = 1.0  # default first-token stall of `stall-every:N[,SECONDS]`
DRIFT_RESET_IDLE_S = 0.5  # idle time that ends a busy period of `drift:RATE` (between cells, not requests)
# SGLang 0.5.23's message when it aborts a decoding request it cannot keep (managers/schedule_batch.py).
ABORT_MESSAGE = "Retracted under decode memory pressure without a KV backup. Retry later."
ABORT_STATUS = 503
# What the real DDTree worker raised on its first request at budget 4 < block_size - 1 (ddtree_worker_v2.py).
ENGINE_EXCEPTION = ("The size of tensor a (7) must match the size of tensor b (4) at non-singleton dimension 1 "
                    "[simulated fault engine-exception]")
AR_MAX_RUNNING = 4096  # the stand-in's stand-in for a memory-derived limit
LOG_EVERY_STEPS = 40
RENDERED_CACHE = 4096  # templated prompts remembered by /tokenize, so /generate input_ids can be traced back


def log(message: str) -> None:
    """Write one log line to stdout and flush it (the launcher captures stdout line by line)."""
    print(message, flush=True)


class SimServer(OpenAIEndpoints):
    """The HTTP application and scheduler of the stand-in."""

    def __init__(self, settings: SimSettings) -> None:
        """Set up state; nothing runs until `serve` is awaited."""
        self.s = settings
        self.spec = settings.knobs.kind != "ar"
        self.boot = time.monotonic()
        self.boot_wall = time.time()
        self.ready = False
        self.connections: set[Connection] = set()
        self.waiting: list[GenRequest] = []
        self.running: list[GenRequest] = []
        self.wake: asyncio.Event | None = None
        self.records: list[GenRequest] = []
        self.reset_ts = time.time()
        self.total_tokens = 0
        self.total_verify = 0
        self.generate_count = 0
        self.hung = False  # `hang[:N]`: the scheduler has stopped; no request gets another token
        self.step_count = 0
        self._drift_t0: float | None = None
        self._heat = Heat(settings.params.drift, settings.params.drift_s)
        self._ids = itertools.count(1)
        self._rendered: dict[int, str] = {}
        self._fault_rngs = {k: random.Random(stable_hash("fault", k, settings.seed))
                            for k in ("error-rate", "malformed-rate", "cut-stream-rate")}
        self._stop: asyncio.Future | None = None
        self._exit_code = 0
        self._coding = _load_simulated_answer()
        self._cache = PrefixCache()
        self._ngram_store: set[int] = set()  # prompts an NGRAM server has seen
        configured = settings.server_args.get("max_running_requests")
        self.max_running = int(configured) if configured else AR_MAX_RUNNING

    # ----------------------------------------------------------------- lifecycle
    async def serve(self) -> int:
        """Run until shut down; returns the process exit code."""
        loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        self._stop = loop.create_future()
        server = await loop.create_server(lambda: Connection(self.handle, self.connections),
                                          self.s.host, self.s.port, reuse_address=True, backlog=2048)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        log(f"Serving HTTP on http://{self.s.host}:{self.s.port} [simulated]")
        if self.s.fault("spawn-child"):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            log(f"Started helper child process pid={child.pid} [simulated fault spawn-child]")
        if self.s.fault("exit-during-startup"):
            loop.call_later(max(0.05, self.s.startup_delay_s / 2), self._crash,
                            "RuntimeError: simulated failure while loading the model [simulated fault]")
        elif not self.s.fault("never-healthy"):
            loop.call_later(self.s.startup_delay_s, self._become_ready)
        scheduler = loop.create_task(self._scheduler())
        try:
            await self._stop
        finally:
            scheduler.cancel()
            server.close()
            for conn in list(self.connections):
                conn.abort()
        log("Shutdown complete [simulated]")
        return self._exit_code

    def _become_ready(self) -> None:
        self.ready = True
        log("The server is fired up and ready to roll! [simulated]")

    def _crash(self, message: str) -> None:
        log(message)
        sys.stdout.flush()
        os._exit(1)

    def _engine_exception(self) -> None:
        """Die as SGLang does when its scheduler raises in its own code: the traceback, then the server exits."""
        try:
            raise RuntimeError(ENGINE_EXCEPTION)
        except RuntimeError:
            log(f"Scheduler hit an exception: {traceback.format_exc().rstrip()}")
        asyncio.get_running_loop().call_later(
            0.05, self._crash, "Received sigquit from a child process. It usually means the child failed.")

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.s.fault("ignore-sigterm") and sig == signal.SIGTERM:
            log(f"Received {name}; ignoring it [simulated fault ignore-sigterm]")
            return
        slow = self.s.fault("slow-shutdown")
        delay = float(slow.arg or 5) if slow else 0.0
        log(f"Received {name}; shutting down{f' in {delay:g} s' if delay else ''} [simulated]")
        loop = asyncio.get_running_loop()
        loop.call_later(delay, self._finish_stop)

    def _finish_stop(self) -> None:
        if self._stop is not None and not self._stop.done():
            self._stop.set_result(None)

    # ----------------------------------------------------------------- scheduler
    async def _scheduler(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.wake is not None
        target = loop.time()
        params, knobs = self.s.params, self.s.knobs
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                self._heat.advance(loop.time(), busy=True)
                idle_since = loop.time()
                await self.wake.wait()
                target = loop.time()
                self._heat.advance(target, busy=False)  # it cooled while idle
                if target - idle_since > DRIFT_RESET_IDLE_S:  # drift:RATE restarts with each busy period
                    self._drift_t0 = None
            batch = [r for r in self.running if not r.cancelled]
            pending = [r for r in self.waiting if not r.cancelled]
            room = max(0, self.max_running - len(batch))
            new, self.waiting = pending[:room], pending[room:]
            heat = self._heat.advance(loop.time(), busy=True) if params.drift else 1.0
            dt = step_time_s(params, knobs, len(batch)) * self._drift() * heat
            if new:
                dt += sum(prefill_time_s(params, r.prompt_tokens) for r in new)
                if not batch:
                    dt += params.step_ms / 1000.0
            target += dt
            delay = target - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                target = loop.time()
            if self.hung:  # a stuck scheduler: nothing in flight advances again (the task ends at shutdown)
                await loop.create_future()
            now = time.time()
            still: list[GenRequest] = []
            for req in batch:
                if req.cancelled:
                    continue
                n = min(req.sampler.draw(req.completion_tokens), len(req.pieces) - req.completion_tokens)
                if self.spec:
                    req.verify_ct += 1
                    req.correct_drafts.append(n - 1)
                    self.total_verify += 1
                    self.total_tokens += n
                self._advance(req, n, now)
                if not req.done and not req.cancelled:
                    still.append(req)
            for req in new:
                self._advance(req, 1, now)
                if not req.done and not req.cancelled:
                    still.append(req)
            self.running = still
            if batch:
                self.step_count += 1
                if self.step_count % LOG_EVERY_STEPS == 0:
                    log(f"Decode batch. #running-req: {len(batch)}, #queue-req: {len(self.waiting)}, "
                        f"accept len: {self.avg_accept_length():.2f} [simulated]")

    def _advance(self, req: GenRequest, n: int, now: float) -> None:
        start = req.completion_tokens
        req.completion_tokens += n
        req.steps += 1
        new_text = "".join(req.pieces[start:req.completion_tokens])
        req.text += new_text
        if req.first_token_ts is None:
            req.first_token_ts = now
        req.last_token_ts = now
        req.on_step(req, new_text)
        if req.done and not req.cancelled:
            req.on_done(req)

    def _submit(self, req: GenRequest) -> None:
        req.arrival_ts = time.time()
        if req.record:
            self.records.append(req)
        self.waiting.append(req)
        assert self.wake is not None
        self.wake.set()

    @property
    def context_length(self) -> int:
        """The model's context length: --context-length when given (SGLang's flag), else the stand-in's."""
        return int(self.s.server_args.get("context_length") or CONTEXT_LENGTH)

    def _refused_too_long(self, conn: Connection, prompt: int, new: int | None, stream: bool, openai: bool) -> bool:
        """Answer as SGLang does when a prompt and the new tokens asked do not fit the context; True when refused."""
        answer = context_refusal(prompt, new, self.context_length, stream, openai)
        if answer is None:
            return False
        if stream and not openai:
            conn.start_stream()
            conn.end_stream(b"data: " + json.dumps(answer[1]).encode() + b"\n\ndata: [DONE]\n\n")
        else:
            conn.respond_json(*answer)
        return True

    def avg_accept_length(self) -> float:
        """Cumulative accepted tokens per verify step since boot (1.0 when not speculative)."""
        return self.total_tokens / self.total_verify if self.total_verify else 1.0

    # ----------------------------------------------------------------- routing
    def handle(self, conn: Connection, req: HttpRequest) -> None:
        """Route one HTTP request."""
        routes: dict[tuple[str, str], Callable[[Connection, HttpRequest], None]] = {
            ("GET", "/health"): self._health,
            ("GET", "/health_generate"): self._health_generate,
            ("GET", "/get_server_info"): self._server_info,
            ("GET", "/server_info"): self._server_info,
            ("GET", "/get_model_info"): self._model_info,
            ("GET", "/v1/models"): self._models,
            ("POST", "/generate"): self._generate,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/v1/tokenize"): self._tokenize,
            ("GET", "/sim/stats"): self._stats,
            ("POST", "/sim/reset"): self._reset,
        }
        route = routes.get((req.method, req.path))
        if route is None:
            known = {path for _, path in routes}
            status = 405 if req.path in known else 404
            conn.respond_json(status, {"error": {"message": f"{req.method} {req.path} not found"},
                                       "simulated": True})
            return
        if not self.ready and req.path not in ("/health", "/get_server_info", "/server_info", "/sim/stats"):
            conn.respond_json(503, {"error": {"message": "server is starting"}, "simulated": True})
            return
        if req.method == "POST" and not req.path.startswith("/sim/"):
            try:
                body = req.json()
            except ValueError as exc:
                conn.respond_json(400, {"object": "error", "message": f"JSON decode error: {exc}",
                                        "type": "Bad Request", "param": None, "code": 400})
                return
            rejected = check_request(self.s.contract, req.path, body)
            if rejected is not None:
                conn.respond_json(*rejected)
                return
        try:
            route(conn, req)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            conn.respond_json(400, {"error": {"message": f"bad request: {exc}"}, "simulated": True})

    def _health(self, conn: Connection, req: HttpRequest) -> None:
        if self.ready:
            conn.respond(200, b"", "text/plain")
        else:
            conn.respond(503, b"starting [simulated]", "text/plain")

    def _health_generate(self, conn: Connection, req: HttpRequest) -> None:
        gen = self._new_request("health", 1, True, record=False)
        gen.on_done = lambda r: conn.respond(200, b"", "text/plain")
        conn.on_close = lambda: setattr(gen, "cancelled", True)
        self._submit(gen)

    def server_info(self) -> dict:
        """The /server_info document in SGLang 0.5.23's layout: resolved arguments at the top level."""
        internal = [{"avg_spec_accept_length": self.avg_accept_length(), "last_gen_throughput": 0.0}]
        scheduler = {"max_total_num_tokens": CONTEXT_LENGTH, "max_req_input_len": self.context_length - 1}
        internal[0]["effective_max_running_requests_per_dp"] = self.max_running
        return build_info(self.s.contract, self.s.server_args, self.s.launch_command, scheduler,
                          {"startup_time": self.boot_wall, "internal_states": internal,
                           "version": f"sim-{__version__}", "frontend": "python", "simulated": True,
                           "strict": self.s.strict, "contract": self.s.contract.label()})

    def _server_info(self, conn: Connection, req: HttpRequest) -> None:
        conn.respond_json(200, self.server_info())

    def _model_info(self, conn: Connection, req: HttpRequest) -> None:
        conn.respond_json(200, {"model_path": self.s.model_path, "is_generation": True, "simulated": True})

    def _models(self, conn: Connection, req: HttpRequest) -> None:
        conn.respond_json(200, {"object": "list", "simulated": True, "data": [
            {"id": self.s.served_model_name, "object": "model", "created": 0, "owned_by": "sglang",
             "root": self.s.model_path, "max_model_len": self.context_length}]})

    def _tokenize(self, conn: Connection, req: HttpRequest) -> None:
        """SGLang's /tokenize: `prompt` (string or list) or chat `messages`; answers tokens, count, max_model_len."""
        body = req.json()
        if body.get("messages") is not None:
            if body.get("prompt") is not None:
                raise ValueError("Exactly one of 'prompt' or 'messages' must be provided.")
            rendered = render_chat(body["messages"])
            ids = tokenizer.token_ids(rendered)
            self._remember(ids, rendered)
            conn.respond_json(200, {"tokens": ids, "count": len(ids), "max_model_len": self.context_length})
            return
        text = body.get("prompt", body.get("text", "")) if not self.s.strict else body["prompt"]
        if isinstance(text, list):
            ids = [tokenizer.token_ids(str(t)) for t in text]
            conn.respond_json(200, {"tokens": ids, "count": [len(i) for i in ids],
                                    "max_model_len": self.context_length})
            return
        ids = tokenizer.token_ids(str(text))
        self._remember(ids, str(text))
        conn.respond_json(200, {"tokens": ids, "count": len(ids), "max_model_len": self.context_length})

    def _remember(self, ids: list[int], text: str) -> None:
        """Keep the text behind token ids (the stand-in's ids cannot be decoded), oldest forgotten first."""
        self._rendered[stable_hash(tuple(ids))] = text
        while len(self._rendered) > RENDERED_CACHE:
            del self._rendered[next(iter(self._rendered))]

    def _text_of_ids(self, ids: list) -> str:
        """The text a list of `input_ids` came from (via /tokenize), or a stand-in text of its length."""
        if not ids or not all(isinstance(i, int) for i in ids):
            raise ValueError("input_ids must be a non-empty list of integers")
        key = stable_hash(tuple(ids))
        return self._rendered.get(key) or " ".join(f"t{key % 9973}x{i}" for i in range(len(ids)))

    def _stats(self, conn: Connection, req: HttpRequest) -> None:
        rows = [{"rid": r.rid, "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                 "spec_verify_ct": r.verify_ct if self.spec else None, "steps": r.steps,
                 "arrival_ts": r.arrival_ts, "first_token_ts": r.first_token_ts,
                 "last_token_ts": r.last_token_ts, "finished": r.done, "cancelled": r.cancelled}
                for r in self.records]
        conn.respond_json(200, {"simulated": True, "since_ts": self.reset_ts, "requests": rows,
                                "expected_accept_length": expected_accept_length(self.s.params, self.s.knobs)})

    def _reset(self, conn: Connection, req: HttpRequest) -> None:
        self.records = []
        self.reset_ts = time.time()
        conn.respond_json(200, {"ok": True, "simulated": True})

    # ----------------------------------------------------------------- generation
    def _new_request(self, prompt: str, max_new: int, ignore_eos: bool, answer: str | None = None,
                     record: bool = True) -> GenRequest:
        seed = self.s.seed
        if answer is not None:
            all_pieces = tokenizer.pieces(answer)
            pieces, finish = all_pieces[:max_new], ("length" if len(all_pieces) > max_new else "stop")
        else:
            n = max_new if ignore_eos else min(max_new, natural_length(seed, prompt))
            lossy = bool(self.s.fault("lossy")) and self.spec and is_lossy_prompt(seed, prompt)
            pieces = generate_pieces(seed, prompt, n, lossy)
            finish = "length" if n >= max_new else "stop"
        if not pieces:
            pieces, finish = [" "], "stop"
        eos_at = natural_length(seed, prompt) if ignore_eos and answer is None else None
        sampler = AcceptanceSampler(self.s.params, self.s.knobs, seed, stable_hash(prompt), prompt_kind(prompt),
                                    eos_at, self._always_accepted(prompt, record))
        return GenRequest(rid=uuid.uuid4().hex, prompt=prompt, prompt_tokens=max(1, tokenizer.count(prompt)),
                          pieces=pieces, finish_type=finish, max_new_tokens=max_new, sampler=sampler,
                          on_step=lambda r, t: None, on_done=lambda r: None, record=record,
                          cached_tokens=self._cache.lookup(prompt) if record else 0)

    def _always_accepted(self, prompt: str, record: bool) -> int | None:
        """Tokens accepted per step when every draft agrees with the target: STANDALONE drafting with the target
        itself, and NGRAM on a prompt its store (shared by every request of the server) has seen; else None."""
        knobs = self.s.knobs
        if knobs.algorithm == "STANDALONE" and self.s.server_args.get("speculative_draft_model_path") in (
                None, self.s.model_path):
            return min(int(knobs.budget or 0), int(knobs.block_size or 1) - 1) + 1
        if knobs.algorithm == "NGRAM":
            key = stable_hash(prompt)
            seen = key in self._ngram_store
            if record:
                self._ngram_store.add(key)
            return int(knobs.block_size or 1) if seen else None
        return None

    def _admit_generate(self, conn: Connection) -> tuple[bool, bool, bool]:
        """Apply request-level faults; returns (handled, malformed, cut)."""
        self.generate_count += 1
        crash = self.s.fault("crash-after")
        if crash and self.generate_count >= int(crash.arg or 1):
            asyncio.get_running_loop().call_later(
                0.05, self._crash, f"Simulated crash after {self.generate_count} generate requests [simulated fault]")
        raising = self.s.fault("engine-exception")
        if raising and self.generate_count == int(raising.arg or 1):
            self._engine_exception()
        hang = self.s.fault("hang")
        if hang and self.generate_count > int(hang.arg or 0):
            if not self.hung:
                log(f"Scheduler stopped after {self.generate_count - 1} generate requests: no request in flight or "
                    "to come gets another token, /health still answers [simulated fault hang]")
                self.hung = True
            return True, False, False
        draws = {k: rng.random() for k, rng in self._fault_rngs.items()}
        err = self.s.fault("error-rate")
        if err and draws["error-rate"] < float(err.arg or 0):
            conn.respond_json(500, {"error": {"message": "simulated internal server error"}, "simulated": True})
            return True, False, False
        mal = self.s.fault("malformed-rate")
        cut = self.s.fault("cut-stream-rate")
        return (False, bool(mal and draws["malformed-rate"] < float(mal.arg or 0)),
                bool(cut and draws["cut-stream-rate"] < float(cut.arg or 0)))

    def _meta(self, req: GenRequest) -> dict:
        meta: dict[str, Any] = {"id": req.rid, "finish_reason": req.finish_reason(),
                                "prompt_tokens": req.prompt_tokens, "weight_version": "default", "num_retractions": 0,
                                "reasoning_tokens": 0, "completion_tokens": req.completion_tokens,
                                "cached_tokens": req.cached_tokens,
                                "cached_tokens_details": {"device": req.cached_tokens, "host": 0}, "dp_rank": None}
        if meta["finish_reason"] is not None:  # SGLang sends e2e_latency with the finished request only
            meta["e2e_latency"] = (req.last_token_ts or req.arrival_ts) - req.arrival_ts
        if self.spec:
            draft_tokens = (self.s.knobs.block_size or 1) - 1
            meta["spec_verify_ct"] = req.verify_ct
            meta["spec_accept_length"] = req.completion_tokens / req.verify_ct if req.verify_ct else 0.0
            meta["spec_num_correct_drafts"] = max(0, req.completion_tokens - req.verify_ct)
            meta["spec_num_proposed_drafts"] = req.verify_ct * draft_tokens
            meta["spec_accept_rate"] = (meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"]
                                        if meta["spec_num_proposed_drafts"] else 0.0)
            # steps by number of correct drafts (index k: k drafts accepted), to the largest count seen
            histogram = [0] * (max(req.correct_drafts, default=0) + 1)
            for count in req.correct_drafts:
                histogram[count] += 1
            meta["spec_correct_drafts_histogram"] = histogram
            # the names SGLang marks "remove in next release", still sent beside the new ones
            meta.update(spec_accepted_drafts=meta["spec_num_correct_drafts"],
                        spec_proposed_drafts=meta["spec_num_proposed_drafts"], spec_accept_histogram=list(histogram))
        return meta

    def _generate(self, conn: Connection, req: HttpRequest) -> None:
        body = req.json()
        text = body.get("text")
        if text is None and body.get("input_ids") is not None:
            text = self._text_of_ids(body["input_ids"])
        if text is None:
            raise ValueError("only 'text' or 'input_ids' input is supported by the stand-in")
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        ignore_eos = bool(sp.get("ignore_eos", False))
        stream = bool(body.get("stream", False))
        if isinstance(text, list) and stream:
            raise ValueError("streaming a batch of prompts is not supported by the stand-in")
        handled, malformed, cut = self._admit_generate(conn)
        if handled:
            return
        prompts = text if isinstance(text, list) else [text]
        gens = [self._new_request(str(p), max_new, ignore_eos) for p in prompts]
        self._log_prompts(prompts)
        new = None if sp.get("max_new_tokens") is None else max_new  # SGLang checks only a number asked for
        if self._refused_too_long(conn, max(g.prompt_tokens for g in gens), new, stream, openai=False):
            return
        every = self.s.fault("abort-every")
        aborted = bool(every and self.generate_count % max(1, int(every.arg or 1)) == 0)
        if aborted and not stream:  # SGLang raises an HTTPException for a non-streamed abort
            conn.respond_json(ABORT_STATUS, {"detail": ABORT_MESSAGE})
            return
        conn.on_close = lambda: [setattr(g, "cancelled", True) for g in gens]
        if stream:
            gen = gens[0]
            gen.cut_at = max(1, len(gen.pieces) // 2) if cut else None
            gen.abort_at = max(1, len(gen.pieces) // 2) if aborted else None
            gen.malformed_at = max(1, len(gen.pieces) // 2) if malformed else None
            conn.start_stream()
            gen.on_step = lambda r, t: self._native_chunk(conn, r, t)
            gen.on_done = lambda r: self._native_done(conn)
        else:
            remaining = [len(gens)]

            def done(_: GenRequest) -> None:
                remaining[0] -= 1
                if remaining[0]:
                    return
                outs = [{"text": g.text, "output_ids": tokenizer.token_ids(g.text)[:g.completion_tokens],
                         "meta_info": self._meta(g), "simulated": True} for g in gens]
                if cut:
                    conn.abort()
                elif malformed:
                    conn.respond(200, json.dumps(outs[0]).encode()[: 20])
                else:
                    conn.respond_json(200, outs if isinstance(text, list) else outs[0])

            for g in gens:
                g.on_done = done
        stall = self.s.fault("stall-every")
        every_n, _, seconds = (stall.arg or "1").partition(",") if stall else ("", "", "")
        if stall and self.generate_count % max(1, int(every_n)) == 0:  # held back before the scheduler sees it
            delay = float(seconds or STALL_S)
            log(f"Holding generate request {self.generate_count} for {delay:g} s [simulated fault stall-every]")
            asyncio.get_running_loop().call_later(delay, lambda: [self._submit(g) for g in gens])
            return
        for g in gens:
            self._submit(g)

    def _drift(self) -> float:
        """The step-time factor of `drift:RATE`: 1 + RATE per second since the busy period's first decode step (it
        ends after DRIFT_RESET_IDLE_S idle): a server slowing down under load, so a cell never settles."""
        if not (drift := self.s.fault("drift")):
            return 1.0
        self._drift_t0 = self._drift_t0 or time.monotonic()
        return 1.0 + float(drift.arg or 0.5) * (time.monotonic() - self._drift_t0)

    def _log_prompts(self, prompts: list) -> None:
        """Append what the model received to the prompt log (--sim-prompt-log), for tests that audit prompts."""
        if self.s.prompt_log:
            with open(self.s.prompt_log, "a", encoding="utf-8") as handle:
                handle.write("".join(json.dumps({"text": str(p)}) + "\n" for p in prompts))

    def _native_chunk(self, conn: Connection, req: GenRequest, new_text: str) -> None:
        """Stream one native chunk; the text is JSON-escaped once per step and appended, not re-encoded whole."""
        req.text_json += encode_basestring_ascii(new_text).encode()[1:-1]
        if req.abort_at is not None and req.completion_tokens >= req.abort_at:
            req.cancelled = True
            meta = {**self._meta(req), "finish_reason": {"type": "abort", "message": ABORT_MESSAGE,
                                                         "status_code": ABORT_STATUS, "err_type": None},
                    "e2e_latency": (req.last_token_ts or req.arrival_ts) - req.arrival_ts}
            conn.end_stream(b'data: {"text": "' + req.text_json + b'", "meta_info": ' + json.dumps(meta).encode() +
                            b', "simulated": true}\n\ndata: [DONE]\n\n')
            return
        if req.cut_at is not None and req.completion_tokens >= req.cut_at:
            req.cancelled = True
            conn.abort()
            return
        if req.malformed_at is not None and req.completion_tokens >= req.malformed_at:
            req.malformed_at = None
            conn.send_chunk(b'data: {"text": "' + req.text[:8].encode() + b'", "meta_info": {\n\n')
            return
        meta = json.dumps(self._meta(req)).encode()
        conn.send_chunk(b'data: {"text": "' + req.text_json + b'", "meta_info": ' + meta +
                        b', "simulated": true}\n\n')

    def _native_done(self, conn: Connection) -> None:
        conn.end_stream(b"data: [DONE]\n\n")

def _load_simulated_answer() -> Callable[[list[dict], int], str | None] | None:
    """The coding stand-in's answer function, when that module is installed."""
    try:
        module = importlib.import_module("ddsweep.sim.coding")
    except ImportError:
        return None
    return getattr(module, "simulated_answer", None)


def run(settings: SimSettings) -> int:
    """Run the stand-in until it is shut down (uvloop when available); returns the exit code."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(SimServer(settings).serve())
    return uvloop.run(SimServer(settings).serve())
