"""The recording proxy, in-process on loopback, against the emulator subprocess
and a scriptable fake upstream: the official openai SDK sees what it sees
direct; every path, method, status and end-to-end header passes; SSE is relayed
event by event; big bodies stream; exchanges (including abandoned, cut and
failed ones) are recorded; no credential is ever written."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import io
import os
import resource
import socket

import aiohttp
import openai
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from replayer.replay.aborts import AbortAt, abort_point
from replayer.testing.emulator import apoll_until
from replayer.trace.reader import Trace
from tests.helpers.record import MODEL, TOOL_CALL

EMU_ARGS = ["--speed", "instant", "--seed", "11", "--enable-prompt-tokens-details"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
HISTORY = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Look at main.py"},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": TOOL_CALL["id"], "content": "def main():\n    pass\n"},
]


async def stopped_trace(proxy) -> Trace:
    await proxy.stop()
    return Trace.open(proxy.config.output)


async def sdk_session(base_url: str) -> list:
    """Chat (JSON and streamed, with tools and tool history) and completions."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    seen = []
    try:
        msgs = list(HISTORY)
        r = await client.chat.completions.create(
            model=MODEL, messages=msgs, tools=TOOLS, max_tokens=12
        )
        m = r.choices[0].message
        seen.append(("chat", m.content, r.choices[0].finish_reason, r.usage.model_dump()))
        msgs += [m.model_dump(), {"role": "user", "content": "and now?"}]
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            tools=TOOLS,
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        async for ch in stream:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
            if ch.usage:
                usage = ch.usage.model_dump()
        seen.append(("stream", text, finish, usage))
        c = await client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=7)
        seen.append(("text", c.choices[0].text, c.choices[0].finish_reason, c.usage.model_dump()))
        s = await client.completions.create(
            model=MODEL, prompt="def fib(n):" + c.choices[0].text, max_tokens=5, stream=True
        )
        parts = [ch.choices[0].text async for ch in s if ch.choices]
        seen.append(("text-stream", "".join(parts)))
    finally:
        await client.close()
    return seen


async def test_openai_sdk_sees_the_same_as_direct(emulator_factory, proxy_factory):
    direct = emulator_factory(EMU_ARGS)
    behind = emulator_factory(EMU_ARGS, log_bodies=True)
    proxy = await proxy_factory(behind.url)
    want = await sdk_session(direct.url)
    got = await sdk_session(proxy.url)
    assert got == want
    assert want[0][2] == "length" and want[1][3]["prompt_tokens_details"]["cached_tokens"] > 0

    t = await stopped_trace(proxy)
    assert len(t) == 4 and not t.torn_tail
    rows = t.order
    # recorded outcomes are what the client saw
    o = [t.outcome(r) for r in rows]
    assert (o[0]["output_text"], o[0]["finish_reason"]) == (want[0][1], want[0][2])
    assert o[1]["output_text"] == want[1][1]
    assert o[1]["usage_cached_tokens"] == want[1][3]["prompt_tokens_details"]["cached_tokens"]
    assert (o[2]["output_text"], o[3]["output_text"]) == (want[2][1], want[3][1])
    assert [x["status"] for x in o] == [200] * 4
    assert o[1]["ttft_us"] is not None and o[0]["ttft_us"] is None
    # bodies are the bytes the server received (sha256 of the raw body)
    log = [e for e in behind.read_request_log() if e["event"] == "request"]
    assert [t.column("body_sha256")[r] for r in rows] == [e["body_sha256"] for e in log]
    assert [t.body(r) for r in rows] == [e["body"] for e in log]
    # the SDK fed the reply back: turn 1 continues turn 0; the completion chain too
    sid, turn = t.column("session_id"), t.column("turn")
    assert [(sid[r], turn[r]) for r in rows] == [
        ("s-rec-000001", 0),
        ("s-rec-000001", 1),
        ("s-rec-000003", 0),
        ("s-rec-000003", 1),
    ]
    assert t.meta(rows[1])["timing_us"]["first_token"] >= t.meta(rows[1])["timing_us"]["body"]


