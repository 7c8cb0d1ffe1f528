"""Session inference for recorded traffic: which earlier request does this one continue?

Agents send no session ids, but they do send their whole conversation every
turn: turn N+1's ``messages`` are turn N's messages, then turn N's reply (the
assistant message, content and/or tool calls), then what happened since
(tool results, the user's next message). So a request *continues* the
earlier exchange E whose messages plus E's reply are a prefix of its own
messages. The rules, in order:

1. A session header (``X-Session-Id`` …) names the session outright; the turn
   is the session's next index. Content matching still runs, only to find a
   delta base.
2. Otherwise the *parent* is the earlier completed exchange with the longest
   match: its messages + its reply (successful or partial), or — for an
   exchange that failed or was abandoned — its messages alone (a retry, or
   the agent moving on without the lost reply). Text completions follow the
   same rule on strings: an earlier prompt + its completion text.
3. If the parent is the latest request of its session, the request joins
   that session as its next turn. If the session has already moved on (the
   parent was continued before), the request is a **fork**: a new session
   (turn 0) that shares the parent's prefix, delta-encoded against it.
4. No parent: a new session.

Inferred sessions are named ``s-<request id of their first request>``, so
names are stable and unique without a counter.

The same rule serves the agent-native APIs: an Anthropic Messages request's
unit is a message of ``messages`` (its reply: the assistant message of text
and ``tool_use`` blocks), an OpenAI Responses request's a ``input`` item (its
reply: the output items, a message and/or function calls). A Responses
request's ``previous_response_id`` names its parent outright (see
:meth:`SessionTracker.assign`'s ``parent``). Each API hashes in its own
namespace, so a chat request never continues a Messages one.

Matching must survive the client re-serializing what it sends back, so each
message is compared in a normalized form: parsed JSON with sorted keys,
``content`` ``null``/missing/``""`` equal, surrounding whitespace ignored,
text parts joined, tool-call arguments compared as parsed JSON (and ``""`` as
``{}``), tool-call ids and bookkeeping keys (``refusal``, ``annotations``,
``reasoning``, ``cache_control`` …) ignored; Messages ``thinking`` blocks
and Responses ``reasoning`` items (opaque, signed or encrypted state that
a client may drop or keep) take no part. Each request is hashed once,
message by message, into a running digest, and each prefix digest is looked
up in a dict: O(request size) per request, whatever the number of sessions.
Text prompts are grouped by their first characters and hashed incrementally
at the candidate lengths of their group (one pass over the prompt).

**Joins** (the ``after`` column) are found the same way, from the bodies,
and only where the text leaves no doubt (see :class:`TextIndex`):

* *fan-in*: a request's new tool results (those after its last assistant
  message: chat ``role: tool`` content, Messages ``tool_result`` blocks,
  Responses ``function_call_output`` items) that contain the final answer
  (reply text, no tool calls, at least 32 characters) of another session's
  exchange, still that session's latest, join on it: a sub-agent's answer
  handed back to its parent (Claude Code's Task tool returns the sub-agent's
  last text).
* *fan-out*: a session's first request whose first user message contains
  the ``prompt``, ``input`` or ``task`` argument (at least 32 characters)
  of a tool call in another session's reply joins on that exchange: the
  parent request that launched the sub-agent (Claude Code's Task/Agent
  ``prompt``, an OpenAI Agents SDK agent-as-tool's ``input``).

Text held by two different exchanges is ambiguous and joins nothing.

This module decides; it does not read the network, store rows or keep
bodies (only digests, bounded by ``memory`` entries, oldest forgotten first).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson

Source = Literal["header", "new", "next", "fork", "chain"]
Units = Literal["chat", "messages", "responses"]
_GROUP = 32  # text prompts are indexed by their first _GROUP characters
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_PART_IGNORED = frozenset({"cache_control"})


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where a request goes: its session, turn and the request it continues."""

    session_id: str
    turn: int
    source: Source
    """``header``: named by a header; ``new``: first of an inferred session;
    ``next``: next turn of its parent's session; ``fork``: a new session
    branching from its parent."""
    parent: str | None = None
    """request id of the earlier exchange this one extends (its delta base)."""
    joins: tuple[tuple[str, str], ...] = ()
    """Other sessions' exchanges this one waits for, each with why: (request
    id, ``result`` (it carries their answer) or ``prompt`` (they launched it))."""

    @property
    def after(self) -> list[str] | None:
        """The ``after`` column: the joined request ids (None: no join)."""
        return [rid for rid, _ in self.joins] or None


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return repr(obj).encode()


