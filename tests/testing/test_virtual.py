"""The virtual-time fakes users get from ``replayer.testing``: the module's
own usage example runs as written, and the fake server keeps the transport
contract (a refused turn writes nothing, signals always fire)."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

import replayer.testing
from replayer.replay.results import Result, Status
from replayer.replay.transport import Request, Transport
from replayer.testing import FakeHealth, FakeServer, Script, VirtualClock, virtual

pytestmark = pytest.mark.inprocess


def test_the_names_load_on_first_use():
    assert replayer.testing.FakeServer is virtual.FakeServer
    assert issubclass(FakeServer, Transport)
    from replayer.testing import faultproxy

    assert replayer.testing.FaultProxy is faultproxy.FaultProxy
    assert set(replayer.testing.__all__) == {"Fault", "FaultKind", "FaultProxy"} | set(
        virtual.__all__
    )
    assert all(getattr(replayer.testing, n) is not None for n in replayer.testing.__all__)


async def test_the_usage_example_runs_as_written(tmp_path):
    doc = virtual.__doc__ or ""
    code = textwrap.dedent(doc.split("::\n\n", 1)[1])
    space: dict[str, object] = {}
    exec(compile(code, "replayer/testing/virtual.py:docstring", "exec"), space)
    await space["test_a_turn_waits_for_its_predecessor"](tmp_path)  # type: ignore[operator]


def request(rid: str, **kw: object) -> Request:
    r = Result(target="e", row=0, request_id=rid, session_id="s", turn=0)
    headers = {"X-Request-Id": rid, "X-Session-Id": "s"}
    return Request("http://e/v1/completions", b'{"prompt": "x"}', headers, r, 0.0, 30.0, **kw)  # type: ignore[arg-type]


async def test_a_refused_turn_arrives_nowhere_and_releases_its_signals():
    clock = VirtualClock(limit=60)
    server = FakeServer(clock, lambda rid: Script(connect=0.002))
    loop = asyncio.get_running_loop()
    sent, answered = loop.create_future(), loop.create_future()

    async def refuse() -> bool:
        return False

    req = request("r0", sent=sent, answered=answered, go=refuse)
    await server.handle(req)
    assert (server.arrivals, sent.done(), answered.done()) == ([], True, True)
    assert (req.result.status, req.result.done_us, clock.now()) == (Status.SKIPPED, None, 0.002)


async def test_an_answer_at_its_scripted_times():
    clock = VirtualClock(limit=60)
    server = FakeServer(clock, lambda rid: Script(ttft=0.010, tokens=3, itl=0.005))
    ok = request("r0")
    await server.handle(ok)
    r = ok.result
    got = (r.status, r.http_status, r.first_byte_us, r.first_token_us, r.done_us, r.chunks)
    assert got == (Status.OK, 200, 10_000, 10_000, 20_000, 3)
    assert [(a.request_id, a.session, a.at, a.body) for a in server.arrivals] == [
        ("r0", "s", 0.0, {"prompt": "x"})
    ]
    failing = FakeServer(clock, lambda rid: Script(ttft=0.001, status=503))
    err = request("r1")
    await failing.handle(err)
    assert (err.result.status, err.result.error_class, err.result.done_us) == (
        Status.HTTP_ERROR,
        "http_503",
        21_000,
    )


async def test_the_health_prober_answers_as_scripted():
    clock = VirtualClock(limit=60)
    health = FakeHealth(clock, lambda t: 200 if t < 1.0 else "refused", latency=0.25)
    first = await health.probe()
    await clock.sleep(1.0)
    second = await health.probe()
    assert [(p.t, p.status, p.error) for p in (first, second)] == [
        (0.0, 200, None),
        (1.25, None, "refused"),
    ]
    assert (health.consecutive_failures, health.last()) == (1, second)