async def tool_calls(base_url: str) -> list:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    try:
        msgs = [{"role": "user", "content": "Look at main.py"}]
        chunks = []
        stream = await client.chat.completions.create(
            model=MODEL, messages=msgs, tools=TOOLS, stream=True
        )
        async for ch in stream:
            chunks.append(ch.model_dump())
        r = await client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS)
        # the agent feeds the call back with its result, as the SDK hands it over
        msgs += [
            r.choices[0].message.model_dump(),
            {"role": "tool", "tool_call_id": TOOL_CALL["id"], "content": "print(1)"},
        ]
        r2 = await client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS)
        return [chunks, r.model_dump(), r2.model_dump()]
    finally:
        await client.close()


@pytest.mark.inprocess
async def test_tool_calls_streamed_and_not(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url)
    want = await tool_calls(fake_upstream.url)
    got = await tool_calls(proxy.url)
    assert got == want
    assert want[1]["choices"][0]["message"]["tool_calls"][0]["function"] == TOOL_CALL["function"]
    t = await stopped_trace(proxy)
    rows = t.order
    for r in rows:
        o = t.outcome(r)
        assert o["output_tool_calls"] == [TOOL_CALL]
        assert (o["finish_reason"], o["usage_cached_tokens"], o["status"]) == (
            "tool_calls",
            96,
            200,
        )
    assert t.outcome(rows[0])["ttft_us"] is not None
    # JSON and streamed calls of the same request are two sessions (no reply links them);
    # the follow-up extends the JSON one's messages + tool call
    assert [t.meta(r)["session"] for r in rows] == ["new", "new", "next"]
    assert t.meta(rows[2])["parent"] == t.column("request_id")[rows[1]]


@pytest.mark.inprocess
async def test_every_method_path_status_and_header_passes(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url)
    hop = {
        "Connection": "keep-alive, X-Hop-Req",
        "X-Hop-Req": "hop",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "X-End": "kept",
        "User-Agent": "agent/1.0",
    }
    async with aiohttp.ClientSession(auto_decompress=False) as s:

        async def both(method: str, path: str, **kw):
            out = []
            for base in (fake_upstream.url, proxy.url):
                async with s.request(method, base + path, allow_redirects=False, **kw) as r:
                    out.append((r.status, r.headers, await r.read()))
            return out

        for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS", "POST"):
            (ds, dh, db), (ps, ph, pb) = await both(
                method, "/any/where?a=1&b=%20x", headers=hop, data=b"payload"
            )
            assert ps == ds == 200
            d, p = orjson.loads(db), orjson.loads(pb)
            assert p["method"] == method and p["path_qs"] == "/any/where?a=1&b=%20x"
            assert p["body_sha256"] == hashlib.sha256(b"payload").hexdigest()
            got = {k.lower(): v for k, v in p["headers"]}
            assert got["x-end"] == "kept" and got["user-agent"] == "agent/1.0"
            assert not {"x-hop-req", "keep-alive", "te"} & set(got)
            # end-to-end headers arrive as the client sent them, nothing added
            hops = {"connection", "x-hop-req", "keep-alive", "te"}
            direct = {k.lower() for k, _ in d["headers"]} - hops
            assert set(got) == direct
            assert (
                ph.getall("Set-Cookie") == dh.getall("Set-Cookie") == ["a=1; Path=/", "b=2; Path=/"]
            )
            assert ph["X-Upstream"] == "fake" and "X-Hop-Resp" not in ph
            assert {k for k in ph if k not in ("Date", "Connection")} == {
                k for k in dh if k not in ("Date", "Connection", "X-Hop-Resp")
            }
        (ds, _, db), (ps, _, pb) = await both("GET", "/x", headers={"X-Want-Status": "418"})
        assert (ps, orjson.loads(pb)["path_qs"]) == (ds, "/x") == (418, "/x")
        (ds, dh, _), (ps, ph, _) = await both("GET", "/redirect")
        assert (ps, ph["Location"]) == (ds, dh["Location"]) == (302, "/elsewhere")
        (_, dh, db), (ps, ph, pb) = await both("GET", "/gzip")
        assert (ps, ph["Content-Encoding"], pb) == (200, "gzip", db)
        assert ph["Content-Length"] == dh["Content-Length"] == str(len(db))
        (ds, dh, db), (ps, ph, pb) = await both("HEAD", "/head")
        assert (ps, pb, ph["Content-Length"]) == (ds, b"", dh["Content-Length"])
        # Expect: 100-continue is answered (curl sends it for big bodies)
        async with s.put(f"{proxy.url}/expect", data=b"x" * 4096, expect100=True) as r:
            assert (r.status, orjson.loads(await r.read())["body_bytes"]) == (200, 4096)
    t = await stopped_trace(proxy)
    assert len(t) == 0  # nothing here is a recorded endpoint


