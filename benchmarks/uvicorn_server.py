"""A FastAPI app on uvicorn (the HTTP stack SGLang serves with) that streams SGLang's `/generate` event shape at a
fixed rate, 4 tokens per 10 ms step per request from its own timer, and keeps the per-request ground truth at
GET /sim/stats (reset by POST /sim/reset), like the stand-in. Used by `bench_client.py --server uvicorn`.

Usage: python benchmarks/uvicorn_server.py PORT
"""

import asyncio
import json
import sys
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from ddsweep.sim import tokenizer as sim_tokenizer


def uvicorn_app() -> Any:
    """A FastAPI app with SGLang's /generate stream shape: 4 tokens per 10 ms step per request, ground truth kept."""
    app = FastAPI()
    rows: list[dict] = []
    since = [time.time()]

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await request.json()
        text = body["prompt"] if "prompt" in body else "".join(m["content"] for m in body["messages"])
        ids = sim_tokenizer.token_ids(text)
        return {"tokens": ids, "count": len(ids), "max_model_len": 262144}

    @app.post("/generate")
    async def generate(request: Request) -> StreamingResponse:
        body = await request.json()
        row = {"arrival_ts": time.time(), "first_token_ts": None, "last_token_ts": None, "completion_tokens": 0,
               "spec_verify_ct": 0, "finished": False}
        rows.append(row)
        total = body["sampling_params"]["max_new_tokens"]
        prompt_tokens = len(body["input_ids"]) if "input_ids" in body else sim_tokenizer.count(body["text"])

        async def events() -> Any:
            loop = asyncio.get_running_loop()
            target = loop.time()
            while row["completion_tokens"] < total:
                target += 0.010
                await asyncio.sleep(max(0.0, target - loop.time()))
                row["completion_tokens"] = min(total, row["completion_tokens"] + 4)
                row["spec_verify_ct"] += 1
                now = time.time()
                row["first_token_ts"] = row["first_token_ts"] or now
                row["last_token_ts"] = now
                done = row["completion_tokens"] >= total
                meta = {"prompt_tokens": prompt_tokens, "completion_tokens": row["completion_tokens"],
                        "spec_verify_ct": row["spec_verify_ct"],
                        "finish_reason": {"type": "length", "length": total} if done else None}
                yield b"data: " + json.dumps({"text": "x" * row["completion_tokens"], "meta_info": meta}).encode() \
                    + b"\n\n"
            row["finished"] = True
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/sim/stats")
    async def stats() -> dict:
        return {"since_ts": since[0], "requests": rows}

    @app.post("/sim/reset")
    async def reset() -> dict:
        rows.clear()
        since[0] = time.time()
        return {"ok": True}

    return app


if __name__ == "__main__":
    uvicorn.run(uvicorn_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
