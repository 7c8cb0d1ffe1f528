"""Fault triggers fire exactly when their condition first holds. Each test
computes the condition independently (prompt sizes from the trace token
approximation, sessions and open streams it controls itself) and compares
with the request log's ``trigger`` lines and with what the client saw."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from replayer.testing.emulator import EmulatorProcess, apoll_until
from replayer.trace.tokens import approx_message_tokens
from tests.helpers.emulator import BOUND, DEAD_EVENT, DONE, Stream, chat

pytestmark = pytest.mark.e2e

LONG = {"max_tokens": 100_000, "stream": True}


def decisions(emu: EmulatorProcess, rule: str = "fault0") -> list[tuple[int, bool, bool]]:
    return [(t["n"], t["holds"], t["fired"]) for t in emu.events("trigger") if t["rule"] == rule]


def test_prompt_tokens_threshold(emulator_factory):
    emu = emulator_factory(["--speed", "instant", "--fault", "error when prompt_tokens>=300"])
    texts = ["a" * 400, "b" * 1100, "c" * 1300, "d" * 2000, "e" * 10]
    sizes = [approx_message_tokens({"role": "user", "content": t}) for t in texts]
    first = next(i for i, p in enumerate(sizes) if p >= 300)
    with httpx.Client(base_url=emu.url, timeout=20) as c:
        statuses = [
            c.post("/v1/chat/completions", json=chat(t, max_tokens=1)).status_code for t in texts
        ]
    assert statuses == [500 if i == first else 200 for i in range(len(texts))]
    # Evaluated on every request until it fired once (times=1), then never again.
    assert decisions(emu) == [(i + 1, i == first, i == first) for i in range(first + 1)]
    logged = [t["values"]["prompt_tokens"] for t in emu.events("trigger")]
    assert logged == sizes[: first + 1]


def test_prefix_hit_and_turn(emulator_factory):
    emu = emulator_factory(
        [
            "--speed",
            "instant",
            "--enable-prompt-tokens-details",
            "--fault",
            "error when cached_tokens>=256 and turn>=3",
        ]
    )
    system = {"role": "system", "content": "Follow the rules. " * 68}
    ps = approx_message_tokens(system)
    # Sessions diverge right after the system prompt (and 3 framing tokens of the
    # next message), so what they share is exactly the full blocks of the system prompt.
    assert ps % 16 <= 12
    history: dict[str, list[dict]] = {"s1": [system], "s2": [system]}
    order = ["s1", "s1", "s2", "s2", "s1", "s2"]
    sent: list[list[dict]] = []
    got = []
    with httpx.Client(base_url=emu.url, timeout=20) as c:
        for k, sess in enumerate(order):
            msgs = history[sess] + [{"role": "user", "content": f"{sess}-q{k} " + "z" * 300}]
            r = c.post(
                "/v1/chat/completions",
                json={"messages": msgs, "max_tokens": 2},
                headers={"X-Session-Id": sess},
            )
            got.append(r.status_code)
            sent.append(msgs)
            if r.status_code == 200:
                reply = r.json()["choices"][0]["message"]["content"]
                history[sess] = msgs + [{"role": "assistant", "content": reply}]

    def tokens(msgs):
        return sum(approx_message_tokens(m) for m in msgs)

    def common(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return tokens(a[:n])

    expected_cached = [
        max(
            [(min(common(sent[j], sent[k]), tokens(sent[k]) - 1)) // 16 * 16 for j in range(k)],
            default=0,
        )
        for k in range(len(sent))
    ]
    turns, seen = [], {}
    for sess in order:
        seen[sess] = seen.get(sess, 0) + 1
        turns.append(seen[sess])
    holds = [c >= 256 and t >= 3 for c, t in zip(expected_cached, turns, strict=True)]
    first = holds.index(True)
    assert [x["cached_tokens"] for x in emu.events("request")] == expected_cached
    assert decisions(emu) == [(k + 1, holds[k], holds[k]) for k in range(first + 1)]
    assert got == [500 if k == first else 200 for k in range(len(order))]
    assert expected_cached[1] >= 256 and turns[1] == 2  # the 'and' mattered


async def test_running_sequences(emulator_factory):
    emu = emulator_factory(["--decode-time", "0.02", "--fault", "error when running>=2"])
    streams = [Stream() for _ in range(3)]
    async with (
        asyncio.timeout(BOUND),
        httpx.AsyncClient(base_url=emu.url, timeout=30) as c,
        asyncio.TaskGroup() as tg,
    ):
        tasks = []
        for i, s in enumerate(streams):
            tasks.append(tg.create_task(s.run(c, "/v1/chat/completions", chat(f"q{i}", **LONG))))
            await apoll_until(lambda s=s: s.has_content() or s.done, 10)  # it is running now
        for t in tasks[:2]:
            t.cancel()
    lines = emu.events("trigger")
    assert [(t["n"], t["values"]["running"], t["fired"]) for t in lines] == [
        (1, 0, False),
        (2, 1, False),
        (3, 2, True),
    ]
    assert streams[2].body == b"data: " + INTERNAL + b"\n\n" + DONE


INTERNAL = (
    b'{"error":{"message":"Internal server error","type":"InternalServerError",'
    b'"param":null,"code":500}}'
)


def test_kth_distinct_session_from_any_session_header(emulator_factory):
    emu = emulator_factory(["--speed", "instant", "--fault", "error when session=3"])
    plan = [
        ("X-Session-Id", "a"),
        ("X-Session-Affinity", "b"),
        ("X-Session-Id", "a"),
        (None, None),
        ("X-Correlation-ID", "c"),
        ("X-Session-Id", "b"),
        ("X-Session-Id", "c"),
    ]
    distinct: list[str] = []
    index = []
    for _, value in plan:
        if value is not None and value not in distinct:
            distinct.append(value)
        index.append(distinct.index(value) + 1 if value is not None else 0)
    first = index.index(3)
    with httpx.Client(base_url=emu.url, timeout=20) as c:
        codes = [
            c.post(
                "/v1/chat/completions", json=chat(max_tokens=1), headers={h: v} if h else {}
            ).status_code
            for h, v in plan
        ]
    assert codes == [500 if i == first else 200 for i in range(len(plan))]
    assert [x["session_index"] for x in emu.events("request")] == index
    assert decisions(emu) == [(i + 1, i == first, i == first) for i in range(first + 1)]


async def test_kv_usage(emulator_factory):
    # 1000 blocks; a decode step takes 5 s, so the cache holds still while we look.
    emu = emulator_factory(
        [
            "--decode-time",
            "5",
            "--num-gpu-blocks-override",
            "1000",
            "--fault",
            "error when kv_usage>=0.01",
        ]
    )
    p1 = approx_message_tokens({"role": "user", "content": "k" * 796})  # 203 tokens
    s1, s2 = Stream(), Stream()
    async with (
        asyncio.timeout(BOUND),
        httpx.AsyncClient(base_url=emu.url, timeout=30) as c,
        asyncio.TaskGroup() as tg,
    ):
        t1 = tg.create_task(s1.run(c, "/v1/chat/completions", chat("k" * 796, **LONG)))
        await apoll_until(s1.has_content, 10)
        # R1 holds the blocks of its prompt plus the token being decoded.
        t2 = tg.create_task(s2.run(c, "/v1/chat/completions", chat("other", **LONG)))
        await emu.await_events("trigger", 2)
        t1.cancel()
        t2.cancel()
    expected = math.ceil((p1 + 1) / 16) / 1000
    assert [(t["n"], t["values"]["kv_usage"], t["fired"]) for t in emu.events("trigger")] == [
        (1, 0.0, False),
        (2, expected, True),
    ]


async def test_preemption(emulator_factory):
    # 8 blocks. R1 (17 tokens) holds 2; R2 (96 tokens) takes the other 6 and needs a
    # 7th for its first decode step: it preempts itself (the latest request).
    emu = emulator_factory(
        [
            "--decode-time",
            "0.05",
            "--num-gpu-blocks-override",
            "8",
            "--fault",
            "dead when preemption>=1",
        ]
    )
    r1 = chat("r" * 52, **LONG)
    r2 = chat("s" * 368, **LONG)
    assert [approx_message_tokens(b["messages"][0]) for b in (r1, r2)] == [17, 96]
    s1, s2 = Stream(), Stream()
    async with (
        asyncio.timeout(BOUND),
        httpx.AsyncClient(base_url=emu.url, timeout=30) as c,
        asyncio.TaskGroup() as tg,
    ):
        tg.create_task(s1.run(c, "/v1/chat/completions", r1))
        await apoll_until(s1.has_content, 10)
        tg.create_task(s2.run(c, "/v1/chat/completions", r2))
    async with asyncio.timeout(BOUND), httpx.AsyncClient(base_url=emu.url, timeout=30) as c:
        metrics = (await c.get("/metrics")).text
    assert [(p["n"], p["preemptions"]) for p in emu.events("preemption")] == [(2, 1)]
    (t,) = emu.events("trigger")
    assert (t["n"], t["on"], t["values"], t["fired"]) == (2, "preemption", {"preemption": 1}, True)
    assert s1.body.endswith(DEAD_EVENT + DONE) and s2.body.endswith(DEAD_EVENT + DONE)
    assert 'vllm:num_preemptions_total{engine="0",model_name="moonshotai/Kimi-K3"} 1.0' in metrics


def run_flaky(factory, seed: int) -> tuple[list[float], list[int]]:
    emu = factory(
        [
            "--speed",
            "instant",
            "--seed",
            str(seed),
            "--fault",
            "error when request>=1 p=0.5 times=0",
        ]
    )
    with httpx.Client(base_url=emu.url, timeout=20) as c:
        codes = [
            c.post("/v1/chat/completions", json=chat(max_tokens=1)).status_code for _ in range(12)
        ]
    lines = emu.events("trigger")
    assert all(t["fired"] == (t["draw"] < 0.5) and t["p"] == 0.5 for t in lines)
    assert codes == [500 if t["fired"] else 200 for t in lines]
    return [t["draw"] for t in lines], codes


def test_probability_is_seeded(emulator_factory):
    a, codes = run_flaky(emulator_factory, 3)
    b, _ = run_flaky(emulator_factory, 3)
    c, _ = run_flaky(emulator_factory, 4)
    assert a == b != c
    assert 0 < codes.count(500) < len(codes)


async def test_delay_before_the_effect(emulator_factory):
    emu = emulator_factory(["--decode-time", "0.01", "--fault", "error when request=1 delay=0.3"])
    s = Stream()
    async with asyncio.timeout(BOUND), httpx.AsyncClient(base_url=emu.url, timeout=30) as c:
        await s.run(c, "/v1/chat/completions", chat(**LONG))
    (t,) = emu.events("trigger")
    (e,) = emu.events("effect")
    assert e["t"] - t["t"] >= 0.3
    assert s.has_content() and s.body.endswith(b"data: " + INTERNAL + b"\n\n" + DONE)