@pytest.mark.inprocess
async def test_sse_is_relayed_event_by_event(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url)
    async with aiohttp.ClientSession() as s, s.get(f"{proxy.url}/gated") as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        # the upstream holds its second event until we have seen the first
        async with asyncio.timeout(10):
            assert await r.content.readuntil(b"\n\n") == b"data: first\n\n"
        fake_upstream.gate.set()
        assert await r.read() == b"data: second\n\n"


@pytest.mark.inprocess
async def test_headers_are_not_held_for_the_body(fake_upstream, proxy_factory):
    # a small body goes out in one write with its headers, but headers the
    # upstream sent alone reach the client at once, not with the first event
    proxy = await proxy_factory(fake_upstream.url)
    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(10):
            r = await s.get(f"{proxy.url}/silent")
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/event-stream"
        fake_upstream.gate.set()
        assert await r.read() == b"data: late\n\n"
        r.close()
        async with s.get(f"{proxy.url}/small") as r:
            assert r.status == 200
            assert orjson.loads(await r.read())["path_qs"] == "/small"


@pytest.mark.inprocess
async def test_bodies_of_hundreds_of_mb_stream_through(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url)
    block = bytes(range(256)) * 4096  # 1 MiB
    n = 256
    want = hashlib.sha256()
    for _ in range(n):
        want.update(block)

    async def body():
        for _ in range(n):
            yield block

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    async with aiohttp.ClientSession() as s, s.put(f"{proxy.url}/upload", data=body()) as r:
        seen = orjson.loads(await r.read())
    assert (seen["body_bytes"], seen["body_sha256"]) == (n * len(block), want.hexdigest())
    # streamed, not held: the peak grew by far less than the 256 MiB that passed
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 96 * 1024

    # a recorded body is held (it is stored) and arrives byte for byte
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (40 << 20)}]}
    raw = orjson.dumps(big)
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{proxy.url}/v1/chat/completions", data=io.BytesIO(raw)) as r,
    ):
        assert r.status == 200
    assert fake_upstream.requests[-1]["bytes"] == len(raw)
    t = await stopped_trace(proxy)
    assert t.column("body_sha256")[0] == hashlib.sha256(raw).hexdigest()
    assert t.body(0) == big and t.column("body_bytes")[0] == len(raw)


