"""Client aborts, recorded and replayed: a client that left after N streamed
events is recorded so (``meta.abort``), the replay leaves after N events too
(the emulator's own log says where), ``--aborts complete`` reads it to its
end, and a crash that needs the abort (an emulator fault on ``abort``)
comes with ``replay`` and not with ``complete``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from replayer.options.server import Endpoint
from replayer.record.proxy import RecordConfig, RecordingProxy
from replayer.replay.aborts import AbortAt, abort_point
from replayer.replay.policy import Aborts, ReplayPolicy
from replayer.replay.run import EXIT_FAILED, EXIT_OK
from replayer.testing.emulator import EmulatorProcess, apoll_until
from replayer.trace.reader import Trace
from tests.helpers.replay import MODEL, replay

N = 4
"""Events the recorded client reads before it leaves: the role event and 3 tokens."""
MAX_TOKENS = 12
# a decode step of 0.2 s: the disconnect reaches the server long before its next token
EMU = ["--decode-time", "0.2", "--seed", "3"]
FAULT = "exit code=1 when abort>=1 and cached_tokens>=32"


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("meta", "want"),
    [
        (None, None),
        ({"session": "new"}, None),
        ({"abort": {"after_chunks": 3, "after_us": 900}}, AbortAt(3, 900)),
        ({"abort": {"after_chunks": 0, "after_us": 900}}, AbortAt(None, 900)),
        ({"abort": {"after_us": 1500}}, AbortAt(None, 1500)),
        ({"abort": {"after_chunks": True}}, None),
        # recorded before meta.abort existed: the event count and the exchange's end
        ({"abandoned": "client", "events": 5, "timing_us": {"done": 70}}, AbortAt(5, 70)),
        ({"abandoned": "shutdown", "events": 5, "timing_us": {"done": 70}}, None),
    ],
)
def test_abort_point_reads_the_recorded_point(meta, want):
    assert abort_point(meta) == want


@pytest.mark.inprocess
def test_abort_is_a_policy_option_with_replay_by_default():
    assert ReplayPolicy().aborts is Aborts.REPLAY
    assert ReplayPolicy(aborts="complete").aborts is Aborts.COMPLETE  # type: ignore[arg-type]


async def _read_events(resp: aiohttp.ClientResponse, n: int | None) -> int:
    """Read ``n`` SSE events (None: to the end); how many were read."""
    got = 0
    async with asyncio.timeout(30):
        while n is None or got < n:
            line = await resp.content.readuntil(b"\n\n")
            if not line or line.startswith(b"data: [DONE]"):
                break
            got += 1
    return got


async def _record(emu: EmulatorProcess, out: Path) -> Trace:
    """Through the real recorder: a two-turn session whose second turn the
    client leaves after N events, then a lone request once it has."""
    proxy = await RecordingProxy(
        RecordConfig(upstream=emu.url, output=out, port=0, flush_interval=0.2)
    ).start()
    try:
        first = [{"role": "user", "content": " ".join(f"word{i}" for i in range(300))}]
        body: dict[str, Any] = {"model": MODEL, "stream": True, "max_tokens": MAX_TOKENS}
        url = f"{proxy.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as s:
            async with s.post(url, json={**body, "messages": first}) as r:
                await _read_events(r, None)
            reply = {"role": "assistant", "content": "ok"}
            second = [*first, reply, {"role": "user", "content": "and then?"}]
            r = await s.post(url, json={**body, "messages": second})
            assert await _read_events(r, N) == N
            r.close()  # the client gives up mid-stream
            rec = proxy.recorder
            assert rec is not None
            await apoll_until(lambda: rec.recorded == 2, 10)
            lone = [{"role": "user", "content": "a new question"}]
            async with s.post(url, json={**body, "messages": lone, "max_tokens": 2}) as r:
                await _read_events(r, None)
    finally:
        await proxy.stop()
    return Trace.open(out)


def _in_order(t: Trace, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_id = {r["request_id"]: r for r in results}
    return [by_id[t.column("request_id")[row]] for row in t.order]


def _aborts(emu: EmulatorProcess) -> list[dict[str, Any]]:
    return [e for e in emu.read_request_log() if e["event"] == "abort"]


@pytest.fixture
async def recorded(emulator_factory, tmp_path) -> Trace:
    emu = emulator_factory(EMU)
    t = await _record(emu, tmp_path / "rec.arrow")
    # the server's side of the recording: the handler had written role + 3 tokens
    assert [(e["delivered"], e["aborts"]) for e in _aborts(emu)] == [(N - 1, 1)]
    return t


async def test_a_recorded_abort_replays_as_a_disconnect_after_the_same_events(
    recorded, emulator_factory, tmp_path
):
    t = recorded
    rows = t.order
    assert [(t.meta(r) or {}).get("abort", {}).get("after_chunks") for r in rows] == [None, N, None]
    emu = emulator_factory(EMU)
    target = [Endpoint("e", emu.url)]

    out, _, results = await replay(t, target, tmp_path, ReplayPolicy(), name="replay")
    results = _in_order(t, results)
    assert out.exit_code == EXIT_OK
    assert [r["status"] for r in results] == ["ok", "aborted", "ok"]
    assert results[1]["error_class"] is None and "after 4 streamed event(s)" in results[1]["error"]
    assert out.summary["targets"]["e"]["status"] == {"aborted": 1, "ok": 2}
    # server-side: the replayed client left where the recorded one did
    assert [(e["delivered"], e["aborts"]) for e in _aborts(emu)] == [(N - 1, 1)]

    out, _, results = await replay(
        t, target, tmp_path, ReplayPolicy(aborts=Aborts.COMPLETE), name="complete"
    )
    results = _in_order(t, results)
    assert out.exit_code == EXIT_OK
    assert [r["status"] for r in results] == ["ok", "ok", "ok"]
    assert results[1]["completion_tokens"] == MAX_TOKENS
    assert len(_aborts(emu)) == 1  # no new abort


@pytest.mark.parametrize(("aborts", "crashes"), [(Aborts.REPLAY, True), (Aborts.COMPLETE, False)])
async def test_a_crash_on_abort_needs_the_replayed_abort(
    recorded, emulator_factory, tmp_path, aborts, crashes
):
    emu = emulator_factory([*EMU, "--fault", FAULT])
    policy = ReplayPolicy(aborts=aborts, request_timeout=10.0)
    out, _, results = await replay(recorded, [Endpoint("e", emu.url)], tmp_path, policy)
    results = _in_order(recorded, results)
    fired = [e for e in emu.read_request_log() if e["event"] == "trigger" and e["fired"]]
    if crashes:
        assert out.exit_code == EXIT_FAILED
        assert [r["status"] for r in results][:2] == ["ok", "aborted"]
        assert results[2]["status"] in ("http_error", "transport_error")
        assert [(e["on"], e["values"]["cached_tokens"] >= 32) for e in fired] == [("abort", True)]
        assert emu.wait_exit() == 1
    else:
        assert out.exit_code == EXIT_OK
        assert [r["status"] for r in results] == ["ok", "ok", "ok"]
        assert fired == [] and emu.returncode is None