def _norm_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        parts: list[Any] = []
        for p in content:
            if isinstance(p, dict) and p.get("type") in _TEXT_PART_TYPES:
                text = p.get("text")
                if isinstance(text, str):
                    parts.append(text)
                    continue
            if isinstance(p, dict):
                parts.append(
                    {k: v for k, v in p.items() if v is not None and k not in _PART_IGNORED}
                )
            else:
                parts.append(p)
        if all(isinstance(p, str) for p in parts):
            return "".join(parts).strip()
        return parts
    return content


def _norm_arguments(args: Any) -> Any:
    if isinstance(args, str):
        s = args.strip()
        if not s:
            return {}
        try:
            return orjson.loads(s)
        except orjson.JSONDecodeError:
            return s
    return {} if args is None else args


def _norm_function(fn: Any) -> Any:
    if not isinstance(fn, dict):
        return fn
    return {"name": fn.get("name"), "arguments": _norm_arguments(fn.get("arguments"))}


def _norm_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    return _norm_function(call.get("function"))


def norm_message(message: Any) -> bytes:
    """The canonical bytes of one chat message, for matching only (never stored)."""
    if not isinstance(message, dict):
        return _dumps(message)
    role = message.get("role")
    out: dict[str, Any] = {"role": role}
    content = _norm_content(message.get("content"))
    if content:
        out["content"] = content
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [_norm_call(c) for c in calls]
    fc = message.get("function_call")
    if isinstance(fc, dict):
        out["function_call"] = _norm_function(fc)
    if role != "assistant":
        for key in ("tool_call_id", "name"):
            v = message.get(key)
            if v is not None:
                out[key] = v
    return _dumps(out)


_SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
_BOOKKEEPING = frozenset({"id", "status", "cache_control"})


def _text_of(content: Any) -> Any:
    """Text parts joined and stripped; other parts normalized in place."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if not isinstance(content, list):
        return content
    parts: list[Any] = []
    for p in content:
        if not isinstance(p, dict):
            parts.append(p)
            continue
        kind = p.get("type")
        if kind in _SKIPPED_BLOCKS:
            continue
        if kind in _TEXT_PART_TYPES and isinstance(p.get("text"), str):
            parts.append(p["text"].strip())
        elif kind == "tool_use":
            parts.append({"call": p.get("name"), "args": p.get("input") or {}})
        elif kind == "tool_result":
            parts.append({"result": p.get("tool_use_id"), "content": _text_of(p.get("content"))})
        else:
            parts.append({k: v for k, v in p.items() if v is not None and k not in _BOOKKEEPING})
    if all(isinstance(p, str) for p in parts):
        return "".join(parts).strip()
    return [p for p in parts if p != ""]


def norm_anthropic(message: Any) -> bytes:
    """The canonical bytes of one Messages message, for matching only."""
    if not isinstance(message, dict):
        return _dumps(message)
    return _dumps({"role": message.get("role"), "content": _text_of(message.get("content"))})


def norm_item(item: Any) -> bytes | None:
    """The canonical bytes of one Responses input or output item, for matching
    only; None for what takes no part (reasoning)."""
    if not isinstance(item, dict):
        return _dumps(item)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "reasoning":
        return None
    if kind == "message":
        return _dumps({"role": item.get("role"), "content": _text_of(item.get("content"))})
    if kind == "function_call":
        return _dumps({"call": item.get("name"), "args": _norm_arguments(item.get("arguments"))})
    if kind == "function_call_output":
        return _dumps({"result": item.get("call_id"), "output": _text_of(item.get("output"))})
    return _dumps({k: v for k, v in item.items() if v is not None and k not in _BOOKKEEPING})


def input_items(value: Any) -> list[Any] | None:
    """A Responses ``input`` as items: a string is one user message (as the
    API reads it); None for anything else."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return value if isinstance(value, list) else None