@pytest.mark.inprocess
async def test_abandoned_stream_is_kept_and_the_upstream_sees_it(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True}
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{proxy.url}/v1/chat/completions", json=body, headers={"X-Test": "hang"})
        async with asyncio.timeout(10):
            await r.content.readuntil(b"\n\n")
            await r.content.readuntil(b"\n\n")
        r.close()  # the client gives up mid-stream
    await apoll_until(lambda: proxy.sink.rows == 1 and fake_upstream.disconnects == 1, 10)
    t = await stopped_trace(proxy)
    o, meta = t.outcome(0), t.meta(0)
    assert meta["abandoned"] == "client" and meta["done_event"] is False
    assert (o["status"], o["output_text"], o["finish_reason"]) == (200, "partial ", None)
    # where the client left: after the two events it read, at the exchange's end
    assert meta["abort"] == {"after_us": meta["timing_us"]["done"], "after_chunks": 2}
    assert abort_point(meta) == AbortAt(after_chunks=2, after_us=meta["timing_us"]["done"])


@pytest.mark.inprocess
async def test_upstream_cut_mid_stream_cuts_the_client_and_is_recorded(
    fake_upstream, proxy_factory
):
    proxy = await proxy_factory(fake_upstream.url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True}
    errors = []
    async with aiohttp.ClientSession() as s:
        for base in (fake_upstream.url, proxy.url):
            with pytest.raises(aiohttp.ClientPayloadError) as exc:
                async with s.post(
                    f"{base}/v1/chat/completions", json=body, headers={"X-Test": "cut"}
                ) as r:
                    await r.read()
            errors.append(type(exc.value))
    assert errors[0] is errors[1]
    t = await stopped_trace(proxy)
    o, meta = t.outcome(0), t.meta(0)
    assert meta["failure"] == "upstream" and o["error"].startswith("upstream broke off")
    assert (o["status"], o["output_text"]) == (200, "partial ")


@pytest.mark.inprocess
async def test_error_status_is_recorded_with_its_message(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{proxy.url}/v1/chat/completions", json=body, headers={"X-Test": "error"}) as r,
    ):
        assert (r.status, (await r.json())["error"]["message"]) == (400, "bad thing")
    t = await stopped_trace(proxy)
    assert (t.outcome(0)["status"], t.outcome(0)["error"]) == (400, "bad thing")
    assert t.meta(0)["error_type"] == "BadRequestError"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.inprocess
async def test_upstream_down_gives_502_and_records_the_error(proxy_factory):
    upstream = f"http://127.0.0.1:{closed_port()}"
    proxy = await proxy_factory(upstream)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{proxy.url}/v1/chat/completions", json=body) as r:
            assert (r.status, r.content_type) == (502, "application/json")
            err = (await r.json())["error"]
        async with s.get(f"{proxy.url}/v1/models") as r2:
            assert r2.status == 502
    assert (err["type"], err["code"], err["param"]) == ("BadGateway", 502, None)
    assert err["message"].startswith(f"replayer record: upstream {upstream} unreachable: ")
    t = await stopped_trace(proxy)
    assert len(t) == 1  # /v1/models is forwarded, not recorded
    o = t.outcome(0)
    assert o["status"] == 502 and o["error"].startswith("upstream unreachable: ")
    assert t.meta(0)["failure"] == "connect" and t.body(0) == body


