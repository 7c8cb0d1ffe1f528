#!/usr/bin/env python3
"""Replay this repro bundle against an OpenAI-compatible server (vLLM).

Standard library only: copy the bundle anywhere and run

    python3 repro.py --url http://HOST:PORT

It sends the requests of ``requests.jsonl`` under the replay policy the
bisect found the repro with (``manifest.json``; ``--show-policy`` prints it):
in trace order (``strict``: each on the wire before the next; ``admitted``:
each answered with headers before the next, so the engine admits them in
order; ``session``: per session only), at their recorded timing (``recorded``:
no earlier than its recorded offset and never before the previous turn of its
session has completed plus its recorded think gap; ``gaps``: the think gaps
alone; ``asap``), divided by ``speed``, at most ``max_inflight`` at once,
streaming with usage, with ``X-Request-Id`` set to the trace request id and
the session in its header. A policy this script cannot replay (``live``
mode, re-chained Responses requests) is refused with exit 2: ``replayer
bundle verify`` replays those. It exits 1 if the server
failed (connection refused or reset, a 5xx, a server error event inside a
stream, a stream cut before ``[DONE]``, a timeout), 0 if every request
completed, 2 on bad usage, 4 if most requests were rejected as client
errors (a 4xx, or a 4xx error event inside a stream: vLLM's way for an
out-of-vocabulary token): then the server never ran the repro, so "no
failure" would say nothing. Bodies name the model the bisect replayed with
(the bundle's policy), unless ``--model`` says otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
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


def load(path: Path) -> list[dict[str, Any]]:
    """The requests, in trace order (the file's order)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Result:
    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.status = "not sent"
        self.http: int | None = None
        self.detail = ""
        self.failed = False
        self.rejected = False
        self.done = threading.Event()
        self.sent = threading.Event()
        self.answered = threading.Event()
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
    if policy.get("force_stream", True):
        body["stream"] = True
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
    try:
        try:
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
        chunks = 0
        for raw in resp:
            line = raw.decode(errors="replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if isinstance(event, dict) and ("error" in event or event.get("object") == "error"):
                err = event.get("error", event)
                res.detail = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
                code = err.get("code") if isinstance(err, dict) else None
                client = str(code).isdigit() and 400 <= int(str(code)) < 500
                if client and not any(m in res.detail for m in ENGINE_DEATH):
                    res.status, res.rejected = f"client error event ({code})", True
                else:
                    res.status, res.failed = "error event", True
            else:
                chunks += 1
        if not res.failed:
            if done:
                res.status = f"ok ({chunks} chunks)"
            else:
                res.status, res.detail, res.failed = "cut", "stream ended without [DONE]", True
    except (ConnectionError, OSError, http.client.HTTPException) as exc:
        timeout = isinstance(exc, TimeoutError)
        res.status = "timeout" if timeout else "transport error"
        res.detail = f"{type(exc).__name__}: {exc}"[:300]
        res.failed = True
    finally:
        conn.close()
        res.done_at = time.monotonic() - t0
        res.answered.set()
        res.done.set()


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
    ):
        if value is not None:
            policy[key] = value
    if args.no_stream:
        policy["force_stream"] = False
    return policy


def refused(policy: dict[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """Why this script cannot replay ``policy`` as the bisect did (None: it can)."""
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
    print(
        f"replaying {len(rows)} requests against {args.url} ({timing}, {order} order, "
        f"speed {speed:g})"
    )
    limit = max_model_len(url) if policy.get("skip_over_context") else None
    slots = threading.BoundedSemaphore(policy["max_inflight"] or len(rows) or 1)
    stop_on_failure = policy.get("on_failure", "stop") == "stop"
    t0 = time.monotonic()
    first = rows[0]["start_us"] if rows else 0
    results = [Result(r["request_id"]) for r in rows]
    last: dict[str, int] = {}
    threads = []
    wait = float(policy["request_timeout"])

    def run(i: int, row: dict[str, Any]) -> None:
        try:
            send(url, row, results[i], args, t0, policy)
        finally:
            slots.release()

    for i, row in enumerate(rows):
        if stop_on_failure and any(r.failed for r in results[:i]):
            break  # the server failed: what follows is not sent
        if limit is not None and (row.get("input_tokens") or 0) >= limit:
            results[i].status = "skipped (over the context length)"
            results[i].done.set()
            results[i].sent.set()
            results[i].answered.set()
            continue
        prev = last.get(row["session_id"])
        if timing == "asap" or (timing == "gaps" and prev is not None):
            at = 0.0
        else:
            at = (row["start_us"] - first) / 1e6 / speed
        if prev is not None:
            p = results[prev]
            p.done.wait(wait + 5)
            gap = 0.0
            pend = rows[prev].get("end_us")
            if timing != "asap" and pend is not None:
                gap = max(0, row["start_us"] - pend) / 1e6 / speed
            at = max(at, p.done_at + gap)
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        slots.acquire()
        th = threading.Thread(target=run, args=(i, row), daemon=True)
        th.start()
        threads.append(th)
        # strict order: on the wire before the next; admitted: taken by the engine
        if order == "admitted":
            results[i].answered.wait(wait)
        elif order == "strict":
            results[i].sent.wait(wait)
        last[row["session_id"]] = i
    for th in threads:
        th.join(wait + 5)
    failed = [r for r in results if r.failed]
    for r in results:
        print(f"  {r.rid:40s} {r.status}" + (f": {r.detail}" if r.detail else ""))
    if failed:
        print(
            f"\nSERVER FAILED: first failure on {failed[0].rid} ({failed[0].status}); "
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
    print(f"\nno failure: all {len(rows)} requests completed; /health: {health(url)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