def _units(api: Units, items: list[Any]) -> list[bytes]:
    """A request's (or reply's) units in canonical bytes, skipped ones left out."""
    if api == "chat":
        return [norm_message(m) for m in items]
    if api == "messages":
        return [norm_anthropic(m) for m in items]
    return [b for b in map(norm_item, items) if b is not None]


def _step(h: Any, item: bytes) -> None:
    # length-prefixed, so no two message sequences hash the same byte stream
    h.update(len(item).to_bytes(8, "little"))
    h.update(item)


def _new_hash(api: Units = "chat") -> Any:
    h = hashlib.blake2b(digest_size=16)
    if api != "chat":
        h.update(api.encode())  # each API matches only its own requests
    return h


JOIN_MIN_CHARS = 32
"""Shortest text a join is found by: shorter answers ("Done.") say nothing."""
_SCAN_LIMIT = 1 << 20  # characters searched of each tool result (or first message)
_STARTS = re.compile(r"(?<![^\W_])(?=\S)")  # where a text may begin: not inside a word
_AMBIGUOUS = ""  # text held by two exchanges: it names neither
_PROMPT_KEYS = ("prompt", "input", "task")
_RESULT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})
_CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})


def _text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class TextIndex:
    """Texts (at least :data:`JOIN_MIN_CHARS` characters, stripped), each
    naming the exchange that produced it, found exactly inside longer texts.

    Keys are a text's first :data:`JOIN_MIN_CHARS` characters; a hit there is
    confirmed by the digest of the whole text, so only digests are kept.
    A text is looked for where a word begins (a result that wraps an answer
    in a line, a tag or a quote still holds it there), which also keeps the
    scan to about one dict lookup per word.
    """

    def __init__(self, memory: int) -> None:
        self.memory = memory
        self._by_anchor: dict[str, dict[tuple[int, bytes], str]] = {}
        self._lru: OrderedDict[tuple[str, int, bytes], None] = OrderedDict()

    def add(self, text: str, rid: str) -> None:
        t = text.strip()
        if len(t) < JOIN_MIN_CHARS:
            return
        anchor, key = t[:JOIN_MIN_CHARS], (len(t), _text_digest(t))
        bucket = self._by_anchor.setdefault(anchor, {})
        old = bucket.get(key)
        bucket[key] = rid if old is None or old == rid else _AMBIGUOUS
        self._lru[(anchor, *key)] = None
        self._lru.move_to_end((anchor, *key))
        while len(self._lru) > self.memory:
            (a, n, d), _ = self._lru.popitem(last=False)
            b = self._by_anchor.get(a)
            if b is not None:
                b.pop((n, d), None)
                if not b:
                    del self._by_anchor[a]

    def find(self, text: str) -> list[str]:
        """The exchanges whose text ``text`` contains, in order of position."""
        hits: list[str] = []
        if not self._by_anchor or len(text) < JOIN_MIN_CHARS:
            return hits
        end = min(len(text), _SCAN_LIMIT) - JOIN_MIN_CHARS + 1
        for m in _STARTS.finditer(text, 0, end):
            i = m.start()
            bucket = self._by_anchor.get(text[i : i + JOIN_MIN_CHARS])
            if bucket is None:
                continue
            for (n, d), rid in bucket.items():
                whole = rid and rid not in hits and i + n <= len(text)
                if whole and _text_digest(text[i : i + n]) == d:
                    hits.append(rid)
        return hits


