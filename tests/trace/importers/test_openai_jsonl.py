"""openai-jsonl importer: reads ``replayer export --format jsonl`` back
losslessly (real and hand-made traces of every payload kind), and OpenAI
request/response JSONL written by other tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from replayer.cli import build_parser
from replayer.trace import Kind, RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.stats import inspect_trace
from tests.helpers.cli import run
from tests.helpers.importers import (
    approx_tokens,
    assert_fails_cleanly_or_imports,
    assert_import_fails,
    blocks_prompt,
    garbage_file,
    import_trace,
    inspect_cli,
    mutants,
    truncated_file,
)

TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


def chat_session(sid: str, turns: int, t0: int) -> list[RequestRecord]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    out = []
    for k in range(turns):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"q{k} ünï"}]})
        out.append(
            RequestRecord.from_body(
                {
                    "model": "m",
                    "messages": list(msgs),
                    "tools": TOOLS,
                    "max_tokens": 9,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
                request_id=f"{sid}-r{k}",
                session_id=sid,
                turn=k,
                start_us=t0 + 1000 * k,
                end_us=t0 + 1000 * k + 700,
            )
        )
        call = {"id": f"c{k}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": "a b"},
        ]
    return out


def every_kind(path: Path) -> Trace:
    """A trace with chat, text, blocks (with unique tails) and raw rows."""
    recs = chat_session("chat", 3, 0)
    recs += [
        RequestRecord.from_body(
            {"model": "m", "prompt": "Once" + " upon" * k, "max_tokens": 4},
            request_id=f"txt{k}",
            session_id="txt",
            turn=k,
            start_us=1500 + k,
            path="/v1/completions",
        )
        for k in range(2)
    ]
    recs += [
        RequestRecord(
            request_id=f"blk{k}",
            session_id="blk",
            turn=k,
            start_us=2_000 * k,
            kind=Kind.BLOCKS,
            block_size=64,
            input_tokens=150 + 64 * k,
            content=[5, 6, 7][: 2 + k],
            params={"prompt": None, "max_tokens": 3, "ignore_eos": True},
        )
        for k in range(2)
    ]
    recs.append(
        RequestRecord.from_body(
            {"model": "e", "input": ["x", "y"]},
            request_id="emb",
            session_id="emb",
            turn=0,
            start_us=7,
            path="/v1/embeddings",
        )
    )
    with TraceWriter(path, TraceMeta(source="test")) as w:
        for r in recs:
            w.add(r)
    return Trace.open(path)


def export(trace: Trace, out: Path, fmt: str = "jsonl") -> Path:
    args = build_parser().parse_args(
        ["export", str(trace.path), "-o", str(out), "--force", "--format", fmt]
    )
    assert args.func(args) == 0
    return out


def assert_same_requests(a: Trace, b: Trace) -> None:
    """Ids, sessions, turns, timing, paths and bodies of every request."""
    assert len(a) == len(b)
    ca, cb = a.column, b.column
    assert [cb("request_id")[r] for r in b.order] == [ca("request_id")[r] for r in a.order]
    for r in range(len(a)):
        s = b.row_of(ca("request_id")[r])
        for col in (
            "session_id",
            "turn",
            "start_us",
            "end_us",
            "path",
            "model",
            "max_tokens",
            "stream",
        ):
            assert cb(col)[s] == ca(col)[r], (col, ca("request_id")[r])
        assert b.body(s) == a.body(r)


@pytest.mark.inprocess
def test_every_kind_round_trips(tmp_path):
    a = every_kind(tmp_path / "a.arrow")
    b = import_trace("openai-jsonl", [export(a, tmp_path / "a.jsonl")], tmp_path / "b.arrow")
    assert_same_requests(a, b)
    kinds = {b.column("request_id")[r]: b.column("kind")[r] for r in range(len(b))}
    # a token-id prompt has no text shape: kept whole as raw, its length exact
    assert kinds == {
        "chat-r0": "chat",
        "chat-r1": "chat",
        "chat-r2": "chat",
        "txt0": "text",
        "txt1": "text",
        "blk0": "raw",
        "blk1": "raw",
        "emb": "raw",
    }
    blk1 = b.row_of("blk1")
    assert b.column("input_tokens")[blk1] == 214
    assert b.body(blk1)["prompt"] == blocks_prompt([5, 6, 7], 64, 214, "blk1")
    # chat rows delta-encode again on re-import
    assert b.column("base")[b.row_of("chat-r2")] == b.row_of("chat-r1")


@pytest.mark.inprocess
@pytest.mark.parametrize("fmt", ["tau2-bench", "swe-agent", "tau-bench"])
def test_real_traces_round_trip(fmt, shared_data, tmp_path):
    src = {
        "tau2-bench": shared_data
        / "tau2_bench"
        / "telecom_gpt-4o_agent_gpt-4o_user_2025-08-10.json.gz",
        "swe-agent": shared_data / "swe_agent",
        "tau-bench": shared_data / "tau_bench" / "gpt-4o-airline.json.gz",
    }[fmt]
    a = import_trace(fmt, [src], tmp_path / "a.arrow")
    b = import_trace("openai-jsonl", [export(a, tmp_path / "a.jsonl")], tmp_path / "b.arrow")
    assert_same_requests(a, b)
    ia, ib = inspect_trace(a), inspect_trace(b)
    for k in ("requests", "sessions", "turns_per_session", "duration_s", "kinds", "models"):
        assert ia[k] == ib[k], k


def test_round_trip_through_the_cli(shared_data, tmp_path):
    src = shared_data / "mini_swe_agent" / "github_issue.traj.json"
    a, jsonl, b = tmp_path / "a.arrow", tmp_path / "a.jsonl", tmp_path / "b.arrow"
    for args in (
        ("import", "swe-agent", src, "-o", a),
        ("export", a, "-o", jsonl),
        ("import", "openai-jsonl", jsonl, "-o", b),
    ):
        res = run(*args)
        assert res.returncode == 0, res.stderr
    assert_same_requests(Trace.open(a), Trace.open(b))
    msgs = json.loads(src.read_text())
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    for info in (inspect_cli(b), inspect_trace(Trace.open(b))):
        assert (info["requests"], info["sessions"]) == (10, 1)
        assert info["input_tokens"]["max"] == approx_tokens(msgs[:last]) == 1_835
    assert info["provenance"]["source"] == "import:openai-jsonl"


def write_lines(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.inprocess
def test_bare_bodies_are_one_session_each(tmp_path):
    bodies = [
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {"model": "m", "prompt": "abc", "max_tokens": 2},
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "and?"},
            ],
        },
    ]
    src = write_lines(tmp_path / "bare.jsonl", [bodies[0], bodies[1]])
    with src.open("a") as f:
        f.write("\n" + json.dumps(bodies[2]) + "\n")  # a blank line keeps its number
    t = import_trace("openai-jsonl", [src], tmp_path / "t.arrow")
    ids = ["bare-000001", "bare-000002", "bare-000004"]
    assert t.column("request_id") == ids
    assert t.column("session_id") == ids
    assert t.column("turn") == [0, 0, 0]
    assert t.column("start_us") == [0, 0, 0]
    assert t.column("kind") == ["chat", "text", "chat"]
    assert t.column("path") == ["/v1/chat/completions", "/v1/completions", "/v1/chat/completions"]
    assert [t.body(r) for r in range(3)] == bodies
    info = inspect_trace(t)
    assert (info["requests"], info["sessions"]) == (3, 3)


@pytest.mark.inprocess
def test_wrapper_fields_timestamps_and_responses(tmp_path):
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    rows = [
        {
            "body": chat,
            "session_id": "s",
            "timestamp": 1723258246.000001,
            "end_timestamp": 1723258247.25,
            "response": {
                "id": "x",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "c",
                                    "type": "function",
                                    "function": {"name": "f", "arguments": "{}"},
                                }
                            ],
                        },
                    }
                ],
                "usage": {
                    "prompt_tokens": 11,
                    "completion_tokens": 3,
                    "prompt_tokens_details": {"cached_tokens": 8},
                },
            },
        },
        {
            "body": chat,
            "session_id": "s",
            "timestamp": "2024-08-10T02:50:46+00:00",
            "response": {
                "choices": [{"text": "done", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1},
            },
        },
        {
            "body": chat,
            "session_id": "s",
            "turn": 7,
            "timestamp": "2024-08-10T02:50:47.5",
            "response": {"error": {"message": "context too long", "type": "invalid_request"}},
            "status": 400,
        },
        {"body": chat, "session_id": "s", "note": "kept in meta"},  # untimed: previous start
        {
            "custom_id": "req-9",
            "method": "POST",
            "url": "/v2/chat",
            "body": chat,
            "start_us": 5,
            "end_us": 9,
            "ttft_us": 2,
            "response": {
                "status_code": 200,
                "request_id": "abc",
                "body": {
                    "choices": [
                        {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    ]
                },
            },
        },
    ]
    src = write_lines(tmp_path / "w.jsonl", rows)
    t = import_trace("openai-jsonl", [src], tmp_path / "t.arrow")
    c = t.column
    assert c("request_id") == ["w-000001", "w-000002", "w-000003", "w-000004", "req-9"]
    assert c("session_id") == ["s", "s", "s", "s", "req-9"]
    assert c("turn") == [0, 1, 7, 8, 0]
    # 2024-08-10T02:50:46Z is epoch 1723258246: the origin, to the microsecond
    assert c("start_us") == [1, 0, 1_500_000, 1_500_000, 5]
    assert c("end_us") == [1_250_000, None, None, None, 9]
    assert c("path") == ["/v1/chat/completions"] * 4 + ["/v2/chat"]
    assert c("input_tokens")[:2] == [11, 5]
    o = [t.outcome(r) for r in range(5)]
    assert o[0] == {
        "status": 200,
        "ttft_us": None,
        "finish_reason": "tool_calls",
        "output_text": None,
        "output_tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
        "usage_prompt_tokens": 11,
        "usage_completion_tokens": 3,
        "usage_cached_tokens": 8,
        "error": None,
    }
    assert (o[1]["output_text"], o[1]["finish_reason"], o[1]["status"]) == ("done", "length", 200)
    assert (o[2]["status"], o[2]["error"], o[2]["output_text"]) == (400, "context too long", None)
    assert o[3]["status"] is None and t.meta(3) == {"note": "kept in meta"}
    assert (o[4]["status"], o[4]["output_text"], o[4]["ttft_us"]) == (200, "ok", 2)
    assert t.meta(4) == {"method": "POST"}
    assert all(t.body(r) == chat for r in range(5))


@pytest.mark.inprocess
def test_wrong_format_and_bad_input(shared_data, tmp_path):
    mooncake = shared_data / "mooncake" / "conversation_trace.jsonl.gz"
    assert_import_fails("openai-jsonl", mooncake, tmp_path, ":1:", "use `import aiperf`")
    tau = shared_data / "tau_bench" / "gpt-4o-airline.json.gz"
    assert_import_fails("openai-jsonl", tau, tmp_path, ":1:", "invalid JSON")
    assert_import_fails("openai-jsonl", garbage_file(tmp_path), tmp_path, ":1:", "invalid JSON")
    a = every_kind(tmp_path / "a.arrow")
    jsonl = export(a, tmp_path / "a.jsonl")
    aiperf = export(a, tmp_path / "a.aiperf.jsonl", "aiperf")
    assert_import_fails("openai-jsonl", aiperf, tmp_path, ":1:", "use `import aiperf`")
    lines = jsonl.read_bytes().splitlines(keepends=True)
    cut = truncated_file(jsonl, tmp_path, len(b"".join(lines[:4])) + 40, "cut.jsonl")
    assert_import_fails("openai-jsonl", cut, tmp_path, "cut.jsonl:5:", "invalid JSON")
    dup = write_lines(tmp_path / "dup.jsonl", [orjson.loads(lines[0]), orjson.loads(lines[0])])
    assert_import_fails("openai-jsonl", dup, tmp_path, "dup.jsonl:2:", "repeats")
    arr = write_lines(tmp_path / "arr.jsonl", [[1, 2]])
    assert_import_fails("openai-jsonl", arr, tmp_path, "arr.jsonl:1:", "not a JSON object")
    ts = write_lines(tmp_path / "ts.jsonl", [{"body": {"prompt": "x"}, "timestamp": "soon"}])
    assert_import_fails("openai-jsonl", ts, tmp_path, "ts.jsonl:1:", "ISO 8601")
    turn = write_lines(tmp_path / "turn.jsonl", [{"body": {"prompt": "x"}, "turn": "1"}])
    assert_import_fails("openai-jsonl", turn, tmp_path, "turn.jsonl:1:", "turn is not an integer")


@pytest.mark.inprocess
def test_malformed_lines_fail_cleanly(tmp_path):
    a = every_kind(tmp_path / "a.arrow")
    lines = [orjson.loads(x) for x in export(a, tmp_path / "a.jsonl").read_bytes().splitlines()]
    lines.append(
        {
            "body": {"prompt": "x"},
            "timestamp": 1.5,
            "response": {"choices": [{"message": {"content": "a"}}], "usage": {"prompt_tokens": 3}},
        }
    )
    ok, refused = assert_fails_cleanly_or_imports(
        "openai-jsonl", mutants(lines, seed=4, n=40), tmp_path, ".jsonl"
    )
    assert ok > 0 and refused > 0 and ok + refused == 40


# a parent P launches sub-agents A (two turns) and B; p1 carries both results
JOINED = [
    ("p0", "P", 0, None),
    ("a0", "A", 0, ["p0"]),
    ("b0", "B", 0, ["p0"]),
    ("a1", "A", 1, None),
    ("p1", "P", 1, ["a1", "b0"]),
]


@pytest.mark.inprocess
def test_joins_round_trip_and_a_selection_drops_joins_on_what_it_leaves_out(tmp_path):
    with TraceWriter(tmp_path / "a.arrow", TraceMeta(source="test")) as w:
        for k, (rid, sid, turn, after) in enumerate(JOINED):
            body = {"model": "m", "prompt": rid, "max_tokens": 3}
            w.add(
                RequestRecord.from_body(
                    body, request_id=rid, session_id=sid, turn=turn, start_us=k, after=after
                )
            )
    a = Trace.open(tmp_path / "a.arrow")
    jsonl = export(a, tmp_path / "a.jsonl")
    lines = [orjson.loads(x) for x in jsonl.read_bytes().splitlines()]
    # only a request that joins carries the key: older readers see the old lines
    assert [ln.get("after", "absent") for ln in lines] == [
        "absent", ["p0"], ["p0"], "absent", ["a1", "b0"],
    ]  # fmt: skip
    b = import_trace("openai-jsonl", [jsonl], tmp_path / "b.arrow")
    assert_same_requests(a, b)
    assert b.column("after") == [r[3] for r in JOINED]
    assert all(b.meta(r) is None for r in range(len(b)))  # a column, not a meta key
    # sub-agent A left out: p1 keeps its join on b0 only, as a subset would
    args = build_parser().parse_args(
        ["export", str(a.path), "--sessions", "P,B", "-o", str(tmp_path / "s.jsonl")]
    )
    assert args.func(args) == 0
    s = import_trace("openai-jsonl", [tmp_path / "s.jsonl"], tmp_path / "s.arrow")
    after = dict(zip(s.column("request_id"), s.column("after"), strict=True))
    assert after == {"p0": None, "b0": ["p0"], "p1": ["b0"]}


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("after", "says"),
    [("p0", "after is not a list of request ids"), ([3], "after is not a list of request ids"),
     (["x1"], "request 'x1' joins on itself")],
)  # fmt: skip
def test_a_bad_join_is_refused_with_its_line(tmp_path, after, says):
    src = write_lines(
        tmp_path / "bad.jsonl",
        [{"request_id": "p0", "body": {"prompt": "a"}},
         {"request_id": "x1", "body": {"prompt": "b"}, "after": after}],
    )  # fmt: skip
    assert_import_fails("openai-jsonl", src, tmp_path, "bad.jsonl:2", says)
