"""aiperf-dag importer: AIPerf ``dag_jsonl`` conversation DAGs written here
(small hand-made files of the documented shape), their spawns and forks as
exact joins, the refused modes, and a replay against the emulator that holds
a parent's ``join_at`` turn until its spawned child's last turn ended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replayer.replay.client import Endpoint
from replayer.replay.policy import Order, ReplayPolicy, Timing
from replayer.replay.results import Status
from replayer.trace import Trace
from tests.helpers.importers import import_error, import_trace
from tests.helpers.replay import MODEL, arrivals, replay

ISOLATED = "message_array_with_responses"


def turn(text: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 4, **kw}


def conv(sid: str, *turns: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"session_id": sid, "context_mode": ISOLATED, "turns": list(turns), **kw}


def dag(tmp_path: Path, *convs: dict[str, Any], name: str = "w.dag.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(c) + "\n" for c in convs))
    return path


def load(tmp_path: Path, *convs: dict[str, Any], options: tuple[str, ...] = ()) -> Trace:
    return import_trace("aiperf-dag", [dag(tmp_path, *convs)], tmp_path / "t.arrow", *options)


def joins(trace: Trace) -> dict[str, list[str]]:
    rid, after = trace.column("request_id"), trace.column("after")
    return {rid[r]: after[r] for r in range(len(trace)) if after[r]}


@pytest.mark.inprocess
def test_a_bare_spawn_fans_out_from_its_turn_and_in_at_the_next(tmp_path):
    t = load(
        tmp_path,
        conv("P", turn("plan", spawns=["C"]), turn("use the result"), turn("wrap up")),
        conv("C", turn("sub 0"), turn("sub 1")),
    )
    assert joins(t) == {"C:0": ["P:0"], "P:1": ["C:1"]}
    assert sorted(t.column("request_id")) == ["C:0", "C:1", "P:0", "P:1", "P:2"]
    body = t.body(t.row_of("P:1"))
    assert body == {"messages": [{"role": "user", "content": "use the result"}], "max_tokens": 4}
    assert t.meta(t.row_of("C:0")) == {"dag": "spawn", "parent": "P:0"}
    assert [t.column("request_id")[r] for r in t.order] == ["P:0", "C:0", "C:1", "P:1", "P:2"]


@pytest.mark.inprocess
def test_join_at_joins_a_later_turn_and_the_turns_between_run_beside(tmp_path):
    t = load(
        tmp_path,
        conv(
            "P",
            turn("plan", spawns=[{"children": ["A", "B"], "join_at": 2}]),
            turn("meanwhile"),
            turn("merge"),
        ),
        conv("A", turn("a0"), turn("a1")),
        conv("B", turn("b0")),
    )
    assert joins(t) == {"A:0": ["P:0"], "B:0": ["P:0"], "P:2": ["A:1", "B:0"]}


@pytest.mark.inprocess
def test_a_spawn_on_the_last_turn_is_never_joined(tmp_path):
    t = load(tmp_path, conv("P", turn("p0"), turn("p1", spawns=["C"])), conv("C", turn("c0")))
    assert joins(t) == {"C:0": ["P:1"]}


@pytest.mark.inprocess
def test_forks_join_on_the_forking_turn_and_a_background_fork_lets_the_parent_go_on(tmp_path):
    t = load(
        tmp_path,
        conv("P", turn("p0", forks=[{"child": "G", "background": True}]), turn("p1", forks=["F"])),
        conv("F", turn("f0"), turn("f1")),
        conv("G", turn("g0")),
    )
    assert joins(t) == {"G:0": ["P:0"], "F:0": ["P:1"]}
    assert t.meta(t.row_of("G:0")) == {"dag": "background_fork", "parent": "P:0"}
    assert t.meta(t.row_of("F:0")) == {"dag": "fork", "parent": "P:1"}


@pytest.mark.inprocess
def test_pre_session_spawns_start_with_the_first_turn_unjoined(tmp_path):
    t = load(
        tmp_path,
        conv("P", turn("p0", delay=250), pre_session_spawns=["S"]),
        conv("S", turn("s0")),
        options=("--api-base", "1", "--api-per-token", "0"),
    )
    assert joins(t) == {}
    start = dict(zip(t.column("request_id"), t.column("start_us"), strict=True))
    assert start == {"P:0": 250_000, "S:0": 0}


@pytest.mark.inprocess
def test_synthetic_times_put_every_join_after_the_end_it_waits_for(tmp_path):
    """Roots 2 s apart; each request lasts 0.5 s + 0.01 s a max token and
    starts its ``delay`` after the latest end it waits for."""
    t = load(
        tmp_path,
        conv(
            "P",
            turn("p0", spawns=[{"children": ["C"], "join_at": 2}]),
            turn("p1", delay=100),
            turn("p2", delay=10),
        ),
        conv("C", turn("c0", max_tokens=100), turn("c1", delay=1000)),
        conv("Q", turn("q0")),
        options=("--session-gap", "2", "--api-base", "0.5", "--api-per-token", "0.01"),
    )
    rows = zip(t.column("request_id"), t.column("start_us"), t.column("end_us"), strict=True)
    got = {rid: (s, e) for rid, s, e in rows}
    assert got == {
        "P:0": (0, 540_000),
        "C:0": (540_000, 2_040_000),
        "P:1": (640_000, 1_180_000),
        "Q:0": (2_000_000, 2_540_000),
        "C:1": (3_040_000, 3_580_000),
        "P:2": (3_590_000, 4_130_000),
    }


@pytest.mark.inprocess
def test_a_spawn_child_launched_twice_is_two_sessions(tmp_path):
    t = load(
        tmp_path,
        conv("P", turn("p0", spawns=["C"]), turn("p1")),
        conv("Q", turn("q0", spawns=["C"]), turn("q1")),
        conv("C", turn("c0")),
    )
    assert joins(t) == {"C#1:0": ["P:0"], "P:1": ["C#1:0"], "C#2:0": ["Q:0"], "Q:1": ["C#2:0"]}


@pytest.mark.inprocess
def test_bodies_take_model_tools_and_extra_as_aiperf_sends_them(tmp_path):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    t = load(
        tmp_path,
        conv(
            "P",
            turn("p0", tools=tools, extra={"temperature": 0, "ignore_eos": True}),
            turn("p1", model="other"),
        ),
        options=("--model", "m"),
    )
    msgs = [{"role": "user", "content": "p0"}]
    assert t.body(t.row_of("P:0")) == {
        "model": "m",
        "messages": msgs,
        "tools": tools,
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
    }
    assert t.body(t.row_of("P:1"))["model"] == "other"


@pytest.mark.inprocess
@pytest.mark.parametrize("mode", [None, "deltas_without_responses", "deltas_with_responses"])
def test_a_conversation_built_at_run_time_is_refused(tmp_path, mode):
    row = conv("P", turn("p0"), context_mode=mode)
    if mode is None:
        del row["context_mode"]
    src = dag(tmp_path, row)
    said = f"context_mode {mode!r}" if mode else "the default 'deltas_without_responses'"
    assert import_error("aiperf-dag", src, tmp_path) == (
        f"{src}:1: session 'P' uses {said}: AIPerf builds those bodies at run time from the "
        "history and live replies, which a trace cannot hold; only "
        '"context_mode": "message_array_with_responses" (each turn sent as authored) is imported'
    )


@pytest.mark.inprocess
def test_an_orchestrator_is_refused(tmp_path):
    src = dag(
        tmp_path,
        {"session_id": "O", "orchestrator": True, "spawns": ["C"], "rounds": 2},
        conv("C", turn("c0")),
    )
    assert import_error("aiperf-dag", src, tmp_path) == (
        f"{src}:1: session 'O' is an AIPerf orchestrator (a request-less spine that re-fires "
        "its spawns every round), which a trace of requests cannot hold; not imported"
    )


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("convs", "why"),
    [
        (
            [conv("P", turn("p0", forks=["F"]), turn("p1")), conv("F", turn("f0"))],
            "session 'P': turn 0: a fork that ends its parent must be on the last turn",
        ),
        (
            [
                conv("P", turn("p0", spawns=[{"children": ["C"], "join_at": 1}])),
                conv("C", turn("c0")),
            ],
            "session 'P': turn 0: join_at 1 is not a later turn (of 1)",
        ),
        (
            [conv("P", turn("p0", spawns=["X"]), turn("p1"))],
            "session 'P': branch target 'X' is not a conversation of the file",
        ),
        (
            [conv("A", turn("a0", spawns=["B"]), turn("a1")), conv("B", turn("b0", spawns=["A"]))],
            "session 'A': the launches form a cycle: A -> B -> A",
        ),
        ([conv("P", turn("p0"), bogus=1)], "unknown conversation key 'bogus'"),
    ],
)
def test_a_malformed_dag_is_refused_with_its_reason(tmp_path, convs, why):
    src = dag(tmp_path, *convs)
    msg = import_error("aiperf-dag", src, tmp_path)
    assert msg.startswith(f"{src}:1: not an AIPerf dag_jsonl file (") and msg.endswith(f"{why})")


@pytest.mark.parametrize("order", ["strict", "session"])
async def test_a_join_at_turn_reaches_the_server_after_the_childs_last_turn_ended(
    emulator_factory, tmp_path, order
):
    """P's turn 0 spawns C (three long turns) with ``join_at: 2``: P's turn 1
    runs beside C, and P's turn 2 reaches the emulator after C's last turn
    arrived, with nothing running or waiting in the engine (it is the only
    thing in flight then: C's last turn and P's turn 1 have ended)."""
    trace = load(
        tmp_path,
        conv(
            "P",
            turn("plan", spawns=[{"children": ["C"], "join_at": 2}]),
            turn("meanwhile"),
            turn("merge"),
        ),
        conv("C", *(turn(f"sub {k}", max_tokens=48) for k in range(3))),
    )
    emu = emulator_factory(["--speed", "200"], log_bodies=False)
    policy = ReplayPolicy(timing=Timing.ASAP, order=Order(order), model=MODEL)
    outcome, _, results = await replay(trace, [Endpoint("e", emu.url)], tmp_path, policy)
    assert outcome.exit_code == 0
    assert all(r["status"] == Status.OK for r in results), [r["error"] for r in results]
    log = {e["request_id"]: e for e in arrivals(emu)}
    assert len(log) == 6
    seq = sorted(log, key=lambda rid: log[rid]["seq"])
    assert seq.index("P:1") < seq.index("C:2") < seq.index("P:2") == 5
    assert (log["P:2"]["running"], log["P:2"]["waiting"]) == (0, 0)


@pytest.mark.inprocess
def test_a_repeated_launch_whose_name_is_taken_is_refused(tmp_path):
    src = dag(
        tmp_path,
        conv("P", turn("p0", spawns=["C", "C#1"]), turn("p1")),
        conv("Q", turn("q0", spawns=["C"]), turn("q1")),
        conv("C", turn("c0")),
        conv("C#1", turn("x")),
    )
    assert import_error("aiperf-dag", src, tmp_path) == (
        f"{src}: not an AIPerf dag_jsonl file (session 'C#1' names two launches)"
    )