def _plain(content: Any) -> str:
    """The text of a message's or result's content: a string, or its text
    parts one per line."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(t for t in parts if isinstance(t, str))
    return ""


def _assistant(api: Units, item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    return item.get("role") == "assistant" or (
        api == "responses" and item.get("type") in _CALL_ITEMS
    )


def new_results(api: Units, items: list[Any]) -> list[str]:
    """The texts of the tool results a request adds since its last assistant
    message (earlier ones were its previous turns' to join on)."""
    last = max((i for i, m in enumerate(items) if _assistant(api, m)), default=-1)
    out: list[str] = []
    for m in items[last + 1 :]:
        if not isinstance(m, dict):
            continue
        if api == "chat" and m.get("role") in ("tool", "function"):
            out.append(_plain(m.get("content")))
        elif api == "messages" and m.get("role") == "user" and isinstance(m.get("content"), list):
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out.append(_plain(b.get("content")))
        elif api == "responses" and m.get("type") in _RESULT_ITEMS:
            out.append(_plain(m.get("output")))
    return out


def first_user_text(items: list[Any]) -> str:
    """The text of a conversation's first user message ("" when none)."""
    for m in items:
        if isinstance(m, dict) and m.get("role") == "user":
            return _plain(m.get("content"))
    return ""


def final_text(api: Units, reply: Any) -> str | None:
    """A reply's text when it is a final answer (no tool calls), else None."""
    if api == "responses":
        if not isinstance(reply, list) or any(
            isinstance(i, dict) and i.get("type") in _CALL_ITEMS for i in reply
        ):
            return None
        msgs = [i for i in reply if isinstance(i, dict) and i.get("role") == "assistant"]
        return "".join(_run_together(m.get("content")) for m in msgs)
    if not isinstance(reply, dict) or reply.get("tool_calls") or reply.get("function_call"):
        return None
    content = reply.get("content")
    if isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in content
    ):
        return None
    return _run_together(content)


