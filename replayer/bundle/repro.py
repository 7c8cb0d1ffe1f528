#!/usr/bin/env python3
"""Replay this repro bundle against an OpenAI-compatible server (vLLM).

Standard library only: copy the bundle anywhere and run

    python3 repro.py --url http://HOST:PORT

It sends the requests of ``requests.jsonl`` under the replay policy the
bisect found the repro with (``manifest.json``; ``--show-policy`` prints it):
in trace order (``strict``: each on the wire before the next; ``admitted``:
each answered with headers before the next, so the engine admits them in
order; ``session``: per session only), each once the previous turn of its
session and every request its line's ``after`` names (a sub-agent's last
turn, the parent turn that launched a sub-agent) have ended, at their
recorded timing (``recorded``: no earlier than its recorded offset and never
before those ended plus its recorded think gap, counted from the latest
recorded end of what it waits for; ``gaps``: the think gaps alone;
``asap``), divided by ``speed``, at most ``max_inflight`` at once,
streaming with usage, with ``X-Request-Id`` set to the trace request id and
the session in its header. A request the recorded client left before its
answer ended (its line's ``abort``) is left at the same point when the
policy's ``aborts`` is ``replay`` (the default; ``complete`` reads it to its
end): after the same number of streamed events, else after the same time
from its first byte (not divided by ``speed``); such a request is
``aborted``, by design, neither a failure nor a cut stream. A policy this
script cannot replay (``live`` mode, re-chained Responses requests) is
refused with exit 2: ``replayer bundle verify`` replays those. It exits 1 if the server
failed (connection refused or reset, a 5xx, a server error event inside a
stream, a stream cut before its API's end event, a timeout), 0 if every request
completed, 2 on bad usage, 4 if most requests were rejected as client
errors (a 4xx, or a 4xx error event inside a stream: vLLM's way for an
out-of-vocabulary token): then the server never ran the repro, so "no
failure" would say nothing. Bodies name the model the bisect replayed with
(the bundle's policy), unless ``--model`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ENGINE_DEATH = (
    "The server had an error while processing your request.",
    "EngineCore encountered an issue",
    "EngineDeadError",
    "Engine loop has died",
    "MQLLMEngine is already dead",
    "Background loop has errored already",
)
"""Text of vLLM's engine-death errors, which count as the server failing
whatever code they carry (older vLLM sent them as 400); kept equal to
replayer.monitor.classify.ENGINE_DEATH_MESSAGES by a test."""


STREAM_ENDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("/chat/completions", frozenset({"[DONE]"})),
    ("/completions", frozenset({"[DONE]"})),
    ("/messages", frozenset({"message_stop"})),
    ("/responses", frozenset({"response.completed", "response.incomplete", "response.failed"})),
)
"""Each API's end of stream, by request path ending (most specific first):
``[DONE]`` is a data line of its own, the others the ``type`` of the last
event (Anthropic Messages, OpenAI Responses). A stream without its end was
cut. Kept equal to the replay's own reading (``replayer.wire``'s
accumulators, which ``replayer bundle verify`` replays through) by a test."""


def stream_ends(path: str) -> frozenset[str]:
    """The end events of the API ``path`` is for (chat's for a path no API
    claims, as the replay reads it)."""
    p = path.partition("?")[0].rstrip("/")
    for end, names in STREAM_ENDS:
        if p.endswith(end):
            return names
    return STREAM_ENDS[0][1]


def stream_end(payload: str, event: object, ends: frozenset[str]) -> bool:
    """Whether a data line (``payload``, parsed as ``event``) ends its stream.
    ``[DONE]`` ends any stream (a proxy may add it), as in the replay."""
    if payload == "[DONE]":
        return True
    return isinstance(event, dict) and event.get("type") in ends


def error_of(event: object) -> object:
    """The error a stream event carries (None if none): the OpenAI envelope,
    Anthropic's ``{"type": "error", "error": {...}}``, the flat vLLM and
    Responses shapes, and a failed response's ``error``."""
    if not isinstance(event, dict):
        return None
    if isinstance(event.get("error"), (dict, str)):
        return event["error"]
    if event.get("object") == "error" or event.get("type") == "error":
        return event
    resp = event.get("response")
    if event.get("type") == "response.failed" and isinstance(resp, dict):
        return resp.get("error") if isinstance(resp.get("error"), (dict, str)) else None
    return None


