"""A bundle's repro.py honours joins as the replay does: a request is sent
only once its previous turn and every request its line's ``after`` names
have ended (server-side: the parent's turn that carries a sub-agent's
result reaches the emulator after the sub-agent's last turn ended, with
nothing running or waiting), in every order and timing; a join on a
request not in the bundle is dropped, no wait and no error; under
``session`` order a turn that waits holds up no other session. Its reading of
the exported ``after`` (``replayer.trace.export``) is the replay's plan
(``replayer.replay.plan.build_plan``): the same waits, starts and gaps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replayer.bundle import repro
from replayer.bundle.export import write_bundle
from replayer.replay.plan import build_plan, select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.testing.emulator import EmulatorProcess
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.export import jsonl_lines

MODEL = "moonshotai/Kimi-K3"
# (request id, session, turn, recorded start and end in ms, joins, tokens):
# a parent P launches sub-agent A from p0; p1 carries A's result, so it
# joins on A's last turn a1, which decodes long enough to be seen running
AGENT = [
    ("p0", "P", 0, 0, 10, None, 2),
    ("a0", "A", 0, 12, 30, ["p0"], 2),
    ("a1", "A", 1, 35, 60, None, 10),
    ("p1", "P", 1, 1_060, 1_070, ["a1"], 2),
]
GAP_S = 1.0
"""p1's think gap after a1's recorded end (60 ms); after p0's, it would be 1.05 s."""
EMU = ["--decode-time", "0.1", "--seed", "3"]
A1_MIN_S = 0.5
"""a1's 10 tokens take at least 9 decode steps of 0.1 s: it runs this long at least."""


def make_trace(path: Path, rows: list[tuple[Any, ...]]) -> Trace:
    with TraceWriter(path, TraceMeta(source="test")) as w:
        for rid, sid, turn, start, end, after, tokens in rows:
            body = {"model": MODEL, "messages": [{"role": "user", "content": rid}]}
            w.add(
                RequestRecord.from_body(
                    {**body, "max_tokens": tokens},
                    request_id=rid,
                    session_id=sid,
                    turn=turn,
                    start_us=start * 1000,
                    end_us=None if end is None else end * 1000,
                    path="/v1/chat/completions",
                    after=after,
                )
            )
    return Trace.open(path)


# the replay's own join fixtures, plus a join on a later request, on a name
# not in the trace, and a wait on a request with no recorded end
PLANNED = [
    ("p0", "P", 0, 0, 10, None, 3),
    ("a0", "A", 0, 12, 30, ["p0"], 3),
    ("b0", "B", 0, 15, None, ["p0", "c0"], 3),
    ("a1", "A", 1, 35, 60, None, 3),
    ("c0", "C", 0, 40, 45, ["nope"], 3),
    ("p1", "P", 1, 100, 110, ["a1", "b0", "gone"], 3),
    ("p2", "P", 2, 130, 140, None, 3),
]


@pytest.mark.inprocess
@pytest.mark.parametrize("speed", [1.0, 2.5])
def test_repro_plans_joins_as_the_replay_plans_them(tmp_path, speed):
    """repro.py is standard library only: its plan of the exported lines
    must be the replay's plan of the trace: what each request waits for,
    its start and its think gap (from the latest recorded end of what it
    waits for), and its due time in every timing."""
    trace = make_trace(tmp_path / "t.arrow", PLANNED)
    lines = [json.loads(x) for x in jsonl_lines(trace)]
    assert [ln.get("after") for ln in lines] == [r[5] for r in PLANNED]
    steps = repro.plan(lines, speed)
    for timing in Timing:
        want = build_plan(trace, select(trace), ReplayPolicy(timing=timing, speed=speed))
        for i, step in enumerate(steps):
            assert step.waits == want.waits(i), lines[i]["request_id"]
            assert step.start == pytest.approx(want.start[i])
            assert step.gap == pytest.approx(want.gap[i])
            for ended in (None, 0.0, 0.02, 0.5):
                got = step.due(timing.value, ended)
                assert got == pytest.approx(want.eligible(i, timing, ended)), (i, timing, ended)
    # b0 drops its join on c0 (later), c0 its join on a name not there, p1 "gone"
    assert [s.joins for s in steps] == [(), (0,), (0,), (), (), (2, 3), ()]
    assert [s.waits for s in steps] == [(), (0,), (0,), (1,), (), (0, 2, 3), (5,)]
    # p1's gap runs from a1's recorded end (60 ms), the latest it waits for
    assert steps[5].gap == pytest.approx(0.040 / speed)


@pytest.mark.inprocess
def test_a_line_without_after_waits_for_its_previous_turn_only():
    """A line from an older bundle has no ``after``; a malformed one is no join."""
    lines = [
        {"request_id": "x0", "session_id": "X", "start_us": 0, "end_us": 5_000},
        {"request_id": "y0", "session_id": "Y", "start_us": 1_000, "end_us": 9_000, "after": "x0"},
        {"request_id": "x1", "session_id": "X", "start_us": 20_000, "end_us": 30_000, "after": [7]},
    ]
    steps = repro.plan(lines, 1.0)
    assert [s.waits for s in steps] == [(), (), (0,)]
    assert steps[2].gap == pytest.approx(0.015)