def _run_together(content: Any) -> str:
    """A reply's text: a string, or its text parts run together (as streamed)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str)
        )
    return ""


def call_prompts(api: Units, reply: Any) -> list[str]:
    """The ``prompt``/``input``/``task`` string arguments of a reply's tool
    calls: what a launched sub-agent is first told."""
    args: list[Any] = []
    if api == "responses" and isinstance(reply, list):
        args = [
            i.get("arguments")
            for i in reply
            if isinstance(i, dict) and i.get("type") in _CALL_ITEMS
        ]
    elif isinstance(reply, dict):
        for c in reply.get("tool_calls") or []:
            if isinstance(c, dict) and isinstance(c.get("function"), dict):
                args.append(c["function"].get("arguments"))
        content = reply.get("content")
        if isinstance(content, list):
            args += [
                b.get("input")
                for b in content
                if isinstance(b, dict) and b.get("type") == "tool_use"
            ]
    out: list[str] = []
    for a in args:
        parsed = _norm_arguments(a)
        if isinstance(parsed, dict):
            out += [v for k in _PROMPT_KEYS if isinstance(v := parsed.get(k), str)]
    return out


@dataclass(slots=True)
class _Pending:
    """What an in-flight request needs at completion to register its keys."""

    kind: Literal["chat", "messages", "responses", "text"]
    state: Any  # hash object after the request's own content
    digest: bytes  # digest of the request's own content
    group: str = ""  # text: first characters of the prompt
    length: int = 0  # text: prompt length in characters


class SessionTracker:
    """Assigns sessions and turns at arrival; learns replies at completion.

    **Usage**::

        tracker = SessionTracker()
        a = tracker.assign("rec-000001", body, header_session=None)
        ...  # forward, assemble the reply
        tracker.complete("rec-000001", {"role": "assistant", "content": "..."}, ok=True)

    ``complete`` must be called for every assigned request (``reply=None``
    when there is none); a request's reply is matchable only after it.
    """

    def __init__(self, *, memory: int = 500_000) -> None:
        self.memory = memory
        self._chat: OrderedDict[bytes, str] = OrderedDict()
        """digest of messages (+ reply) -> request id."""
        self._text: dict[str, dict[int, dict[bytes, str]]] = {}
        """first chars -> length -> digest of prompt (+ completion) -> request id."""
        self._text_lru: OrderedDict[tuple[str, int, bytes], None] = OrderedDict()
        self._info: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """request id -> (session id, turn)."""
        self._last: dict[str, str] = {}
        """session id -> its latest request id."""
        self._turns: dict[str, int] = {}
        self._pending: dict[str, _Pending] = {}
        self._answers = TextIndex(memory)
        """final answers (fan-in) -> request id."""
        self._prompts = TextIndex(memory)
        """tool-call prompt arguments (fan-out) -> request id."""

    # -- arrival -----------------------------------------------------------------

    def assign(
        self,
        request_id: str,
        body: Mapping[str, Any] | None,
        header_session: str | None = None,
        *,
        api: Units = "chat",
        parent: str | None = None,
    ) -> Assignment:
        """Place a request. ``api`` says what its units are (``messages`` for
        Anthropic bodies, ``responses`` for Responses ``input`` items);
        ``parent`` is a request the client named as its predecessor (a
        ``previous_response_id``): it wins over any match."""
        a = self._assign(request_id, body, header_session, api, parent)
        return self._with_joins(a, body, api)

    def _assign(
        self,
        request_id: str,
        body: Mapping[str, Any] | None,
        header_session: str | None,
        api: Units,
        parent: str | None,
    ) -> Assignment:
        matched = self._match(request_id, body, api)
        if header_session:
            return self._place(request_id, header_session, "header", parent or matched)
        if parent is not None and parent in self._info:
            sid = self._info[parent][0]
            if self._last.get(sid) == parent:
                return self._place(request_id, sid, "chain", parent)
            return self._place(request_id, f"s-{request_id}", "fork", parent)
        parent = matched
        if parent is not None:
            info = self._info.get(parent)
            if info is not None and self._last.get(info[0]) == parent:
                return self._place(request_id, info[0], "next", parent)
            return self._place(request_id, f"s-{request_id}", "fork", parent)
        return self._place(request_id, f"s-{request_id}", "new", None)

    def _with_joins(self, a: Assignment, body: Mapping[str, Any] | None, api: Units) -> Assignment:
        """``a`` with the joins its body shows (see the module docstring)."""
        if not isinstance(body, Mapping):
            return a
        items = input_items(body.get("input")) if api == "responses" else body.get("messages")
        if not isinstance(items, list):
            return a
        joins: list[tuple[str, str]] = []

        def other(hit: str) -> bool:
            """Another session's exchange, and not the base a fork continues."""
            info = self._info.get(hit)
            return info is not None and info[0] != a.session_id and hit != a.parent

        for text in new_results(api, items):
            for hit in self._answers.find(text):
                # the answer must still end its session: a sub-agent's last word
                if other(hit) and self._last.get(self._info[hit][0]) == hit:
                    joins.append((hit, "result"))
        if a.turn == 0 and a.source in ("new", "header"):
            joins += [(h, "prompt") for h in self._prompts.find(first_user_text(items)) if other(h)]
        seen: dict[str, str] = {}
        for hit, why in joins:
            seen.setdefault(hit, why)
        if not seen:
            return a
        return replace(a, joins=tuple(seen.items()))

    def _place(self, rid: str, sid: str, source: Source, parent: str | None) -> Assignment:
        turn = self._turns.get(sid, 0)
        self._turns[sid] = turn + 1
        self._last[sid] = rid
        self._info[rid] = (sid, turn)
        while len(self._info) > self.memory:
            old, (old_sid, _) = self._info.popitem(last=False)
            if self._last.get(old_sid) == old:
                del self._last[old_sid]
                self._turns.pop(old_sid, None)
        return Assignment(session_id=sid, turn=turn, source=source, parent=parent)

    def _match(self, rid: str, body: Mapping[str, Any] | None, api: Units) -> str | None:
        if not isinstance(body, Mapping):
            return None
        if api == "responses":
            items = input_items(body.get("input"))
            return self._match_chat(rid, items, api) if items is not None else None
        messages = body.get("messages")
        if isinstance(messages, list):
            return self._match_chat(rid, messages, api)
        prompt = body.get("prompt")
        if isinstance(prompt, str) and api == "chat":
            return self._match_text(rid, prompt)
        return None

    def _match_chat(self, rid: str, messages: list[Any], api: Units) -> str | None:
        h = _new_hash(api)
        best: str | None = None
        best_digest = digest = h.digest()
        for unit in _units(api, messages):
            _step(h, unit)
            digest = h.digest()
            hit = self._chat.get(digest)
            if hit is not None:
                # later prefixes are longer: the last hit is the longest match
                best, best_digest = hit, digest
        self._pending[rid] = _Pending(api, h, digest)
        if best is not None:
            self._chat.move_to_end(best_digest)  # a live session's key stays remembered
        return best

    def _match_text(self, rid: str, prompt: str) -> str | None:
        h = _new_hash()
        best: str | None = None
        group = self._text.get(prompt[:_GROUP]) if len(prompt) >= _GROUP else None
        done = 0
        if group:
            for length in sorted(n for n in group if n <= len(prompt)):
                h.update(prompt[done:length].encode())
                done = length
                hit = group[length].get(h.digest())
                if hit is not None:
                    best = hit
        h.update(prompt[done:].encode())
        self._pending[rid] = _Pending("text", h, h.digest(), prompt[:_GROUP], len(prompt))
        return best

    # -- completion --------------------------------------------------------------

    def complete(self, request_id: str, reply: Any, *, ok: bool) -> None:
        """Register what later requests may extend.

        ``reply``: chat and Messages, the assembled assistant message (dict);
        Responses, the output items (list); text, the completion text; None
        when nothing came back. ``ok``: the exchange
        succeeded (a failed or abandoned one is also matchable without its
        reply, for the agent's retry)."""
        p = self._pending.pop(request_id, None)
        if p is None:
            return
        if p.kind != "text" and ok and reply is not None:
            answer = final_text(p.kind, reply)
            if answer is not None:
                self._answers.add(answer, request_id)
            for prompt in call_prompts(p.kind, reply):
                self._prompts.add(prompt, request_id)
        if p.kind != "text":
            if reply is not None:
                h = p.state.copy()
                for unit in _units(p.kind, reply if isinstance(reply, list) else [reply]):
                    _step(h, unit)
                self._remember_chat(h.digest(), request_id)
            if not ok:
                self._remember_chat(p.digest, request_id)
            return
        if isinstance(reply, str) and reply:
            h = p.state.copy()
            h.update(reply.encode())
            group = (p.group + reply[:_GROUP])[:_GROUP]
            self._remember_text(group, p.length + len(reply), h.digest(), request_id)
        if not ok or reply == "":
            self._remember_text(p.group, p.length, p.digest, request_id)

    def _remember_chat(self, digest: bytes, rid: str) -> None:
        self._chat[digest] = rid
        self._chat.move_to_end(digest)
        while len(self._chat) > self.memory:
            self._chat.popitem(last=False)

    def _remember_text(self, group: str, length: int, digest: bytes, rid: str) -> None:
        if length < _GROUP or len(group) < _GROUP:
            return
        self._text.setdefault(group, {}).setdefault(length, {})[digest] = rid
        self._text_lru[(group, length, digest)] = None
        while len(self._text_lru) > self.memory:
            (g, n, d), _ = self._text_lru.popitem(last=False)
            by_len = self._text.get(g)
            if by_len is not None and n in by_len:
                by_len[n].pop(d, None)
                if not by_len[n]:
                    del by_len[n]
                if not by_len:
                    del self._text[g]

    @property
    def sessions(self) -> int:
        """Sessions seen (bounded by ``memory``)."""
        return len(self._turns)
