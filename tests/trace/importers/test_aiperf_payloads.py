"""aiperf-payloads importer: AIPerf's verbatim payloads. The fixture was
written by AIPerf 0.13 itself (``python -m bench aiperf_inputs``): the
``inputs.json`` of a synthetic multi-turn run, and the bodies AIPerf sent
when it replayed that file (``sent.jsonl``). Imported and replayed against
the emulator, the trace sends the same bodies in the same order; exported,
it is the same ``inputs.json``; raw_payload files and directories map their
sessions as AIPerf does."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from tests.helpers.cli import run
from tests.helpers.importers import assert_import_fails, import_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "aiperf-0.13"
INPUTS = DATA / "inputs.json"
SENT = [json.loads(line) for line in (DATA / "sent.jsonl").read_text().splitlines()]


def payloads() -> list[tuple[str, list[dict]]]:
    return [(s["session_id"], s["payloads"]) for s in json.loads(INPUTS.read_text())["data"]]


@pytest.mark.inprocess
def test_the_inputs_json_aiperf_wrote_imports_verbatim(tmp_path):
    t = import_trace("aiperf-payloads", [INPUTS], tmp_path / "t.arrow", "--session-gap", "100")
    c = t.column
    want = [(sid, k, body) for sid, bodies in payloads() for k, body in enumerate(bodies)]
    assert len(want) == 9
    got = [(c("session_id")[r], c("turn")[r], t.body(r)) for r in t.order]
    assert got == want
    assert set(c("kind")) == {"chat"} and set(c("path")) == {"/v1/chat/completions"}
    assert c("request_id")[t.order[0]] == f"{want[0][0]}:0"
    # verbatim means byte for byte in AIPerf's key order too
    assert [t.body_json(r) for r in t.order] == [orjson.dumps(b) for _, _, b in want]


@pytest.mark.e2e
def test_replayed_it_sends_what_aiperf_sent(emulator_factory, tmp_path):
    t = import_trace("aiperf-payloads", [INPUTS], tmp_path / "t.arrow", "--session-gap", "100")
    emu = emulator_factory(["--speed", "instant", "--served-model-name", "mock-model"],
                           log_bodies=True)  # fmt: skip
    res = run(
        "replay", t.path, "--target", emu.url, "--timing", "asap", "--max-inflight", "1",
        "--no-force-stream", "--out", tmp_path / "run", "--quiet",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    bodies = [e["body"] for e in emu.read_request_log() if e["event"] == "request"]
    assert bodies == SENT


def test_export_writes_the_same_inputs_json_back(tmp_path):
    t = import_trace("aiperf-payloads", [INPUTS], tmp_path / "t.arrow")
    out = tmp_path / "inputs.json"
    res = run("export", t.path, "--format", "aiperf-inputs", "-o", out)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text()) == json.loads(INPUTS.read_text())
    # a selection exports only its sessions' requests, still grouped by session
    first = payloads()[0][0]
    res = run("export", t.path, "--format", "aiperf-inputs", "--sessions", first,
              "-o", tmp_path / "one.json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "one.json").read_text()) == {
        "data": [{"session_id": first, "payloads": payloads()[0][1]}]
    }


@pytest.mark.inprocess
def test_raw_payload_directories_and_files(tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    for sid, bodies in payloads():
        (d / f"{sid}.jsonl").write_text("".join(json.dumps(b) + "\n" for b in bodies))
    t = import_trace("aiperf-payloads", [d], tmp_path / "dir.arrow")
    by_session = {}
    for r in t.order:
        by_session.setdefault(t.column("session_id")[r], []).append(t.body(r))
    assert by_session == dict(payloads())
    # a single file: every line its own session (AIPerf's single-turn mode)
    f = tmp_path / "single.jsonl"
    f.write_text("".join(json.dumps(b) + "\n" for _, bodies in payloads() for b in bodies[:1]))
    t = import_trace("aiperf-payloads", [f], tmp_path / "file.arrow")
    assert t.column("session_id") == ["single-000001", "single-000002", "single-000003"]
    assert t.column("turn") == [0, 0, 0]


@pytest.mark.inprocess
def test_the_endpoint_decides_the_kind(tmp_path):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    f = tmp_path / "claude.jsonl"
    f.write_text(json.dumps(body) + "\n")
    t = import_trace("aiperf-payloads", [f], tmp_path / "a.arrow", "--endpoint", "/v1/messages")
    assert (t.column("kind"), t.column("path")) == (["messages"], ["/v1/messages"])
    g = tmp_path / "codex.jsonl"
    g.write_text(json.dumps({"model": "m", "input": [{"role": "user", "content": "hi"}]}) + "\n")
    t = import_trace("aiperf-payloads", [g], tmp_path / "b.arrow")
    assert (t.column("kind"), t.column("path")) == (["responses"], ["/v1/responses"])


@pytest.mark.inprocess
def test_other_formats_are_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    assert_import_fails("aiperf-payloads", bad, tmp_path, "no top-level data list")
    worse = tmp_path / "worse.json"
    worse.write_text('{"data": [{"session_id": "a", "payloads": [1]}]}')
    assert_import_fails("aiperf-payloads", worse, tmp_path, "a payload is not a JSON object")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_import_fails("aiperf-payloads", empty, tmp_path, "a directory without .jsonl files")