@pytest.mark.inprocess
async def test_request_ids_and_session_headers(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    sent = [
        {"X-Request-Id": "abc", "X-Session-Affinity": "S1"},
        {"X-Request-Id": "abc", "X-Session-Id": "S1"},
        {"X-Correlation-ID": "S2"},
        {},
    ]
    async with aiohttp.ClientSession() as s:
        for h in sent:
            async with s.post(f"{proxy.url}/v1/chat/completions", json=body, headers=h) as r:
                assert r.status == 200
    t = await stopped_trace(proxy)
    c = t.column
    rows = t.order
    assert [c("request_id")[r] for r in rows] == ["abc", "abc~2", "rec-000001", "rec-000002"]
    assert [(c("session_id")[r], c("turn")[r]) for r in rows] == [
        ("S1", 0),
        ("S1", 1),
        ("S2", 0),
        ("s-rec-000002", 0),
    ]
    assert t.meta(rows[1])["client_request_id"] == "abc"


SECRETS = {
    "authorization": "sk-emu-KEY-9f8e7d6c5b4a",
    "api-key": "APIKEY-HDR-111111",
    "x-api-key": "XAPIKEY-HDR-222222",
    "x-goog-api-key": "GOOG-HDR-333333",
    "cookie": "COOKIE-VAL-444444",
    "proxy-authorization": "PROXYAUTH-555555",
    "query-api_key": "QUERY-KEY-666666",
    "query-key": "QUERY-KEY-777777",
    "body-api_key": "BODY-KEY-888888",
    "body-nested": "NESTED-TOKEN-999999",
    "dropped": "DROPPED-HDR-000000",
    "redacted": "CANARY-31337",
}


async def test_no_secret_is_ever_written(emulator_factory, proxy_factory, tmp_path):
    key = SECRETS["authorization"]
    emu = emulator_factory(["--speed", "instant", "--api-key", key])
    proxy = await proxy_factory(emu.url, drop_headers=("X-Internal-User",), redact=(r"CANARY-\d+",))
    headers = {
        "Authorization": f"Bearer {key}",
        "api-key": SECRETS["api-key"],
        "x-api-key": SECRETS["x-api-key"],
        "X-Goog-Api-Key": SECRETS["x-goog-api-key"],
        "Cookie": f"session={SECRETS['cookie']}",
        "Proxy-Authorization": f"Basic {SECRETS['proxy-authorization']}",
        "X-Internal-User": SECRETS["dropped"],
        "X-Visible": "stored-header-value",
    }
    body = {
        "model": MODEL,
        "api_key": SECRETS["body-api_key"],
        "metadata": {"access_token": SECRETS["body-nested"]},
        "messages": [{"role": "user", "content": f"the code is {SECRETS['redacted']} ok"}],
        "max_tokens": 4,
    }
    qs = f"?api_key={SECRETS['query-api_key']}&key={SECRETS['query-key']}&team=blue"
    async with aiohttp.ClientSession() as s:
        for stream in (False, True):
            async with s.post(
                f"{proxy.url}/v1/chat/completions{qs}",
                json={**body, "stream": stream},
                headers=headers,
            ) as r:
                assert r.status == 200  # the key reached the upstream
                await r.read()
        async with s.post(f"{proxy.url}/v1/chat/completions", json=body) as r:
            assert r.status == 401  # and without it the upstream says no
    t = await stopped_trace(proxy)
    assert len(t) == 3
    raw = proxy.config.output.read_bytes()
    with pa.memory_map(str(proxy.config.output)) as src:
        table = ipc.open_stream(src).read_all()
    decoded = orjson.dumps(table.to_pylist()) + orjson.dumps(
        {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    )
    for where, secret in SECRETS.items():
        for blob in (raw, decoded):
            assert secret.encode() not in blob, where
    # not vacuous: the rest is there, masks mark what was removed
    assert b"stored-header-value" in decoded and b"[REDACTED]" in decoded
    meta = t.meta(0)
    assert meta["query"] == {"api_key": "[REDACTED]", "key": "[REDACTED]", "team": "blue"}
    assert meta["masked_fields"] == ["api_key", "metadata.access_token"]
    assert t.body(0)["messages"][0]["content"] == "the code is [REDACTED] ok"
    assert t.provenance["redaction"]["applied"] is True
    assert "CANARY" not in orjson.dumps(t.provenance).decode()


@pytest.mark.inprocess
async def test_stop_records_in_flight_exchanges_as_shutdown(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url, drain=0.2)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True}
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{proxy.url}/v1/chat/completions", json=body, headers={"X-Test": "hang"})
        async with asyncio.timeout(10):
            await r.content.readuntil(b"\n\n")
        await proxy.stop()
        with contextlib.suppress(aiohttp.ClientError):
            await r.read()
        r.close()
    t = Trace.open(proxy.config.output)
    assert t.meta(0)["abandoned"] == "shutdown" and not t.torn_tail


@pytest.mark.inprocess
async def test_forks_through_the_proxy_share_the_parent_prefix(fake_upstream, proxy_factory):
    proxy = await proxy_factory(fake_upstream.url)
    client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)
    try:
        msgs = [{"role": "user", "content": "Look at main.py"}]
        r = await client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS)
        msgs.append(r.choices[0].message.model_dump())
        for result in ("print(1)", "print(2)", "print(3)"):  # three branches from one point
            branch = [*msgs, {"role": "tool", "tool_call_id": TOOL_CALL["id"], "content": result}]
            await client.chat.completions.create(model=MODEL, messages=branch, tools=TOOLS)
    finally:
        await client.close()
    t = await stopped_trace(proxy)
    c = t.column
    rows = t.order
    assert [t.meta(r)["session"] for r in rows] == ["new", "next", "fork", "fork"]
    assert [c("session_id")[r] for r in rows] == [
        "s-rec-000001",
        "s-rec-000001",
        "s-rec-000003",
        "s-rec-000004",
    ]
    assert [c("turn")[r] for r in rows] == [0, 1, 0, 0]
    # every branch is delta-encoded against the parent: it keeps the parent's one
    # message and stores only the reply and its own tool result
    parent = rows[0]
    assert [c("base")[r] for r in rows[1:]] == [parent] * 3
    assert [c("keep")[r] for r in rows[1:]] == [1] * 3
    assert [t.meta(r).get("parent") for r in rows[1:]] == ["rec-000001"] * 3


