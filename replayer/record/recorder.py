"""From a proxied exchange to a trace row: ids, sessions, timings, outcome.

The proxy calls :meth:`Recorder.begin` when a recorded request's body is in
(parse it, name it, place it in a session: at arrival, so turn order is
arrival order) and :meth:`Recorder.finish` when the exchange is over (teach
the session tracker its reply, queue it for the writer thread: the proxy
holds the response's end until that row is written). Building the
row (redaction, delta-encoding, compression) happens on the writer thread,
so the event loop only parses and hashes.

Row contents (beyond the columns the format defines):

* ``request_id``: the client's ``X-Request-Id``, else ``<prefix><n>``
  (``rec-000001`` …, per segment); a repeated client id gets ``~2``, ``~3``
  (the client's is kept in ``meta.client_request_id``).
* ``start_us`` = request received, ``end_us`` = the response's end read
  from the upstream (relayed to the client once its row is written),
  ``ttft_us`` = first output event (streams), all µs since the recorder
  started (``provenance.t0_unix_us`` anchors them); ``meta.timing_us`` has
  body-in, upstream response headers, first byte, first token, reply
  (when the session tracker learned it: a stream's ``[DONE]``, before the
  client saw it) and done, relative to the start.
* ``meta.session``: how the session was found (``header``, ``new``,
  ``next``, ``fork``) and ``meta.parent``: the request it extends.
* ``after``: the other sessions' requests this one joins on (a sub-agent's
  answer its tool results carry, the request whose tool call launched it;
  :mod:`replayer.record.sessions`), ``meta.joins`` saying which (``result``
  or ``prompt``).
* ``meta.abandoned``: ``client`` (the client went away mid-exchange) or
  ``shutdown`` (the recorder stopped first); the partial output is kept.
  A client's abort also gets ``meta.abort``: ``after_us`` (from the
  request's start to the disconnect) and, for a stream, ``after_chunks``
  (the SSE data events relayed to the client before it left), where a
  replay disconnects too (:mod:`replayer.replay.aborts`).
* ``meta.failure``: ``connect`` (upstream unreachable: the client got a 502
  from the recorder), ``upstream`` (the upstream broke off mid-response).
* ``meta.headers`` / ``meta.query``: the request's other headers and query
  parameters, credentials removed (see :mod:`replayer.record.redact`); the
  ``path`` column keeps the (redacted) query string too (``?beta=true``), so
  a replay sends it.
* Anthropic Messages (``/v1/messages``) and OpenAI Responses
  (``/v1/responses``) bodies are rows of kind ``messages`` and ``responses``.
  A Responses request that names ``previous_response_id`` is stored with its
  context expanded (the parent's expanded input, the parent's output items,
  then its own input; the id removed), so it replays against a server with no
  response store: ``meta.previous_response_id`` keeps the id and
  ``meta.expanded`` the parent's request id and the items added. When the
  parent was not recorded (before the recorder started, or forgotten past
  ``response_memory`` bytes) the body is stored as sent, with
  ``meta.unexpanded`` saying why.
* A body the recorder cannot read as its API's shape (``messages`` not a
  list of objects, a string ``input``...) is still forwarded and recorded,
  as a ``raw`` row with ``meta.unreadable`` saying why; the recording's
  summary counts them (``raw``).
* ``/v1/messages/count_tokens`` is forwarded, and recorded only when asked
  (``record_count_tokens``): it is not load, and it would interleave with
  the turns of a session. Recorded, each is its own session.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

import orjson

from replayer.options.record import DEFAULT_SESSION_HEADERS
from replayer.record.redact import Redactor
from replayer.record.sessions import Assignment, SessionTracker, Units, input_items
from replayer.trace.model import RequestRecord, kind_of
from replayer.trace.schema import Kind
from replayer.wire import Reply

log = logging.getLogger("replayer.record")

CHAT_PATH = "/v1/chat/completions"
TEXT_PATH = "/v1/completions"
MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
RECORDED_PATHS = frozenset({CHAT_PATH, TEXT_PATH, MESSAGES_PATH, RESPONSES_PATH})
_UNITS: dict[str, Units] = {MESSAGES_PATH: "messages", RESPONSES_PATH: "responses"}
# Not worth a byte per row: transport framing, hop-by-hop headers (RFC 9110
# §7.6.1) and what columns already hold.
_UNSTORED_HEADERS = (
    "host",
    "content-length",
    "expect",
    "x-request-id",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
)


class Sink(Protocol):
    """Where finished exchanges go (:class:`~replayer.record.sink.TraceSink`)."""

    def put(self, item: Exchange) -> int:
        """Queue an exchange; its sequence number (to wait for its row)."""
        ...


@dataclass(slots=True)
class Exchange:
    """One recorded request/response, filled in as it happens (times: monotonic ns)."""

    request_id: str
    path: str
    start_ns: int
    body: dict[str, Any]
    assignment: Assignment
    body_sha256: str
    body_bytes: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    query: list[tuple[str, str]] = field(default_factory=list)
    client_request_id: str | None = None
    body_ns: int | None = None
    upstream_ns: int | None = None
    first_byte_ns: int | None = None
    first_token_ns: int | None = None
    end_ns: int | None = None
    status: int | None = None
    stream: bool = False
    reply: Reply | None = None
    response_bytes: int = 0
    error: str | None = None
    failure: str | None = None
    """``connect`` or ``upstream`` (see the module docstring)."""
    abandoned: str | None = None
    """``client`` or ``shutdown``."""
    delivered: int = 0
    """Streamed events relayed whole to the client (``meta.abort.after_chunks``)."""
    settled_ns: int | None = None
    """When the tracker learned the reply (at ``[DONE]``, before the client saw it)."""
    notes: dict[str, Any] = field(default_factory=dict)
    """What the recorder did to the body (``expanded``, ``unexpanded``, ...): ``meta``."""
    queued: bool = False
    """Handed to the writer thread: final, and no longer to be touched."""

    @property
    def ok(self) -> bool:
        r = self.reply
        return (
            self.status == 200
            and self.error is None
            and self.abandoned is None
            and (r is None or r.error is None)
        )


class Recorder:
    """Names, places and stores exchanges (the proxy's recording half).

    **Usage**::

        rec = Recorder(Redactor(), sink=sink, t0_ns=time.monotonic_ns())
        ex = rec.begin(path=..., raw=raw, sha256=digest, start_ns=t, headers=..., query=...)
        ...
        rec.finish(ex)
    """

    def __init__(
        self,
        redactor: Redactor,
        *,
        sink: Sink | None = None,
        t0_ns: int,
        session_headers: Iterable[str] = DEFAULT_SESSION_HEADERS,
        id_prefix: str = "rec-",
        tracker: SessionTracker | None = None,
        record_count_tokens: bool = False,
        response_memory: int = 256 << 20,
    ) -> None:
        self.sink = sink
        self.redactor = redactor
        self.t0_ns = t0_ns
        self.session_headers = tuple(session_headers)
        self.id_prefix = id_prefix
        self.tracker = tracker or SessionTracker()
        self._ids: set[str] = set()
        self._n = 0
        self.recorded = 0
        """Exchanges handed to the writer."""
        self.failed = 0
        """Of those, exchanges that did not succeed (error status, error event, cut, abandoned)."""
        self.unrecorded = 0
        """Requests to a recorded path whose body was not a JSON object (forwarded only)."""
        self.raw = 0
        """Recorded as raw rows: bodies not in their API's shape (``meta.unreadable``)."""
        self.unexpanded = 0
        """Responses requests whose ``previous_response_id`` named no recorded response."""
        self.paths = RECORDED_PATHS | ({COUNT_TOKENS_PATH} if record_count_tokens else set())
        """The POST paths that are recorded (the rest are forwarded only)."""
        self._responses: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        """Responses: response id -> (request id, JSON of the context that
        continues it: its expanded input and its output items)."""
        self._response_bytes = 0
        self.response_memory = response_memory

    def begin(
        self,
        *,
        path: str,
        raw: bytes,
        sha256: str,
        start_ns: int,
        headers: Mapping[str, str],
        query: Iterable[tuple[str, str]] = (),
        body_ns: int | None = None,
    ) -> Exchange | None:
        """Parse and place a request; None when its body is not a JSON object."""
        body: Any = None
        with contextlib.suppress(orjson.JSONDecodeError, zlib.error):
            enc = headers.get("Content-Encoding", "").lower()
            if enc in ("gzip", "x-gzip", "deflate"):  # compressed request: decoded to be read
                raw = zlib.decompress(raw, zlib.MAX_WBITS | 32)
            body = orjson.loads(raw)
        if not isinstance(body, dict):
            self.unrecorded += 1
            if self.unrecorded == 1:
                log.warning(
                    "a request to %s had no JSON object body: forwarded, not recorded", path
                )
            return None
        client_id = headers.get("X-Request-Id") or None
        rid = self._request_id(client_id)
        session = next((v for h in self.session_headers if (v := headers.get(h))), None)
        notes: dict[str, Any] = {}
        parent = self._expand(body, notes) if path == RESPONSES_PATH else None
        if path in _UNITS and kind_of(body, path) is Kind.RAW:
            notes["unreadable"] = _unreadable(path, body)
            self.raw += 1
        if path == COUNT_TOKENS_PATH:
            assignment = self.tracker.assign(rid, None, session)  # not a turn
        else:
            api = _UNITS.get(path, "chat")
            assignment = self.tracker.assign(rid, body, session, api=api, parent=parent)
        return Exchange(
            request_id=rid,
            path=path,
            start_ns=start_ns,
            body=body,
            assignment=assignment,
            body_sha256=sha256,
            body_bytes=len(raw),
            headers=list(headers.items()),
            query=list(query),
            client_request_id=client_id,
            body_ns=body_ns,
            stream=body.get("stream") is True,
            notes=notes,
        )

    def _expand(self, body: dict[str, Any], notes: dict[str, Any]) -> str | None:
        """Expand a chained Responses body in place; the parent's request id."""
        prev = body.get("previous_response_id")
        if not isinstance(prev, str) or not prev:
            return None
        notes["previous_response_id"] = prev
        held = self._responses.get(prev)
        own = input_items(body.get("input"))
        if held is None or own is None:
            self.unexpanded += 1
            notes["unexpanded"] = (
                "the previous response was not recorded"
                if held is None
                else "input is neither a list nor a string"
            )
            return None
        parent_rid, context = held
        self._responses.move_to_end(prev)
        items = orjson.loads(context)
        notes["expanded"] = {"parent": parent_rid, "items": len(items)}
        # the chained body, as it would have been sent to a server with no store
        expanded = {}
        for k, v in body.items():
            if k == "previous_response_id":
                continue
            expanded[k] = [*items, *own] if k == "input" else v
        body.clear()
        body.update(expanded)
        return parent_rid

    def _remember_response(self, ex: Exchange, reply: Reply) -> None:
        """Keep what a request chained to this response continues from."""
        rid = reply.response_id
        if rid is None or not ex.ok:
            return
        own = input_items(ex.body.get("input"))
        if own is None:
            return
        context = orjson.dumps([*own, *(reply.output_items or self._reply_items(reply))])
        old = self._responses.pop(rid, None)
        if old is not None:
            self._response_bytes -= len(old[1])
        self._responses[rid] = (ex.request_id, context)
        self._response_bytes += len(context)
        while self._response_bytes > self.response_memory and self._responses:
            _, (_, gone) = self._responses.popitem(last=False)
            self._response_bytes -= len(gone)

    def _request_id(self, client_id: str | None) -> str:
        if client_id:
            rid = client_id
        else:
            self._n += 1
            rid = f"{self.id_prefix}{self._n:06d}"
        if rid in self._ids:
            k = 2
            while f"{rid}~{k}" in self._ids:
                k += 1
            rid = f"{rid}~{k}"
        self._ids.add(rid)
        return rid

    def settle(self, ex: Exchange, reply: Reply, now_ns: int) -> None:
        """The reply is complete (a stream's ``[DONE]`` was read): make it
        matchable now, before the client sees it and sends its next turn
        (the stream's last bytes may still be in transit)."""
        if ex.settled_ns is None:
            ok = ex.status == 200 and reply.error is None
            self.tracker.complete(ex.request_id, self._reply_of(ex, reply), ok=ok)
            ex.settled_ns = now_ns

    def _reply_of(self, ex: Exchange, r: Reply | None) -> Any:
        """The reply in the shape the session tracker matches for the path."""
        if r is not None and ex.path == RESPONSES_PATH:
            self._remember_response(ex, r)
        if r is None or (r.text is None and not r.tool_calls and not r.output_items):
            return None
        if ex.path == CHAT_PATH:
            return r.message()
        if ex.path == MESSAGES_PATH:
            blocks: list[Any] = [{"type": "text", "text": r.text}] if r.text else []
            return {"role": "assistant", "content": blocks + list(r.tool_calls or [])}
        if ex.path == RESPONSES_PATH:
            return r.output_items or self._reply_items(r)
        return r.text

    @staticmethod
    def _reply_items(r: Reply) -> list[Any]:
        """Responses output items rebuilt from the text and calls (when the
        terminal event carried none)."""
        items: list[Any] = []
        if r.text:
            content = [{"type": "output_text", "text": r.text}]
            items.append({"type": "message", "role": "assistant", "content": content})
        return items + list(r.tool_calls or [])

    def finish(self, ex: Exchange) -> int:
        """The exchange is over: teach the tracker its reply and queue the row;
        the sink's sequence number for it."""
        if self.sink is None:
            raise RuntimeError("recorder has no sink")
        if ex.queued:
            raise RuntimeError(f"exchange {ex.request_id} finished twice")
        if ex.settled_ns is None:
            self.tracker.complete(ex.request_id, self._reply_of(ex, ex.reply), ok=ex.ok)
            ex.settled_ns = ex.end_ns
        self.recorded += 1
        if not ex.ok:
            self.failed += 1
        ex.queued = True
        return self.sink.put(ex)

    # -- on the writer thread ----------------------------------------------------

    def build(self, ex: Exchange) -> RequestRecord:
        """The row for an exchange (redacted); runs on the writer thread."""
        red = self.redactor
        body, masked = red.body(ex.body)
        r = ex.reply or Reply()
        a = ex.assignment

        def rel(ns: int | None) -> int | None:
            return None if ns is None else (ns - ex.start_ns) // 1000

        meta: dict[str, Any] = {"session": a.source}
        if a.parent is not None:
            meta["parent"] = a.parent
        if a.joins:
            meta["joins"] = dict(a.joins)
        if ex.client_request_id is not None and ex.client_request_id != ex.request_id:
            meta["client_request_id"] = red.text(ex.client_request_id)
        timing = {
            "body": rel(ex.body_ns),
            "upstream_headers": rel(ex.upstream_ns),
            "first_byte": rel(ex.first_byte_ns),
            "first_token": rel(ex.first_token_ns),
            "reply": rel(ex.settled_ns),
            "done": rel(ex.end_ns),
        }
        meta["timing_us"] = {k: v for k, v in timing.items() if v is not None}
        if ex.abandoned:
            meta["abandoned"] = ex.abandoned
        if ex.abandoned == "client":
            abort = {"after_us": rel(ex.end_ns) or 0}
            if ex.stream:
                abort["after_chunks"] = ex.delivered
            meta["abort"] = abort
        if ex.failure:
            meta["failure"] = ex.failure
        if r.error_type is not None:
            meta["error_type"] = r.error_type
        if r.error_code is not None:
            meta["error_code"] = r.error_code
        if r.reasoning:
            meta["reasoning"] = red.text(r.reasoning)
        if ex.stream:
            meta["events"] = r.events
            meta["done_event"] = r.done
        if r.choices > 1:
            meta["choices"] = r.choices
        if r.truncated:
            meta["response_unparsed"] = True
        if r.bad:
            meta["unparsed_events"] = r.bad
        meta["response_bytes"] = ex.response_bytes
        skip = _UNSTORED_HEADERS + self.session_headers
        headers = red.headers(ex.headers, skip=skip)
        if headers:
            meta["headers"] = headers
        if ex.query:
            meta["query"] = red.query(ex.query)
        if masked:
            meta["masked_fields"] = masked
        meta.update(ex.notes)
        path = ex.path
        if ex.query:
            path += "?" + urlencode(red.query(ex.query))
        error = ex.error or r.error
        ttft = rel(ex.first_token_ns) if ex.stream else None
        return RequestRecord.from_body(
            body,
            request_id=ex.request_id,
            session_id=a.session_id,
            turn=a.turn,
            start_us=(ex.start_ns - self.t0_ns) // 1000,
            end_us=None if ex.end_ns is None else (ex.end_ns - self.t0_ns) // 1000,
            path=path,
            base_hint=a.parent,
            after=a.after,
            body_sha256=ex.body_sha256,
            status=ex.status,
            ttft_us=ttft,
            finish_reason=r.finish_reason,
            output_text=red.text(r.text) if r.text is not None and red.active else r.text,
            output_tool_calls=red.value(r.tool_calls) if r.tool_calls else None,
            usage_prompt_tokens=r.prompt_tokens,
            usage_completion_tokens=r.completion_tokens,
            usage_cached_tokens=r.cached_tokens,
            input_tokens=r.prompt_tokens,
            error=red.text(error) if error is not None else None,
            meta=meta,
        )


def _unreadable(path: str, body: dict[str, Any]) -> str:
    """Why a body to an agent API was stored raw."""
    key = "messages" if path == MESSAGES_PATH else "input"
    v = body.get(key)
    if v is None:
        return f"no {key}"
    if not isinstance(v, list):
        return f"{key} is a {type(v).__name__}, not a list"
    return f"{key} holds items that are not JSON objects"
