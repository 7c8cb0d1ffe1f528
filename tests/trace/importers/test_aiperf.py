"""aiperf importer: AIPerf ``mooncake_trace`` rows, on the real Mooncake trace
(a valid AIPerf input) and on ``replayer export --format aiperf`` output of
chat, text and blocks traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from replayer.cli import build_parser
from replayer.trace import Kind, RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.stats import inspect_trace
from tests.helpers.importers import (
    assert_fails_cleanly_or_imports,
    assert_import_fails,
    blocks_prompt,
    garbage_file,
    import_error,
    import_trace,
    inspect_cli,
    mutants,
    truncated_file,
    truncated_gzip,
)

TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]


def write(path: Path, recs: list[RequestRecord]) -> Trace:
    with TraceWriter(path, TraceMeta(source="test")) as w:
        for r in recs:
            w.add(r)
    return Trace.open(path)


def export_aiperf(trace: Trace, out: Path) -> Path:
    args = build_parser().parse_args(
        ["export", str(trace.path), "-o", str(out), "--force", "--format", "aiperf"]
    )
    assert args.func(args) == 0
    return out


def write_rows(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def assert_same_by_session_turn(a: Trace, b: Trace, *, bodies: bool = True) -> None:
    """AIPerf rows carry no request ids: match requests by (session, turn)."""
    assert len(a) == len(b)
    ca, cb = a.column, b.column
    where = {(cb("session_id")[r], cb("turn")[r]): r for r in range(len(b))}
    assert len(where) == len(b)
    for r in range(len(a)):
        s = where[(ca("session_id")[r], ca("turn")[r])]
        for col in ("start_us", "kind", "input_tokens", "max_tokens", "block_size", "model"):
            assert cb(col)[s] == ca(col)[r], (col, r)
        if bodies:
            assert b.body(s) == a.body(r), r
        else:
            assert b.content(s) == a.content(r)
            assert json.loads(b.params_text(s)) == json.loads(a.params_text(r))
    assert [(cb("session_id")[r], cb("turn")[r]) for r in b.order] == [
        (ca("session_id")[r], ca("turn")[r]) for r in a.order
    ]


def chat_recs() -> list[RequestRecord]:
    recs = []
    for sid, n, t0 in (("a", 4, 0), ("b", 3, 1_500)):
        msgs: list[dict[str, Any]] = [{"role": "system", "content": f"you are {sid}"}]
        for k in range(n):
            msgs.append({"role": "user", "content": [{"type": "text", "text": f"step {k}"}]})
            body = {
                "messages": list(msgs),
                "tools": TOOLS,
                "max_tokens": 20 + k,
                "temperature": 0.2,
                "top_p": 0.9,
            }
            recs.append(
                RequestRecord.from_body(
                    body, request_id=f"{sid}{k}", session_id=sid, turn=k, start_us=t0 + 250_125 * k
                )
            )
            msgs.append({"role": "assistant", "content": f"done {k}"})
    return recs


def text_recs() -> list[RequestRecord]:
    return [
        RequestRecord.from_body(
            {
                "prompt": "The quick" + " brown fox" * k,
                "max_tokens": 7,
                "ignore_eos": True,
                "seed": k,
            },
            request_id=f"t{k}",
            session_id="txt",
            turn=k,
            start_us=1_000_001 * k,
        )
        for k in range(3)
    ]


def blocks_recs(block_size: int, tails: bool) -> list[RequestRecord]:
    """Two sessions of growing block chains; with ``tails``, prompts run past
    their blocks (unique tokens drawn from the request id, which AIPerf rows do
    not carry: ids follow the importer's ``<session>:<turn>``)."""
    recs = []
    for sid, base in (("x", 100), ("y", 200)):
        for k in range(3):
            ids = [base + j for j in range(k + 2)]
            n = len(ids) * block_size - (block_size // 2 if not tails else -17)
            recs.append(
                RequestRecord(
                    request_id=f"{sid}:{k}",
                    session_id=sid,
                    turn=k,
                    start_us=3_000 * k + (7 if sid == "y" else 0),
                    kind=Kind.BLOCKS,
                    block_size=block_size,
                    input_tokens=n,
                    content=ids,
                    params={"prompt": None, "max_tokens": 5 + k, "ignore_eos": True},
                )
            )
    return recs


@pytest.mark.inprocess
@pytest.mark.parametrize(
    "name,recs,options",
    [
        ("chat", chat_recs(), ()),
        ("text", text_recs(), ()),
        ("blocks512", blocks_recs(512, tails=False), ()),
        ("blocks64-tails", blocks_recs(64, tails=True), ("--block-size", "64")),
    ],
)
def test_export_round_trip(name, recs, options, tmp_path):
    a = write(tmp_path / f"{name}.arrow", recs)
    rows = export_aiperf(a, tmp_path / f"{name}.jsonl")
    b = import_trace("aiperf", [rows], tmp_path / f"{name}-back.arrow", *options)
    assert_same_by_session_turn(a, b)
    # the export carries request ids (an extension AIPerf ignores), so they survive
    assert sorted(b.column("request_id")) == sorted(a.column("request_id"))


@pytest.mark.inprocess
def test_real_chat_round_trip(shared_data, tmp_path):
    src = shared_data / "tau2_bench" / "telecom_gpt-4o_agent_gpt-4o_user_2025-08-10.json.gz"
    a = import_trace("tau2-bench", [src], tmp_path / "a.arrow")
    rows = export_aiperf(a, tmp_path / "a.jsonl")
    # AIPerf sets the model itself, so the export leaves it out; --model puts it back
    b = import_trace("aiperf", [rows], tmp_path / "b.arrow", "--model", "gpt-4o")
    assert len(a) == len(b) == 217
    c = b.column
    where = {(c("session_id")[r], c("turn")[r]): r for r in range(len(b))}
    for r in range(len(a)):
        s = where[(a.column("session_id")[r], a.column("turn")[r])]
        assert b.body(s) == a.body(r)
        assert c("start_us")[s] == a.column("start_us")[r]
        assert c("end_us")[s] is None  # AIPerf rows carry no end times


@pytest.fixture(scope="module")
def mooncake(shared_data: Path) -> tuple[Path, list[dict[str, Any]]]:
    src = shared_data / "mooncake" / "conversation_trace.jsonl.gz"
    with gzip.open(src, "rt") as f:
        return src, [json.loads(line) for line in f]


def test_real_mooncake_file_is_an_aiperf_input(mooncake, tmp_path):
    src, rows = mooncake
    t = import_trace("aiperf", [src], tmp_path / "mc.arrow")
    assert len(t) == len(rows) == 12_031
    c = t.column
    for i, row in enumerate(rows):
        sid = f"conversation_trace-{i + 1:06d}"  # no session ids: one per line
        assert (c("request_id")[i], c("session_id")[i], c("turn")[i]) == (f"{sid}:0", sid, 0)
        assert c("start_us")[i] == row["timestamp"] * 1000
        assert (c("input_tokens")[i], c("block_size")[i]) == (row["input_length"], 512)
        assert t.content(i) == row["hash_ids"]
        assert t.params_text(i) == f'{{"prompt":null,"max_tokens":{row["output_length"]}}}'
        if i % 101 == 0:
            assert t.body(i) == {
                "prompt": blocks_prompt(row["hash_ids"], 512, row["input_length"], f"{sid}:0"),
                "max_tokens": row["output_length"],
            }
    for info in (inspect_trace(t), inspect_cli(t.path)):
        assert (info["requests"], info["sessions"]) == (12_031, 12_031)
        assert info["input_tokens"]["max"] == max(r["input_length"] for r in rows) == 126_195
        assert info["input_tokens"]["min"] == 891  # README
        assert info["duration_s"] == max(r["timestamp"] for r in rows) / 1000
        assert round(info["duration_s"]) == 3_537  # README: 0-3,537 s
        assert info["kinds"] == {"blocks": 12_031}


@pytest.mark.inprocess
def test_mooncake_import_exported_and_read_back(mooncake, tmp_path):
    """The mooncake importer's inferred sessions survive the AIPerf round trip."""
    src, _ = mooncake
    a = import_trace("mooncake", [src], tmp_path / "a.arrow")
    b = import_trace("aiperf", [export_aiperf(a, tmp_path / "a.jsonl")], tmp_path / "b.arrow")
    assert_same_by_session_turn(a, b, bodies=False)
    for r in range(0, len(a), 501):
        rid = a.column("request_id")[r]
        s = b.row_of(rid)  # request ids travel in the export
        assert b.body(s) == a.body(r), rid  # no tails here: bodies match token for token
    assert inspect_trace(b)["sessions"] == inspect_trace(a)["sessions"] == 8_101


@pytest.mark.inprocess
def test_row_semantics(tmp_path):
    rows = [
        {"session_id": "s", "timestamp": 1000.5, "text_input": "hello", "output_length": 4},
        {
            "session_id": "s",
            "delay": 250,
            "text_input": "hello again",
            "output_length": 4,
            "extra": {"max_tokens": 9, "temperature": 0},
        },
        {"session_id": "s", "text_input": "no delay", "request_id": "mine"},
        {"input_length": 40, "output_length": 2},  # no session, no hash ids, no time
        {
            "session_id": "c",
            "delay": 0.001,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": TOOLS,
        },
        {
            "session_id": "p",
            "timestamp": 3,
            "payload": {"model": "x", "input": "embed me"},
            "output_length": 99,
            "extra": {"ignored": True},
        },
        {"session_id": 7, "input_length": 600, "hash_ids": [1, 2], "output_length": 1},
    ]
    src = write_rows(tmp_path / "rows.jsonl", rows)
    t = import_trace("aiperf", [src], tmp_path / "t.arrow", "--model", "m", "--block-size", "256")
    c = t.column
    assert c("request_id") == ["s:0", "s:1", "mine", "rows-000004:0", "c:0", "p:0", "7:0"]
    assert c("session_id") == ["s", "s", "s", "rows-000004", "c", "p", "7"]
    assert c("turn") == [0, 1, 2, 0, 0, 0, 0]
    # delay counts from the previous turn's start; none at all: with the previous turn
    assert c("start_us") == [1_000_500, 1_250_500, 1_250_500, 0, 1, 3_000, 0]
    assert c("kind") == ["text", "text", "text", "blocks", "chat", "raw", "blocks"]
    assert t.body(0) == {"model": "m", "prompt": "hello", "max_tokens": 4}
    assert t.body(1) == {"model": "m", "prompt": "hello again", "max_tokens": 9, "temperature": 0}
    assert t.body(2) == {"model": "m", "prompt": "no delay"}
    assert t.body(3) == {
        "model": "m",
        "prompt": blocks_prompt([], 256, 40, "rows-000004:0"),
        "max_tokens": 2,
    }
    assert t.body(4) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": TOOLS,
    }
    assert t.body(5) == {"model": "x", "input": "embed me"}  # payload: verbatim
    assert t.body(6) == {
        "model": "m",
        "prompt": blocks_prompt([1, 2], 256, 600, "7:0"),
        "max_tokens": 1,
    }
    assert c("block_size")[6] == 256 and c("input_tokens")[6] == 600


@pytest.mark.inprocess
def test_wrong_format_and_bad_input(shared_data, mooncake, tmp_path):
    tau = shared_data / "tau_bench" / "gpt-4o-airline.json.gz"
    assert_import_fails("aiperf", tau, tmp_path, ":1:", "invalid JSON")
    azure = shared_data / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    assert_import_fails("aiperf", azure, tmp_path, ":1:", "invalid JSON")
    assert_import_fails("aiperf", garbage_file(tmp_path), tmp_path, "not")
    src, _ = mooncake
    text = gzip.decompress(src.read_bytes())
    cut = truncated_file(src, tmp_path, text.index(b"\n", 10_000) + 30, "cut.jsonl")
    line = text[: text.index(b"\n", 10_000)].count(b"\n") + 2
    assert_import_fails("aiperf", cut, tmp_path, f"cut.jsonl:{line}:", "invalid JSON")
    assert_import_fails("aiperf", truncated_gzip(src, tmp_path), tmp_path, "not readable")
    bad = {
        "two.jsonl": ({"input_length": 3, "text_input": "x"}, "exactly one of"),
        "none.jsonl": ({"session_id": "s", "output_length": 3}, "no input"),
        "delta.jsonl": (
            {"messages": [{"role": "user", "content": "x"}], "message_mode": "delta"},
            "live replies",
        ),
        "hash.jsonl": ({"text_input": "x", "hash_ids": [1]}, "only allowed with input_length"),
        "ids.jsonl": ({"input_length": 3, "hash_ids": ["a"]}, "list of integers"),
        "extra.jsonl": ({"text_input": "x", "extra": {"prompt": "y"}}, "must not hold 'prompt'"),
        "ts.jsonl": ({"text_input": "x", "timestamp": "noon"}, "timestamp must be"),
        "msgs.jsonl": ({"messages": [{"content": "no role"}]}, "with a role"),
        "list.jsonl": ([1, 2], "not a JSON object"),
    }
    for name, (row, why) in bad.items():
        path = write_rows(tmp_path / name, [{"text_input": "fine"}, row])
        msg = import_error("aiperf", path, tmp_path)
        assert f"{name}:2: not an AIPerf mooncake_trace" in msg and why in msg, msg


@pytest.mark.inprocess
def test_malformed_rows_fail_cleanly(tmp_path):
    rows = [
        {
            "session_id": "s",
            "timestamp": 10,
            "messages": [{"role": "user", "content": "a"}],
            "tools": TOOLS,
            "output_length": 3,
            "extra": {"temperature": 0},
        },
        {"session_id": "s", "delay": 5, "text_input": "hi", "output_length": 2},
        {"input_length": 70, "hash_ids": [1, 2], "output_length": 1},
        {"session_id": "p", "payload": {"prompt": "x", "max_tokens": 2}},
    ]
    ok, refused = assert_fails_cleanly_or_imports(
        "aiperf", mutants(rows, seed=5, n=40), tmp_path, ".jsonl", "--block-size", "64"
    )
    assert ok > 0 and refused > 0 and ok + refused == 40


@pytest.mark.inprocess
def test_several_files_are_independent_runs(tmp_path):
    rows = [
        {"session_id": "s", "timestamp": 0, "input_length": 100, "hash_ids": [1, 2]},
        {"session_id": "s", "delay": 10, "input_length": 150, "hash_ids": [1, 2, 3]},
    ]
    a, b = write_rows(tmp_path / "a.jsonl", rows), write_rows(tmp_path / "b.jsonl", rows)
    one = import_trace("aiperf", [a], tmp_path / "one.arrow", "--block-size", "64")
    two = import_trace("aiperf", [a, b], tmp_path / "two.arrow", "--block-size", "64")
    assert one.column("session_id") == ["s", "s"]
    assert one.column("block_ns") == [None, None]
    assert two.column("request_id") == ["a/s:0", "a/s:1", "b/s:0", "b/s:1"]
    assert two.column("block_ns") == ["a", "a", "b", "b"]
    assert two.column("start_us") == [0, 10_000, 0, 10_000]
    assert [two.content(r) for r in range(4)] == [[1, 2], [1, 2, 3]] * 2
    # the same ids name different blocks in different files, the same within one
    p = [two.body(r)["prompt"] for r in range(4)]
    assert p[0] == p[1][:100] and p[2] == p[3][:100] and p[0] != p[2]
    assert one.body(0)["prompt"] == blocks_prompt([1, 2], 64, 100, "s:0")
    assert p[3] == blocks_prompt([1, 2, 3], 64, 150, "b/s:1", ns="b")
