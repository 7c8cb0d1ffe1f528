"""Anthropic Messages and OpenAI Responses through the recording proxy, with
the official SDKs as the clients, against the emulator: the clients see what
they see direct; the trace holds ``messages`` and ``responses`` rows with
the sessions the agents had (a ``previous_response_id`` chain included,
stored expanded); replaying it against a fresh server with no response store
delivers the recorded bodies, in order; credentials never land."""

from __future__ import annotations

import asyncio
import contextlib
import io
from typing import Any

import anthropic
import httpx
import openai
import orjson

from replayer.cli import main
from replayer.trace.reader import Trace
from tests.helpers.agent_sessions import KEY, MODEL, claude_session, codex_session, round_robin

EMU_ARGS = [
    "--speed", "instant", "--seed", "7", "--served-model-name", MODEL,
    "--enable-prompt-tokens-details", "--block-size", "16",
]  # fmt: skip
STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


def cli(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def requests_of(emu: Any) -> list[dict[str, Any]]:
    return [e for e in emu.read_request_log() if e["event"] == "request"]


async def test_sdks_see_what_they_see_direct_and_the_trace_keeps_the_sessions(
    emulator_factory, proxy_factory, tmp_path
):
    direct = emulator_factory(EMU_ARGS, env=STORE)
    behind = emulator_factory(EMU_ARGS, env=STORE, log_bodies=True)
    proxy = await proxy_factory(behind.url, add_request_id=True)

    async def agents(url: str) -> list[Any]:
        return await round_robin(
            claude_session(url, "c1", 3),
            claude_session(url, "c2", 3),
            codex_session(url, "x1", 3, chain=False),
            codex_session(url, "x2", 3, chain=True),
        )

    want = await agents(direct.url)
    got = await agents(proxy.url)
    assert got == want
    assert [len(s) for s in want] == [3, 3, 3, 3]
    await proxy.stop()
    t = Trace.open(proxy.config.output)
    c = t.column
    assert len(t) == 12 and not t.torn_tail
    by_session: dict[str, list[int]] = {}
    for r in t.order:
        by_session.setdefault(c("session_id")[r], []).append(r)
    # four sessions, three turns each, in order; each session one API
    assert sorted(len(rows) for rows in by_session.values()) == [3, 3, 3, 3]
    for rows in by_session.values():
        assert [c("turn")[r] for r in rows] == [0, 1, 2]
        assert len({c("kind")[r] for r in rows}) == 1
    kinds = sorted(c("kind")[rows[0]] for rows in by_session.values())
    assert kinds == ["messages", "messages", "responses", "responses"]
    # bodies: what the server got, except the chain, which is stored expanded
    log = {e["request_id"]: e for e in requests_of(behind)}
    meta = {r: orjson.loads(t._cell(r, "meta")) for r in range(len(t))}
    chained = [r for r in range(len(t)) if "previous_response_id" in meta[r]]
    assert len(chained) == 2
    for r in range(len(t)):
        sent = log[c("request_id")[r]]["body"]
        if r not in chained:
            assert t.body(r) == sent
            continue
        body = t.body(r)
        assert "previous_response_id" not in body and sent["previous_response_id"]
        assert meta[r]["session"] == "chain"
        parent = t.row_of(meta[r]["expanded"]["parent"])
        assert c("session_id")[parent] == c("session_id")[r]
        assert c("turn")[parent] == c("turn")[r] - 1
        # parent's (expanded) input, its output items, then the new input
        assert body["input"][: len(t.body(parent)["input"])] == t.body(parent)["input"]
        assert body["input"][-1] == sent["input"][-1]
        assert {k: v for k, v in body.items() if k != "input"} == {
            k: v for k, v in sent.items() if k not in ("input", "previous_response_id")
        }
    # outcomes recorded from each API's stream or body
    for r in range(len(t)):
        o = t.outcome(r)
        assert o["status"] == 200 and o["usage_prompt_tokens"] > 0
        assert (o["ttft_us"] is not None) == bool(c("stream")[r])
    # the API key never lands
    assert KEY.encode() not in proxy.config.output.read_bytes()

    # replay against a fresh server with no response store: every body is
    # accepted (the chain arrives expanded) and arrives as recorded, in order
    fresh = emulator_factory(EMU_ARGS, log_bodies=True)
    rc, out, err = await asyncio.to_thread(
        cli, "replay", proxy.config.output, "--target", fresh.url, "--timing", "asap",
        "--max-inflight", "1", "--no-force-stream", "--out", tmp_path / "run", "--json",
    )  # fmt: skip
    assert rc == 0, err
    assert orjson.loads(out)["targets"]["target"]["status"] == {"ok": 12}
    log2 = requests_of(fresh)
    assert [e["request_id"] for e in log2] == [c("request_id")[r] for r in t.order]
    assert [e["body"] for e in log2] == [t.body(r) for r in t.order]
    assert [e["session"] for e in log2] == [c("session_id")[r] for r in t.order]
    assert [e["path"] for e in log2] == [c("path")[r].partition("?")[0] for r in t.order]

    # or chained again, to a server with a store: each chained request carries
    # only its own input, and previous_response_id names a response this fresh
    # server made and keeps (its parent's, in this replay)
    store = emulator_factory(EMU_ARGS, env=STORE, log_bodies=True)
    rc, out, err = await asyncio.to_thread(
        cli, "replay", proxy.config.output, "--target", store.url, "--timing", "asap",
        "--responses-state", "chain", "--no-force-stream", "--out", tmp_path / "chain",
        "--json",
    )  # fmt: skip
    assert rc == 0, err
    assert orjson.loads(out)["targets"]["target"]["status"] == {"ok": 12}
    log3 = {e["request_id"]: e["body"] for e in requests_of(store)}
    for r in chained:
        rid = c("request_id")[r]
        body, recorded = log3[rid], log[rid]["body"]
        assert body["input"] == recorded["input"]  # its own input, as the client sent it
        async with httpx.AsyncClient(base_url=store.url) as h:
            held = await h.get(f"/v1/responses/{body['previous_response_id']}")
        assert held.status_code == 200
        parent = t.row_of(meta[r]["expanded"]["parent"])
        assert held.json()["output"][0]["content"][0]["text"] == t.outcome(parent)["output_text"]
    others = [c("request_id")[r] for r in range(len(t)) if r not in chained]
    assert all(log3[rid] == t.body(t.row_of(rid)) for rid in others)


async def test_a_chain_whose_parent_was_not_recorded_is_stored_as_sent(
    emulator_factory, proxy_factory
):
    emu = emulator_factory(EMU_ARGS, env=STORE)
    client = openai.AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="x", max_retries=0)
    first = await client.responses.create(model=MODEL, input="hello", max_output_tokens=4)
    await client.close()
    proxy = await proxy_factory(emu.url)
    client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
    await client.responses.create(
        model=MODEL, input="again", max_output_tokens=4, previous_response_id=first.id
    )
    await client.close()
    await proxy.stop()
    assert proxy.recorder.unexpanded == 1
    t = Trace.open(proxy.config.output)
    assert t.body(0)["previous_response_id"] == first.id
    meta = orjson.loads(t._cell(0, "meta"))
    assert meta["unexpanded"] == "the previous response was not recorded"
    assert t.column("kind") == ["raw"]  # a string input has no items


