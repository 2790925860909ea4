"""What an SGLang server says when it refuses a request: read by the benchmark's transport and the coding eval."""

from __future__ import annotations

import json


def stream_error(data: bytes) -> str | None:
    """The message of an error event SGLang streams in place of a chunk (`{"error": {"message": ...}}`, sent when
    a streamed request is refused, e.g. a prompt past the context length) or of an error answer's body: SGLang's
    `{"object": "error", "message": ...}` (its HTTPException handler), FastAPI's `{"detail": ...}`; else None."""
    try:
        doc = json.loads(data)
        error = doc.get("error") or doc.get("detail") or (doc.get("message") if doc.get("object") == "error" else None)
    except (ValueError, AttributeError):
        return None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error) if error else None