@pytest.mark.inprocess
async def test_next_turn_sent_on_done_before_the_stream_ends_still_continues(
    fake_upstream, proxy_factory
):
    # an SDK stops reading at [DONE] and may send the next turn while the last
    # bytes of the stream are still on their way: the reply must already count
    proxy = await proxy_factory(fake_upstream.url)
    first = [{"role": "user", "content": "Look at main.py"}]
    body = {"model": MODEL, "messages": first, "stream": True}
    follow = {
        "model": MODEL,
        "messages": [
            *first,
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": TOOL_CALL["id"], "content": "print(1)"},
        ],
    }
    async with aiohttp.ClientSession() as s:
        r = await s.post(
            f"{proxy.url}/v1/chat/completions", json=body, headers={"X-Test": "linger"}
        )
        async with asyncio.timeout(10):
            while (await r.content.readuntil(b"\n\n")) != b"data: [DONE]\n\n":
                pass
        # the client has the reply: its row is in the file already, whole
        early = Trace.open(proxy.config.output)
        assert early.outcome(0)["output_tool_calls"] == [TOOL_CALL]
        async with s.post(f"{proxy.url}/v1/chat/completions", json=follow) as r2:
            assert r2.status == 200
        assert not r.content.at_eof()  # the first stream is still open
        fake_upstream.gate.set()
        await r.read()
        r.close()
    t = await stopped_trace(proxy)
    rows = t.order
    assert [t.meta(r)["session"] for r in rows] == ["new", "next"]
    timing = t.meta(rows[0])["timing_us"]
    assert timing["reply"] <= timing["done"]  # done: the end read, before the upstream's EOF


@pytest.mark.inprocess
async def test_compressed_request_body_is_forwarded_as_is_and_recorded_decoded(
    fake_upstream, proxy_factory
):
    proxy = await proxy_factory(fake_upstream.url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "zipped " * 100}]}
    raw = gzip.compress(orjson.dumps(body))
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{proxy.url}/v1/chat/completions", data=raw, headers=headers) as r,
    ):
        assert r.status == 200
    assert fake_upstream.requests[-1]["body"] == body  # the upstream decoded our bytes
    t = await stopped_trace(proxy)
    assert t.body(0) == body and t.column("body_sha256")[0] == hashlib.sha256(raw).hexdigest()


