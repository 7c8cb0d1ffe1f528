"""Every failure mode, driven in a real emulator process: what a client sees
(status, body, stream tail, exit code, /health before and after) against
VLLM.md §2, and the log lines a crash detector greps for."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from replayer.testing.emulator import apoll_until
from tests.helpers.emulator import BOUND, DEAD, DEAD_EVENT, DONE, MODEL, Stream, chat, in_order

pytestmark = pytest.mark.e2e

LONG = {"max_tokens": 100_000, "stream": True}
INTERNAL = (
    b'{"error":{"message":"Internal server error","type":"InternalServerError",'
    b'"param":null,"code":500}}'
)


def aclient(emu) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=emu.url, timeout=30)


async def test_exit_streams_get_the_error_event_then_the_process_exits_0(emulator_factory):
    emu = emulator_factory(["--decode-time", "0.02", "--fault", "exit when request=2 after=60"])
    assert emu.health() == 200
    s1, s2 = Stream(), Stream()
    async with asyncio.timeout(BOUND), aclient(emu) as c, asyncio.TaskGroup() as tg:
        tg.create_task(s1.run(c, "/v1/chat/completions", chat("one", **LONG)))
        await apoll_until(s1.has_content, 10)
        tg.create_task(
            s2.run(
                c, "/v1/chat/completions", chat("two", **LONG), headers={"X-Request-Id": "crash-me"}
            )
        )
        await apoll_until(lambda: s1.done and s2.done, 10)
        # The engine is dead but the API is up (the exit is 60 s away) ...
        assert emu.health() == 503
        for path in ("/v1/models", "/version", "/metrics"):
            assert (await c.get(path)).status_code == 200
        # ... until a request meets the dead engine: a plain JSON 500, even for
        # stream=true, and vLLM's terminate_if_errored starts the shutdown.
        r = await c.post("/v1/chat/completions", json=chat("three", stream=True))
        assert (r.status_code, r.content) == (500, DEAD)
        assert r.headers["content-type"] == "application/json"
    # In-flight streams: tokens so far, then the error event and [DONE]; no finish chunk.
    assert s1.status == 200 and s1.error is None
    assert s1.body.endswith(b'"finish_reason":null,"token_ids":null}]}\n\n' + DEAD_EVENT + DONE)
    assert b'"finish_reason":"length"' not in s1.body
    assert (s2.status, s2.body) == (200, DEAD_EVENT + DONE)  # crashed during its prefill
    assert await emu.await_exit(15) == 0
    assert emu.health() is None  # connection refused
    log = emu.read_log()
    (crashed,) = [x for x in emu.events("request") if x["request_id"] == "crash-me"]
    in_order(
        log,
        "(Worker_TP7 pid=",
        "Memory access fault by GPU node-",
        "Worker proc VllmWorker-7 died unexpectedly (exit code: -6), shutting down executor.",
        "Dumping input data for V1 LLM engine (v0.33.0) with config: model='moonshotai/Kimi-K3'",
        f"scheduled_new_reqs=[NewRequestData(req_id={crashed['engine_id']},",
        "EngineCore encountered a fatal error.",
        "RuntimeError: Executor failed.",
        "AsyncLLM output_handler failed.",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
        "trace (above) for the root cause.",
        "Error in chat completion stream generator.",
        '"POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error',
        "INFO:     Shutting down",
        "INFO:     Waiting for application shutdown.",
        "INFO:     Application shutdown complete.",
        f"INFO:     Finished server process [{emu.pid}]",
    )
    assert crashed["engine_id"].startswith("chatcmpl-crash-me-")
    (effect,) = emu.events("effect")
    assert (effect["rule"], effect["effect"], effect["n"]) == ("fault0", "exit", 2)


HIP = "Triton Error [HIP]: Code: 700, Message: an illegal memory access was encountered"
CUDA = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize(
    ("gpu", "code", "worker", "engine"),
    [
        ("hip", 1, f"RuntimeError: {HIP}", f"RuntimeError: Worker failed with error '{HIP}'"),
        ("cuda", 3, f"torch.AcceleratorError: {CUDA}", f"Worker failed with error '{CUDA}'"),
    ],
)
def test_exit_flavours_and_codes_after_the_watchdog_delay(
    emulator_factory, gpu, code, worker, engine
):
    emu = emulator_factory(
        ["--speed", "instant", "--fault", f"exit code={code} gpu={gpu} after=0.2 when request=1"]
    )
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": True}
        r = c.post("/v1/completions", json=body)
    # /v1/completions serializes its error event with json.dumps: spaces.
    assert r.content == (
        b'data: {"error": {"message": "The server had an error while processing your request.",'
        b' "type": "InternalServerError", "param": null, "code": 500}}\n\n' + DONE
    )
    assert emu.wait_exit(15) == code  # no request met the dead engine: the watchdog exits
    in_order(
        emu.read_log(),
        "ERROR",
        "WorkerProc hit an exception.",
        worker,
        "Dumping scheduler output",
        "EngineCore encountered a fatal error.",
        engine,
        "AsyncLLM output_handler failed.",
        "Error in completion stream generator.",
        "Finished server process",
    )


async def test_dead_engine_keeps_the_api_up(emulator_factory):
    emu = emulator_factory(["--decode-time", "0.02", "--fault", "dead when request=1"])
    assert emu.health() == 200
    s = Stream()
    async with asyncio.timeout(BOUND), aclient(emu) as c:
        await s.run(c, "/v1/chat/completions", chat(**LONG))
        assert (s.status, s.body) == (200, DEAD_EVENT + DONE)
        assert emu.health() == 503
        for body in (chat(), chat(stream=True)):
            r = await c.post("/v1/chat/completions", json=body)
            assert (r.status_code, r.content) == (500, DEAD)
        r = await c.post("/v1/completions", json={"prompt": "x"})
        assert (r.status_code, r.content) == (500, DEAD)
        assert (await c.post("/tokenize", json={"prompt": "abcd"})).json()["count"] == 1
        assert (await c.get("/metrics")).status_code == 200
    assert emu.health() == 503 and emu.proc.poll() is None  # never exits
    assert "Shutting down" not in emu.read_log()


def test_keep_alive_on_engine_death_turns_exit_into_dead(emulator_factory):
    emu = emulator_factory(
        ["--speed", "instant", "--fault", "exit after=0 when request=1"],
        env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"},
    )
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        for _ in range(2):
            r = c.post("/v1/chat/completions", json=chat())
            assert (r.status_code, r.content) == (500, DEAD)
    assert emu.health() == 503 and emu.proc.poll() is None


async def test_hang_health_200_and_no_more_tokens(emulator_factory):
    emu = emulator_factory(
        ["--decode-time", "0.02", "--fault", "hang warn_every=0.2 when request=2"]
    )
    s1, s2 = Stream(), Stream()
    warning = "No available shared memory broadcast block found in 0.2 seconds."
    async with asyncio.timeout(BOUND), aclient(emu) as c, asyncio.TaskGroup() as tg:
        t1 = tg.create_task(s1.run(c, "/v1/chat/completions", chat("one", **LONG)))
        await apoll_until(s1.has_content, 10)
        t2 = tg.create_task(s2.run(c, "/v1/chat/completions", chat("two", **LONG)))
        await emu.await_events("effect", 1)
        await apoll_until(lambda: emu.read_log().count(warning) >= 1, 10)
        seen = len(s1.buf), len(s2.buf)
        gen = _gen_tokens(await c.get("/metrics"))
        await apoll_until(lambda: emu.read_log().count(warning) >= 2, 10)
        assert (len(s1.buf), len(s2.buf)) == seen  # silent streams
        assert _gen_tokens(await c.get("/metrics")) == gen  # frozen counter
        assert emu.health() == 200
        assert b"[DONE]" not in s1.body and not s1.done and not s2.done
        t1.cancel()
        t2.cancel()
    assert "(EngineCore pid=" in emu.read_log().split(warning)[0].rsplit("\n", 1)[-1]


def _gen_tokens(r: httpx.Response) -> float:
    for line in r.text.splitlines():
        if line.startswith("vllm:generation_tokens_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no generation_tokens_total")


def test_hang_timeout_becomes_an_exit(emulator_factory):
    emu = emulator_factory(
        ["--speed", "instant", "--fault", "hang timeout=0.3 code=4 when request=1"]
    )
    t0 = time.monotonic()
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        r = c.post("/v1/chat/completions", json=chat(**LONG))
    assert time.monotonic() - t0 >= 0.3
    assert r.content == DEAD_EVENT + DONE
    assert emu.wait_exit(15) == 4
    in_order(
        emu.read_log(),
        "EngineCore encountered a fatal error.",
        "TimeoutError: RPC call to execute_model timed out.",
        "Finished server process",
    )


async def test_cut_drops_streams_mid_body_and_the_server_lives(emulator_factory):
    emu = emulator_factory(["--decode-time", "0.02", "--fault", "cut when request=3"])
    assert emu.health() == 200
    s1, s2 = Stream(), Stream()
    unary: list[BaseException] = []

    async def non_streaming(c: httpx.AsyncClient) -> None:
        try:
            await c.post("/v1/chat/completions", json=chat("three", max_tokens=100_000))
        except httpx.RemoteProtocolError as exc:
            unary.append(exc)

    async with asyncio.timeout(BOUND), aclient(emu) as c:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(s1.run(c, "/v1/chat/completions", chat("one", **LONG)))
            await apoll_until(s1.has_content, 10)
            tg.create_task(non_streaming(c))
            await emu.await_events("request", 2)
            tg.create_task(s2.run(c, "/v1/completions", {"prompt": "two", **LONG}))
        # The non-streaming request in flight loses its connection, no response at all.
        assert len(unary) == 1 and "without sending" in str(unary[0])
        for s in (s1, s2):
            assert s.status == 200 and isinstance(s.error, httpx.RemoteProtocolError)
            assert b"[DONE]" not in s.body
            assert s.body == b"" or s.body.endswith(b"\n\n")  # cut between events
        assert s1.body.startswith(b'data: {"id":"chatcmpl-') and s1.body.endswith(b"}]}\n\n")
        assert emu.health() == 200
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=2, stream=True))
        assert r.status_code == 200 and r.content.endswith(DONE)
    assert [x["n"] for x in emu.events("request")] == [1, 2, 3, 4]


async def test_cut_scope_request_spares_other_streams(emulator_factory):
    emu = emulator_factory(["--decode-time", "0.01", "--fault", "cut scope=request when request=2"])
    s1, s2 = Stream(), Stream()
    async with asyncio.timeout(BOUND), aclient(emu) as c, asyncio.TaskGroup() as tg:
        tg.create_task(s1.run(c, "/v1/chat/completions", chat("one", max_tokens=40, stream=True)))
        await apoll_until(s1.has_content, 10)
        tg.create_task(s2.run(c, "/v1/chat/completions", chat("two", **LONG)))
    assert s1.error is None and s1.body.endswith(DONE)
    assert isinstance(s2.error, httpx.RemoteProtocolError) and b"[DONE]" not in s2.body


async def test_cut_kill_is_a_sigkill(emulator_factory):
    emu = emulator_factory(["--decode-time", "0.02", "--fault", "cut kill=1 when request=2"])
    assert emu.health() == 200
    s1 = Stream()
    async with asyncio.timeout(BOUND), aclient(emu) as c, asyncio.TaskGroup() as tg:
        tg.create_task(s1.run(c, "/v1/chat/completions", chat("one", **LONG)))
        await apoll_until(s1.has_content, 10)
        with pytest.raises(httpx.HTTPError):
            await c.post("/v1/chat/completions", json=chat("two"))
    assert isinstance(s1.error, httpx.RemoteProtocolError | httpx.ReadError)
    assert b"[DONE]" not in s1.body
    assert await emu.await_exit(10) == -9
    assert emu.health() is None and "Shutting down" not in emu.read_log()


def test_slow_degrades_latency_from_the_trigger_on(emulator_factory):
    emu = emulator_factory(["--speed", "instant", "--fault", "slow add=0.02 when request=2"])
    assert emu.health() == 200
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        assert c.post("/v1/chat/completions", json=chat(max_tokens=20)).status_code == 200
        t0 = time.monotonic()
        r = c.post("/v1/chat/completions", json=chat(max_tokens=20))
        took = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20
    assert took >= 20 * 0.02  # every one of its 20 steps paid the added delay
    assert emu.health() == 200
    assert [(e["effect"], e["n"]) for e in emu.events("effect")] == [("slow", 2)]


async def test_error_fails_one_request_and_the_engine_lives(emulator_factory):
    emu = emulator_factory(
        ["--speed", "instant", "--fault", "error when request=2", "--fault", "error when request=4"]
    )
    assert emu.health() == 200
    async with asyncio.timeout(BOUND), aclient(emu) as c:
        r1 = await c.post("/v1/chat/completions", json=chat(max_tokens=3))
        r2 = await c.post(
            "/v1/chat/completions", json=chat(max_tokens=3), headers={"X-Request-Id": "bad"}
        )
        r3 = await c.post("/v1/chat/completions", json=chat(max_tokens=3))
        r4 = await c.post("/v1/chat/completions", json=chat(max_tokens=3, stream=True))
    assert [r.status_code for r in (r1, r2, r3)] == [200, 500, 200]
    assert r2.content == INTERNAL
    assert r4.status_code == 200 and r4.content == b"data: " + INTERNAL + b"\n\n" + DONE
    assert emu.health() == 200
    (line,) = [x for x in emu.events("request") if x["request_id"] == "bad"]
    assert f"Request {line['engine_id']} failed with an internal error during generation" in (
        emu.read_log()
    )


def test_older_version_wire_variants(emulator_factory):
    emu = emulator_factory(
        ["--speed", "instant", "--vllm-version", "0.20.2", "--fault", "dead when request=2"]
    )
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        ok = c.post("/v1/chat/completions", json=chat(max_tokens=1)).json()
        assert ok["system_fingerprint"] is None
        r = c.post("/v1/chat/completions", json=chat(stream=True))
        assert r.content == (  # create_streaming_error_response: json.dumps, spaced
            b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace '
            b'(above) for the root cause.", "type": "BadRequestError", "param": null, '
            b'"code": 400}}\n\n' + DONE
        )
        r = c.post("/v1/chat/completions", json=chat())
        assert r.status_code == 500 and json.loads(r.content)["error"]["message"].startswith(
            "EngineCore encountered an issue."
        )


def test_long_context_session_crashes_at_its_long_turn(emulator_factory):
    """The #50347 pattern (VLLM.md §7.1): a multi-turn session whose long turn,
    mostly served from the prefix cache, kills the engine; the dump names it."""
    rule = "exit after=0 when prompt_tokens>=200000 and cached_tokens>=100000"
    emu = emulator_factory(
        ["--speed", "instant", "--enable-prompt-tokens-details", "--fault", rule]
    )
    system = {"role": "system", "content": "S" * 4 * 60_000}
    history = [system]
    results = []
    with httpx.Client(base_url=emu.url, timeout=60) as c:
        for k, size in enumerate((10, 70_000, 80_000)):
            history = history + [{"role": "user", "content": f"{k}" + "u" * 4 * size}]
            r = c.post(
                "/v1/chat/completions",
                json={
                    "messages": history,
                    "max_tokens": 4,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
                headers={"X-Request-Id": f"turn-{k}", "X-Session-Id": "agent"},
            )
            results.append(r.content)
            history = history + [{"role": "assistant", "content": "ok"}]
    assert results[0].endswith(DONE) and b'"finish_reason":"length"' in results[1]
    assert results[2] == DEAD_EVENT + DONE
    assert emu.wait_exit(30) == 0
    crashed = emu.events("request")[2]
    assert crashed["prompt_tokens"] >= 200_000 and crashed["cached_tokens"] >= 100_000
    assert [t["fired"] for t in emu.events("trigger")] == [False, False, True]
    assert (
        f"NewRequestData(req_id={crashed['engine_id']},prompt_token_ids_len="
        f"{crashed['prompt_tokens']},"
    ) in emu.read_log()
    assert f"num_computed_tokens={crashed['cached_tokens']}," in emu.read_log()
