"""Replays whose targets fail: every emulator failure mode stops dispatching,
every request is accounted for, results are written, and the exit code says
what happened. A 400 for a too-long context is recorded, not a failure."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from replayer.replay.client import Endpoint
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.run import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from tests.helpers.replay import arrivals, replay, synth


def statuses(results, target=None):
    return Counter(r["status"] for r in results if target is None or r["target"] == target)


@pytest.mark.parametrize(
    "fault,kinds",
    [
        (
            "exit when request=5",
            {"stream_error", "http_500", "connect", "stream_cut", "disconnected"},
        ),
        ("dead when request=5", {"stream_error", "http_500"}),
        ("cut when request=5", {"stream_cut"}),
        ("hang when request=5", {"timeout"}),
    ],
    ids=["exit", "dead", "cut", "hang"],
)
async def test_failure_stops_dispatch_and_accounts_for_everything(
    emulator_factory, tmp_path, fault, kinds
):
    # one session: each turn waits for the last, so exactly four complete first
    t = synth(tmp_path, sessions=1, turns=12, context=8_000, seed=1)
    emu = emulator_factory(["--speed", "20", "--fault", fault])
    policy = ReplayPolicy(timing=Timing.ASAP, request_timeout=2.0)
    out, rows, results = await replay(t, [Endpoint("e", emu.url)], tmp_path, policy)
    assert out.exit_code == EXIT_FAILED
    assert len(results) == len(rows) == 12
    rid = t.column("request_id")
    by_id = {r["request_id"]: r for r in results}
    assert set(by_id) == {rid[r] for r in rows}
    s = out.summary["targets"]["e"]
    assert s["failed"] is True
    assert s["failure"]["kind"] in kinds
    assert (s["failure"]["request_id"], s["failure"]["seq"]) == (rid[rows[4]], 4)
    assert [by_id[rid[r]]["status"] for r in rows[:4]] == ["ok"] * 4
    assert by_id[rid[rows[4]]]["status"] in ("http_error", "transport_error", "timeout")
    assert [by_id[rid[r]]["status"] for r in rows[5:]] == ["not_sent_after_crash"] * 7
    assert all(by_id[rid[r]]["error_class"] == "target_failed" for r in rows[5:])
    # the server saw exactly the five that were sent
    assert [e["request_id"] for e in arrivals(emu)] == [rid[r] for r in rows[:5]]
    saved = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())
    assert saved["targets"]["e"]["status"] == dict(sorted(statuses(results).items()))


async def test_too_long_context_is_recorded_not_a_failure(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=2, turns=4, context=6_000, seed=2)
    emu = emulator_factory(["--speed", "instant", "--max-model-len", "4000"])
    out, rows, results = await replay(
        t, [Endpoint("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP)
    )
    assert out.exit_code == EXIT_OK
    tokens = t.column("input_tokens")
    over = {t.column("request_id")[r] for r in rows if tokens[r] >= 4000}
    assert over  # the trace does cross the window
    for r in results:
        if r["request_id"] in over:
            assert (r["status"], r["http_status"], r["error_class"]) == (
                "http_error",
                400,
                "http_400",
            )
            assert "maximum context length is 4000 tokens" in r["error"]
        else:
            assert r["status"] == "ok"
    assert out.summary["targets"]["e"]["failed"] is False


async def test_skip_over_context_does_not_send(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=2, turns=4, context=6_000, seed=2)
    emu = emulator_factory(["--speed", "instant", "--max-model-len", "4000"])
    out, rows, results = await replay(
        t,
        [Endpoint("e", emu.url)],
        tmp_path,
        ReplayPolicy(timing=Timing.ASAP, skip_over_context=True),
    )
    assert out.exit_code == EXIT_OK
    tokens = t.column("input_tokens")
    over = {t.column("request_id")[r] for r in rows if tokens[r] >= 4000}
    skipped = {r["request_id"] for r in results if r["status"] == "skipped"}
    assert skipped == over
    assert all(r["error_class"] == "over_context" for r in results if r["status"] == "skipped")
    assert {e["request_id"] for e in arrivals(emu)}.isdisjoint(over)


async def test_two_targets_side_by_side_one_fails(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=1, turns=16, context=9_000, seed=3)
    bad = emulator_factory(["--speed", "20", "--fault", "exit when request=6"])
    good = emulator_factory(["--speed", "20"])
    out, rows, results = await replay(
        t,
        [Endpoint("mi355", bad.url), Endpoint("b300", good.url)],
        tmp_path,
        ReplayPolicy(timing=Timing.ASAP),
    )
    assert out.exit_code == EXIT_FAILED
    tg = out.summary["targets"]
    assert (tg["mi355"]["failed"], tg["b300"]["failed"]) == (True, False)
    assert statuses(results, "b300") == {"ok": 16}
    assert statuses(results, "mi355")["ok"] == 5
    assert len(arrivals(good)) == 16
    # both timelines count from one anchor (that they run the same schedule
    # from it is asserted exactly in test_engine, on the virtual clock)
    for name in ("b300", "mi355"):
        firsts = [r for r in results if r["target"] == name and r["seq"] == 0]
        assert len(firsts) == 1 and firsts[0]["dispatched_us"] >= firsts[0]["scheduled_us"] == 0


async def test_continue_keeps_sending_after_a_failure(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=2, turns=3, context=5_000, seed=4)
    emu = emulator_factory(["--speed", "instant", "--fault", "error when request=2"])
    from replayer.replay.policy import OnFailure

    out, rows, results = await replay(
        t,
        [Endpoint("e", emu.url)],
        tmp_path,
        ReplayPolicy(timing=Timing.ASAP, on_failure=OnFailure.CONTINUE),
    )
    assert out.exit_code == EXIT_FAILED
    assert statuses(results) == {"ok": 5, "http_error": 1}
    assert len(arrivals(emu)) == 6


@pytest.mark.inprocess
async def test_unreachable_target_exits_3(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    t = synth(tmp_path, sessions=1, turns=2, context=5_000)
    out, rows, results = await replay(t, [Endpoint("gone", f"http://127.0.0.1:{port}")], tmp_path)
    assert out.exit_code == EXIT_UNREACHABLE
    assert "unreachable" in out.summary["unreachable"]
    assert results == []
    run = orjson.loads((tmp_path / "run" / "run.json").read_bytes())
    assert run["trace"]["sha256"] and "gone" in run["unreachable"]