async def test_query_string_kept_count_tokens_forwarded_and_odd_bodies_recorded_raw(
    emulator_factory, proxy_factory
):
    emu = emulator_factory(EMU_ARGS, log_bodies=True)
    proxy = await proxy_factory(emu.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    msgs = [{"role": "user", "content": "count me"}]
    n = await client.beta.messages.count_tokens(model=MODEL, messages=msgs)
    assert n.input_tokens > 0
    await client.close()
    async with httpx.AsyncClient(base_url=proxy.url) as h:
        # Claude Code's own spelling of a beta request (this SDK sends a header)
        body = {"model": MODEL, "messages": msgs, "max_tokens": 4}
        r = await h.post("/v1/messages?beta=true", json=body, headers={"x-api-key": KEY})
        assert r.status_code == 200
        r = await h.post("/v1/messages", json={"model": MODEL, "messages": "hi", "max_tokens": 4})
        assert r.status_code == 400  # forwarded as sent: the server's answer
    await proxy.stop()
    t = Trace.open(proxy.config.output)
    # count_tokens passed through, not recorded; ?beta=true kept on the path
    assert t.column("path") == ["/v1/messages?beta=true", "/v1/messages"]
    assert t.column("kind") == ["messages", "raw"]
    assert orjson.loads(t._cell(1, "meta"))["unreadable"] == "messages is a str, not a list"
    assert (proxy.recorder.raw, proxy.forwarded) == (1, 3)
    assert KEY.encode() not in proxy.config.output.read_bytes()

    # asked to, it records count_tokens too: each its own session, never a turn
    proxy = await proxy_factory(emu.url, "counted.arrow", record_count_tokens=True)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    await client.messages.create(model=MODEL, messages=msgs, max_tokens=4)
    await client.messages.count_tokens(model=MODEL, messages=msgs)
    await client.close()
    await proxy.stop()
    t = Trace.open(proxy.config.output)
    assert t.column("path") == ["/v1/messages", "/v1/messages/count_tokens"]
    assert len(set(t.column("session_id"))) == 2 and t.column("turn") == [0, 0]