@pytest.mark.inprocess
async def test_a_response_ends_only_once_its_row_is_on_disk(fake_upstream, proxy_factory):
    """Read the file the moment each client has its whole response: the row
    is there (no flush timer, no close), for JSON, streams and a 502."""
    proxy = await proxy_factory(fake_upstream.url)
    out = proxy.config.output
    base = [{"role": "user", "content": "Look at main.py"}]
    async with aiohttp.ClientSession() as s:
        for k, stream in enumerate((False, True, False, True)):
            body = {"model": MODEL, "messages": [*base, {"role": "user", "content": str(k)}]}
            rid = f"r{k}"
            async with s.post(
                f"{proxy.url}/v1/chat/completions",
                json=body | {"stream": stream},
                headers={"X-Request-Id": rid},
            ) as r:
                await r.read()
            t = Trace.open(out)
            assert t.column("request_id")[-1] == rid and len(t) == k + 1
            assert t.outcome(k)["output_tool_calls"] == [TOOL_CALL]
    await proxy.stop()

    down = await proxy_factory(f"http://127.0.0.1:{closed_port()}", name="down.arrow")
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "messages": base}
        async with s.post(f"{down.url}/v1/chat/completions", json=body) as r:
            assert r.status == 502
            await r.read()
        assert Trace.open(down.config.output).outcome(0)["status"] == 502


@pytest.mark.inprocess
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this machine")
async def test_a_trace_that_cannot_be_written_never_holds_or_fails_traffic(
    fake_upstream, proxy_factory
):
    """Recording into /dev/full (every write: no space left): each client
    still gets its whole response, at once; the proxy says why it stopped."""
    proxy = await proxy_factory(fake_upstream.url, name="/dev/full")
    client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)
    msgs = [{"role": "user", "content": "Look at main.py"}]
    try:
        async with asyncio.timeout(5):  # a held response would wait 10 s (hold_limit)
            for k in range(6):
                if k % 2:
                    calls = []
                    stream = await client.chat.completions.create(
                        model=MODEL, messages=msgs, stream=True
                    )
                    async for c in stream:
                        if c.choices and c.choices[0].delta.tool_calls:
                            calls += c.choices[0].delta.tool_calls
                    assert calls[0].function.name == "read_file"
                else:
                    r = await client.chat.completions.create(model=MODEL, messages=msgs)
                    assert r.choices[0].message.tool_calls[0].function.name == "read_file"
    finally:
        await client.close()
    st = proxy.stats()
    assert st.stopped is not None and st.stopped.startswith("disk full writing /dev/full (")
    assert (st.recorded, st.rows_flushed, st.rows_lost, st.write_errors) == (6, 0, 6, 1)
    async with asyncio.timeout(10):
        await proxy.stop()


@pytest.mark.inprocess
async def test_a_chunked_body_past_the_limit_is_413_and_never_forwarded(
    fake_upstream, proxy_factory
):
    """A chunked body declares no length: it is counted as it arrives, and
    the byte past ``max_body`` ends it with 413 (connection closed); nothing
    is forwarded or recorded, and a body at the limit goes through."""
    proxy = await proxy_factory(fake_upstream.url, max_body=64 << 10)
    over = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 70_000}]})

    async def chunked(raw):
        for i in range(0, len(raw), 8192):
            yield raw[i : i + 8192]

    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{proxy.url}/v1/chat/completions", data=chunked(over)) as r,
    ):
        assert r.status == 413
        assert "exceeds the limit of 65,536" in (await r.json())["error"]["message"]
    assert fake_upstream.requests == []
    ok = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "y" * 1000}]})
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{proxy.url}/v1/chat/completions", data=chunked(ok)) as r,
    ):
        assert r.status == 200
    t = await stopped_trace(proxy)
    assert len(t) == 1 and t.column("body_bytes")[0] == len(ok)