def load(path: Path) -> list[dict[str, Any]]:
    """The requests, in trace order (the file's order)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def abort_of(row: dict[str, Any]) -> tuple[int | None, int | None] | None:
    """Where the recorded client left ``row``: ``(after_chunks, after_us)``,
    at least one set, or None (it read its answer to the end). Read as the
    replay reads ``meta.abort`` (``replayer.replay.aborts.abort_point``, kept
    equal by a test): streamed events only when at least one, a time when
    not negative; a line from an older bundle has no ``abort``."""
    raw = row.get("abort")
    if not isinstance(raw, dict):
        return None
    chunks, us = raw.get("after_chunks"), raw.get("after_us")
    n = chunks if isinstance(chunks, int) and not isinstance(chunks, bool) and chunks > 0 else None
    t = us if isinstance(us, int) and not isinstance(us, bool) and us >= 0 else None
    return None if n is None and t is None else (n, t)


class Step:
    """When one request may go, as the replay plans it
    (``replayer.replay.plan.build_plan``, kept equal by a test)."""

    def __init__(self, prev: int | None, joins: tuple[int, ...], start: float, gap: float) -> None:
        self.joins = joins
        """Earlier positions it joins on (its line's ``after``, as kept)."""
        self.waits = joins if prev is None else (prev, *joins)
        """Every position whose end it waits for: its previous turn first,
        then its joins."""
        self.start = start
        """Recorded start after the first request's, seconds / speed."""
        self.gap = gap
        """Think gap after the latest recorded end of ``waits``, seconds / speed."""

    def due(self, timing: str, ended: float | None) -> float:
        """Seconds after T0, given when the last of ``waits`` ended (None:
        it waits for nothing that was sent), as ``Plan.eligible``."""
        if ended is None:
            return 0.0 if timing == "asap" else self.start
        if timing == "asap":
            return ended
        if timing == "gaps":
            return ended + self.gap
        return max(self.start, ended + self.gap)


def plan(rows: list[dict[str, Any]], speed: float) -> list[Step]:
    """Each request's :class:`Step`. A line's ``after`` (a line from an older
    bundle has none) names the requests whose end it waits for; a name not
    among the earlier lines is dropped, never waited for: a request the
    bundle left out (a sub-agent the bisect removed) or one sent later."""
    first = rows[0]["start_us"] if rows else 0
    pos: dict[str, int] = {}
    last: dict[str, int] = {}
    steps: list[Step] = []
    for i, row in enumerate(rows):
        names = row.get("after")
        names = names if isinstance(names, list) else []
        joins = tuple(sorted({pos[a] for a in names if isinstance(a, str) and a in pos}))
        prev = last.get(row["session_id"])
        step = Step(prev, joins, (row["start_us"] - first) / 1e6 / speed, 0.0)
        ends = [e for e in (rows[w].get("end_us") for w in step.waits) if isinstance(e, int)]
        step.gap = max(0, row["start_us"] - max(ends)) / 1e6 / speed if ends else 0.0
        steps.append(step)
        pos[row["request_id"]] = i
        last[row["session_id"]] = i
    return steps


class Result:
    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.status = "not sent"
        self.http: int | None = None
        self.detail = ""
        self.failed = False
        self.rejected = False
        self.aborted = False
        """Left where the recorded client left it: by design, no failure."""
        self.done = threading.Event()
        self.sent = threading.Event()
        self.answered = threading.Event()
        self.sent_at: float | None = None
        self.done_at = 0.0


def send(
    url: urllib.parse.SplitResult,
    row: dict[str, Any],
    res: Result,
    args: argparse.Namespace,
    t0: float,
    policy: dict[str, Any],
) -> None:
    body = dict(row["body"])
    if policy.get("model"):
        body["model"] = policy["model"]
    ends = stream_ends(row["path"])
    if policy.get("force_stream", True):
        body["stream"] = True
        if "[DONE]" in ends:  # Messages and Responses streams carry usage: not theirs
            opts = dict(body.get("stream_options") or {})
            opts["include_usage"] = True
            body["stream_options"] = opts
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json", "X-Request-Id": row["request_id"]}
    if policy.get("session_header"):
        headers[policy["session_header"]] = row["session_id"]
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn_cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(url.hostname or "", url.port, timeout=float(policy["request_timeout"]))
    abort = abort_of(row) if policy.get("aborts", "replay") == "replay" else None
    cut = abort[0] if abort is not None else None
    after_s = abort[1] / 1e6 if abort is not None and cut is None and abort[1] is not None else None
    lock = threading.Lock()
    left = finished = False
    timer: threading.Timer | None = None

    def leave() -> None:
        """The recorded client's time is up: drop the connection under the
        reader (a shutdown wakes the blocked read; close may not)."""
        nonlocal left
        with lock:
            if finished or conn.sock is None:
                return
            left = True
            with contextlib.suppress(OSError):  # already gone
                conn.sock.shutdown(socket.SHUT_RDWR)

    def aborted(how: str) -> None:
        res.status, res.aborted, res.failed, res.rejected = "aborted", True, False, False
        res.detail = f"disconnected on purpose {how}, as the recorded client did"

    try:
        try:
            res.sent_at = time.monotonic() - t0
            if after_s is not None:
                conn.connect()  # the time runs from the request's first byte
                timer = threading.Timer(after_s, leave)
                timer.daemon = True
                timer.start()
            conn.request("POST", url.path.rstrip("/") + row["path"], body=data, headers=headers)
        finally:
            res.sent.set()
        resp = conn.getresponse()
        res.answered.set()
        res.http = resp.status
        if resp.status != 200:
            text = resp.read().decode(errors="replace")
            res.status = f"HTTP {resp.status}"
            res.detail = text[:300]
            res.failed = resp.status >= 500
            res.rejected = 400 <= resp.status < 500
            return
        if "text/event-stream" not in (resp.getheader("Content-Type") or ""):
            resp.read()
            res.status = "ok"
            return
        done = False
        chunks = events = 0  # events: every data line but [DONE], as the recording counted
        for raw in resp:
            line = raw.decode(errors="replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            events += payload != "[DONE]"
            try:
                event = json.loads(payload) if payload != "[DONE]" else None
            except ValueError:
                event = None
            if stream_end(payload, event, ends):
                done = True
            err = error_of(event)
            if err is not None:
                res.detail = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
                code = err.get("code") if isinstance(err, dict) else None
                client = str(code).isdigit() and 400 <= int(str(code)) < 500
                if client and not any(m in res.detail for m in ENGINE_DEATH):
                    res.status, res.rejected = f"client error event ({code})", True
                else:
                    res.status, res.failed = "error event", True
            elif event is not None and not done:
                chunks += 1
            if cut is not None and events >= cut and not (done or res.failed or res.rejected):
                aborted(f"after {events} streamed event(s)")  # the rest it never saw
                break
        if not res.failed and not res.rejected and not res.aborted:
            if done:
                res.status = f"ok ({chunks} chunks)"
            elif left:
                aborted(f"after {after_s:g} s")
            else:
                end = " or ".join(sorted(ends))
                res.status, res.detail, res.failed = "cut", f"stream ended without {end}", True
    except (ConnectionError, OSError, http.client.HTTPException) as exc:
        if left:  # the read the timer broke
            aborted(f"after {after_s:g} s")
        else:
            timeout = isinstance(exc, TimeoutError)
            res.status = "timeout" if timeout else "transport error"
            res.detail = f"{type(exc).__name__}: {exc}"[:300]
            res.failed = True
    finally:
        with lock:
            finished = True
        if timer is not None:
            timer.cancel()
        conn.close()
        res.done_at = time.monotonic() - t0
        res.answered.set()
        res.done.set()


def failure_text(results: list[Result]) -> str:
    """Which requests the failure came on. A client sees only which stream
    reported it first, and an engine death reaches every stream in flight at
    once: with several in flight, all are named, none is called the trigger
    (the server's log can tell: ``replayer replay --launch`` reads it)."""
    first = min((r for r in results if r.failed), key=lambda r: r.done_at)
    at = first.done_at
    inflight = sorted(
        (r for r in results if r.sent_at is not None and r.sent_at <= at and r.done_at >= at),
        key=lambda r: r.sent_at or 0.0,
    )
    if len(inflight) <= 1:
        return f"failure on {first.rid} ({first.status})"
    return (
        f"failure while {len(inflight)} requests were in flight: "
        + ", ".join(r.rid for r in inflight)
        + f" (in send order); first seen on {first.rid} ({first.status}); which one the "
        "server was processing, its log says (the request its scheduler dump shows first "
        "scheduled in the failing step)"
    )


def health(url: urllib.parse.SplitResult) -> str:
    try:
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=5)
        conn.request("GET", url.path.rstrip("/") + "/health")
        status = conn.getresponse().status
        conn.close()
        return str(status)
    except OSError as exc:
        return f"no answer ({type(exc).__name__})"


POLICY_DEFAULTS: dict[str, Any] = {
    "timing": "recorded",
    "order": "strict",
    "speed": 1.0,
    "max_inflight": None,
    "mode": "verbatim",
    "force_stream": True,
    "model": None,
    "skip_over_context": False,
    "request_timeout": 1800.0,
    "on_failure": "stop",
    "session_header": "X-Session-Id",
    "token_range": None,
    "save_output": False,
    "body_cache_mb": 512,
    "responses_state": "expand",
    "workers": "auto",
    "aborts": "replay",
}
"""A policy field a bundle's manifest lacks (an older replayer's) has its default."""


def policy_of(args: argparse.Namespace) -> dict[str, Any]:
    """The bundle's policy (its manifest), with what the command line overrides."""
    policy = dict(POLICY_DEFAULTS)
    manifest = HERE / "manifest.json"
    if manifest.exists():
        policy.update(json.loads(manifest.read_text()).get("policy") or {})
    for key, value in (
        ("speed", args.speed),
        ("timing", args.timing),
        ("order", args.order),
        ("model", args.model),
        ("max_inflight", args.max_inflight),
        ("request_timeout", args.timeout),
        ("aborts", args.aborts),
    ):
        if value is not None:
            policy[key] = value
    if args.no_stream:
        policy["force_stream"] = False
    return policy


def refused(policy: dict[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """Why this script cannot replay ``policy`` as the bisect did (None: it can)."""
    if policy.get("aborts") not in ("replay", "complete"):
        return f"aborts {policy.get('aborts')!r} (this script knows replay and complete)"
    if policy.get("mode") == "live":
        return "mode live (the target's own replies replace recorded turns)"
    chained = any("previous_response_id" in (r.get("body") or {}) for r in rows)
    if policy.get("responses_state") == "chain" and chained:
        return "responses_state chain (Responses requests re-pointed at live response ids)"
    return None


def max_model_len(url: urllib.parse.SplitResult) -> int | None:
    """The served model's context length (``/v1/models``), or None."""
    try:
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
        conn.request("GET", url.path.rstrip("/") + "/v1/models")
        data = json.loads(conn.getresponse().read())
        conn.close()
        lens = [m.get("max_model_len") for m in data.get("data", []) if isinstance(m, dict)]
        return min((n for n in lens if isinstance(n, int)), default=None)
    except (OSError, ValueError, http.client.HTTPException):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--requests", type=Path, default=HERE / "requests.jsonl")
    ap.add_argument(
        "--speed",
        type=float,
        default=None,
        help="divide recorded times by this (default: the bundle's policy)",
    )
    ap.add_argument("--timing", choices=("recorded", "gaps", "asap"), default=None)
    ap.add_argument("--order", choices=("strict", "admitted", "session"), default=None)
    ap.add_argument("--max-inflight", type=int, default=None, metavar="N")
    ap.add_argument(
        "--model", default=None, help="replace the model of every body (default: the bundle's)"
    )
    ap.add_argument(
        "--api-key-env", default=None, metavar="VAR", help="send $VAR as the bearer token"
    )
    ap.add_argument("--no-stream", action="store_true", help="send bodies' own stream flag")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per request")
    ap.add_argument(
        "--aborts",
        choices=("replay", "complete"),
        default=None,
        help="leave a request where the recorded client left it (replay), or read every "
        "answer to its end (complete) (default: the bundle's policy)",
    )
    ap.add_argument(
        "--show-policy",
        action="store_true",
        help="print the replay policy this run applies (JSON) and exit",
    )
    args = ap.parse_args(argv)
    policy = policy_of(args)
    if args.show_policy:
        print(json.dumps(policy, sort_keys=True))
        return 0
    if not args.url:
        print("repro.py: error: --url is required", file=sys.stderr)
        return 2
    url = urllib.parse.urlsplit(args.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        print(
            f"repro.py: error: --url must be http(s)://HOST:PORT, not {args.url!r}", file=sys.stderr
        )
        return 2
    try:
        rows = load(args.requests)
    except (OSError, ValueError, KeyError) as exc:
        print(f"repro.py: error: cannot read {args.requests}: {exc}", file=sys.stderr)
        return 2
    why = refused(policy, rows)
    if why is not None:
        print(
            f"repro.py: error: this bundle was found with {why}, which this script does not "
            "replay: use `replayer bundle verify` on it",
            file=sys.stderr,
        )
        return 2
    speed = float(policy["speed"])
    timing, order = policy["timing"], policy["order"]
    leaves = sum(1 for r in rows if abort_of(r) is not None)
    steps = plan(rows, speed)
    joins = sum(len(s.joins) for s in steps)
    print(
        f"replaying {len(rows)} requests against {args.url} ({timing}, {order} order, "
        f"speed {speed:g}"
        + (f", {joins} join(s)" if joins else "")
        + (f", {leaves} client abort(s): {policy['aborts']}" if leaves else "")
        + ")"
    )
    limit = max_model_len(url) if policy.get("skip_over_context") else None
    slots = threading.BoundedSemaphore(policy["max_inflight"] or len(rows) or 1)
    stop_on_failure = policy.get("on_failure", "stop") == "stop"
    t0 = time.monotonic()
    results = [Result(r["request_id"]) for r in rows]
    threads = []
    wait = float(policy["request_timeout"])

    def run(i: int, row: dict[str, Any]) -> None:
        try:
            send(url, row, results[i], args, t0, policy)
        finally:
            slots.release()

    def ready(i: int, row: dict[str, Any]) -> bool:
        """Wait until request i may go; False: it is not sent (the server
        failed, or it is over the context length)."""
        if stop_on_failure and any(r.failed for r in results):
            return False  # the server failed: what follows is not sent
        if limit is not None and (row.get("input_tokens") or 0) >= limit:
            results[i].status = "skipped (over the context length)"
            return False
        # its previous turn and its joins end (completed, failed, aborted or
        # skipped), each within its own request timeout
        step = steps[i]
        for w in step.waits:
            results[w].done.wait(wait + 5)
        if stop_on_failure and any(r.failed for r in results):
            return False
        ended = [results[w].done_at for w in step.waits if results[w].sent_at is not None]
        at = step.due(timing, max(ended, default=None))
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return True

    def settle(i: int) -> None:
        """Request i is not sent: what waits for it goes on."""
        for ev in (results[i].done, results[i].sent, results[i].answered):
            ev.set()

    if order == "session":
        # per session only: each session's turns in order on a thread of its
        # own, so a turn that waits (its previous turn, a join, its think
        # gap) holds up no other session
        by_session: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            by_session.setdefault(row["session_id"], []).append(i)

        def walk(idxs: list[int]) -> None:
            for i in idxs:
                if not ready(i, rows[i]):
                    settle(i)
                    continue
                slots.acquire()
                run(i, rows[i])

        threads = [
            threading.Thread(target=walk, args=(ix,), daemon=True) for ix in by_session.values()
        ]
        for th in threads:
            th.start()
        deadline = time.monotonic() + (wait + 5) * (len(rows) + 1)
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
    else:
        for i, row in enumerate(rows):
            if not ready(i, row):
                settle(i)
                if results[i].status == "not sent":
                    break  # the server failed: what follows is not sent
                continue
            slots.acquire()
            th = threading.Thread(target=run, args=(i, row), daemon=True)
            th.start()
            threads.append(th)
            # strict order: on the wire before the next; admitted: taken by the engine
            if order == "admitted":
                results[i].answered.wait(wait)
            elif order == "strict":
                results[i].sent.wait(wait)
        for th in threads:
            th.join(wait + 5)
    failed = [r for r in results if r.failed]
    for r in results:
        print(f"  {r.rid:40s} {r.status}" + (f": {r.detail}" if r.detail else ""))
    if failed:
        print(f"\nSERVER FAILED: {failure_text(results)}; ", end="")
        print(
            f"{sum(1 for r in results if r.status == 'not sent')} request(s) not sent; "
            f"/health now: {health(url)}"
        )
        return 1
    rejected = [r for r in results if r.rejected]
    if len(rejected) * 2 > len(results):
        print(
            f"\nNOT EXERCISED: {len(rejected)} of {len(rows)} requests were rejected as client "
            f"errors, first {rejected[0].rid}: {rejected[0].status}: {rejected[0].detail}"
        )
        return 4
    left = sum(1 for r in results if r.aborted)
    if left:
        print(
            f"\nno failure: all {len(rows)} requests completed or left as recorded ({left} "
            f"aborted on purpose where the recorded client left); /health: {health(url)}"
        )
    else:
        print(f"\nno failure: all {len(rows)} requests completed; /health: {health(url)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
