"""Error objects as servers send them, in bodies and inside streams.

One reading for every shape a client may meet (VLLM.md §2.2, §4.1): the
OpenAI envelope ``{"error": {"message", "type", "param", "code"}}`` (vLLM
>= 0.10.1, and Anthropic's ``{"type": "error", "error": {...}}``), vLLM's
older flat ``{"object": "error", "message", ...}``, the Responses API's flat
``{"type": "error", "code", "message"}``, a bare ``{"error": "text"}``
(vLLM's 401) and FastAPI's ``{"detail": ...}`` (unknown routes). An
``"error": null`` field is not an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What an error object says."""

    message: str
    """Its ``message`` (the object as JSON when it has no string message)."""
    type: str | None = None
    code: Any = None
    """As sent: vLLM's are HTTP statuses (ints), others send strings."""


def error_info(obj: dict[str, Any]) -> ErrorInfo | None:
    """The error an object carries, or None (a stream event or a body)."""
    err = obj.get("error")
    if isinstance(err, dict):
        src: dict[str, Any] = err
    elif isinstance(err, str):
        return ErrorInfo(err)
    elif obj.get("object") == "error" or obj.get("type") == "error":
        src = obj  # flat: vLLM < 0.10.1, or the Responses API's error event
    else:
        return None
    msg = src.get("message")
    kind = src.get("type")
    return ErrorInfo(
        msg if isinstance(msg, str) else orjson.dumps(src).decode(),
        kind if isinstance(kind, str) and kind != "error" else None,
        src.get("code"),
    )


def error_message(payload: bytes, limit: int = 2000) -> str:
    """The message of an error body (any shape above, or its text)."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload[:500].decode(errors="replace")
    if isinstance(obj, dict):
        info = error_info(obj)
        if info is not None:
            return info.message[:limit]
        if "detail" in obj:
            return str(obj["detail"])[:limit]
    return payload[:500].decode(errors="replace")
