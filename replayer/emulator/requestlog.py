"""The request log: ground truth for tests, one JSON object per line.

Every line has ``event`` and ``t`` (Unix time, float seconds). Lines are
written with one ``write`` on an unbuffered file the moment the event
happens, so a reader polling the file sees them in order and never a torn
line. The order of ``request`` lines is the order in which the server read
the requests.

``event: "request"``: one per received generation request (``POST
/v1/chat/completions`` or ``/v1/completions``), written when the request
reached the engine, or when it was rejected before that:

    seq            1-based arrival number among all logged requests
    n              arrival number at the engine (the ``request`` fault variable);
                   null if rejected before the engine
    request_id     the X-Request-Id header, or null
    engine_id      vLLM's engine-internal id (``chatcmpl-<id>-<8 hex>``), as in crash dumps
    session        X-Session-Id, else X-Session-Affinity, else X-Correlation-ID, or null
    session_index  ordinal of the session among distinct sessions (0: none)
    turn           ordinal of the request within its session (0: none)
    path, model, stream
    prompt_tokens, cached_tokens, max_tokens (the generation length it will get)
    running, waiting, kv_usage, preemptions   engine state when it arrived
    status, error  set only when rejected: HTTP status and error message (an
                   out-of-vocabulary token id in a stream is rejected in-stream:
                   status 200 and the message)
    body           (``--log-bodies``) the JSON body as received, or
    body_text      (``--log-bodies``) the raw text when it was not JSON
    body_bytes, body_sha256   (``--log-bodies``) size and digest of the raw bytes

``event: "trigger"``: one per evaluation of a fault rule (at each request, or
at each preemption for ``preemption`` rules) while the engine is alive:

    seq, n         the request evaluated (for preemptions: the preempted one)
    on             "request", "preemption" or "abort"
    rule, effect, when    rule name, effect, its conditions as text
    values         the values of the variables the conditions name
    holds          whether all conditions held
    p, draw        the probability and the random draw (null unless holds and p < 1)
    fired          whether the rule fired
    delay          seconds until the effect

``event: "abort"``: a client went away before its answer ended (the
engine drops the request):

    n, engine_id   the request
    output_tokens  tokens it had generated
    delivered      of those, tokens the HTTP handler had taken and written
                   (a chat stream's events are its role event plus one per write)
    aborts         cumulative aborts (the ``abort`` fault variable)

``event: "effect"``: when a fired rule's effect starts: ``rule``, ``effect``,
``params`` and the affected ``n`` (null for engine-wide effects).

This module only formats and writes; it does not decide anything.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson


class RequestLog:
    """Append-only JSON-lines writer; a no-op when ``path`` is None."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fd: int | None = None
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __bool__(self) -> bool:
        return self._fd is not None

    def write(self, event: str, **fields: Any) -> None:
        if self._fd is None:
            return
        line = orjson.dumps({"event": event, "t": time.time(), **fields}) + b"\n"
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