def _bundle(tmp_path: Path, rows: list[tuple[Any, ...]] = AGENT, **policy: str) -> Path:
    trace = make_trace(tmp_path / "t.arrow", rows)
    return write_bundle(
        tmp_path / "bundle",
        trace=trace,
        trace_sha256="x" * 64,
        rows=trace.order,
        manifest={"policy": policy, "signature": None},
    )


def _repro(bundle: Path, url: str) -> subprocess.CompletedProcess[str]:
    # -I -S: isolated mode, no site-packages: the standard library alone
    return subprocess.run(
        [sys.executable, "-I", "-S", str(bundle / "repro.py"), "--url", url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


def _arrivals(emu: EmulatorProcess) -> dict[str, dict[str, Any]]:
    return {e["request_id"]: e for e in emu.read_request_log() if e["event"] == "request"}


@pytest.mark.parametrize(
    ("order", "timing"),
    [
        ("strict", "asap"),
        ("session", "asap"),
        ("admitted", "asap"),
        ("session", "gaps"),
        ("strict", "recorded"),
    ],
)
def test_a_parent_turn_reaches_the_server_after_its_sub_agent_ended(
    tmp_path, emulator_factory, order, timing
):
    """Server-side: each request that joins on another arrives after that
    one arrived, at least its run later, and with nothing running or
    waiting in the engine (the sub-agent and its parent are one chain);
    under gaps and recorded timing, its think gap after a1's end."""
    b = _bundle(tmp_path, order=order, timing=timing)
    lines = [json.loads(x) for x in (b / "requests.jsonl").read_text().splitlines()]
    assert [(ln["request_id"], ln.get("after")) for ln in lines] == [
        ("p0", None), ("a0", ["p0"]), ("a1", None), ("p1", ["a1"]),
    ]  # fmt: skip
    emu = emulator_factory(EMU)
    res = _repro(b, emu.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"({timing}, {order} order, speed 1, 2 join(s))" in res.stdout
    log = _arrivals(emu)
    assert sorted(log, key=lambda r: log[r]["seq"]) == ["p0", "a0", "a1", "p1"]
    for dependant, dep in (("a0", "p0"), ("p1", "a1")):
        assert log[dep]["seq"] < log[dependant]["seq"], dependant
        assert (log[dependant]["running"], log[dependant]["waiting"]) == (0, 0), dependant
    gap = 0.0 if timing == "asap" else GAP_S
    assert log["p1"]["t"] >= log["a1"]["t"] + A1_MIN_S + gap


def test_a_join_on_a_request_not_in_the_bundle_is_dropped(tmp_path, emulator_factory):
    """p1 joins on a request the bundle does not hold (a hand-trimmed or
    older bundle): no wait, no error; strict order sends it once a1 is on
    the wire, while a1 still runs."""
    b = _bundle(tmp_path, order="strict", timing="asap")
    path = b / "requests.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[3]["after"] = ["gone"]
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    emu = emulator_factory(EMU)
    res = _repro(b, emu.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(asap, strict order, speed 1, 1 join(s))" in res.stdout  # a0's only
    assert [ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("  ")] == ["ok"] * 4
    log = _arrivals(emu)
    assert sorted(log, key=lambda r: log[r]["seq"]) == ["p0", "a0", "a1", "p1"]
    assert log["p1"]["t"] < log["a1"]["t"] + A1_MIN_S


# x0 decodes 20 tokens (at least 1.9 s); x1 waits for it; y0, a session of
# its own, comes after both in trace order (asap timing: it may go at once)
HELD = [
    ("x0", "X", 0, 0, 2_000, None, 20),
    ("x1", "X", 1, 2_010, 2_020, None, 2),
    ("y0", "Y", 0, 2_015, 2_030, None, 2),
]
X0_MIN_S = 1.9


@pytest.mark.parametrize("order", ["session", "strict"])
def test_session_order_holds_up_no_other_session(tmp_path, emulator_factory, order):
    """Under ``session`` order, x1 waiting for x0 to end does not hold up
    y0: it reaches the server while x0 still runs. ``strict`` order sends
    the file in order: y0 goes once x1 is on the wire, after x0 ended."""
    b = _bundle(tmp_path, HELD, order=order, timing="asap")
    emu = emulator_factory(EMU)
    res = _repro(b, emu.url)
    assert res.returncode == 0, res.stdout + res.stderr
    log = _arrivals(emu)
    assert log["x0"]["seq"] < log["x1"]["seq"]
    assert log["x1"]["t"] >= log["x0"]["t"] + X0_MIN_S
    if order == "session":
        assert log["y0"]["t"] < log["x0"]["t"] + X0_MIN_S  # before or beside x0, never after
    else:
        assert log["y0"]["t"] >= log["x0"]["t"] + X0_MIN_S


def test_session_order_sends_nothing_more_once_the_server_failed(tmp_path, emulator_factory):
    """The first request to arrive kills the engine while x0 decodes: x1,
    which waits for x0, is not sent, and the script ends (no thread left
    waiting)."""
    b = _bundle(tmp_path, HELD, order="session", timing="asap")
    emu = emulator_factory([*EMU, "--fault", "dead when request=1"])
    res = _repro(b, emu.url)
    assert res.returncode == 1, res.stdout + res.stderr
    status = {
        ln.split()[0]: ln.split(None, 1)[1] for ln in res.stdout.splitlines() if ln.startswith("  ")
    }
    assert status["x1"] == "not sent"
    assert "1 request(s) not sent" in res.stdout
    assert "x1" not in _arrivals(emu)
