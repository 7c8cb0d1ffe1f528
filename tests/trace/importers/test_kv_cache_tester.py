"""kv-cache-tester importer on the whole real Claude Code corpus, checked
against an independent reading of every source file."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import orjson
import pytest

from replayer.cli import build_parser
from replayer.trace import Trace
from replayer.trace.stats import inspect_trace
from tests.helpers.importers import block

# The whole 710-session corpus is imported (about 15 s): those tests are the
# slow tier; the join rule on small documents is not.
pytestmark = [pytest.mark.inprocess]
slow = pytest.mark.slow


def import_trace(fmt, sources, out, *options):
    args = build_parser().parse_args(
        ["import", fmt, *map(str, sources), "-o", str(out), "--force", *options]
    )
    assert args.func(args) == 0
    return Trace.open(out)


def expected_requests(corpus):
    """(request_id, session_id, turn, start_s, end_s, ns-ids, in, out, model, stream)
    for every request, read straight from the JSON files, streaming."""
    for path in sorted(corpus.iterdir()):
        out = []
        with gzip.open(path) as f:
            doc = orjson.loads(f.read())

        def walk(sid, reqs, t0, out=out):
            turn = 0
            for r in reqs:
                if r["type"] == "subagent":
                    # a sub-agent with a duration ended at its t (docs/importers.md)
                    d = r.get("duration_ms")
                    at = r["t"] - d / 1000 if d is not None else r["t"]
                    walk(f"{sid}/{r['agent_id']}", r["requests"], t0 + at, out)
                    continue
                start = t0 + r["t"]
                end = start + r["api_time"] if "api_time" in r else None
                out.append(
                    (
                        f"{sid}:{turn}",
                        sid,
                        turn,
                        start,
                        end,
                        r["hash_ids"],
                        r["in"],
                        r["out"],
                        r["model"],
                        r["type"] == "s",
                    )
                )
                turn += 1

        walk(doc["id"], doc["requests"], 0.0)
        yield from out


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
    src = shared_data / "kv_cache_tester_claude_code"
    t = import_trace("kv-cache-tester", [src], tmp_path_factory.mktemp("kv") / "kv.arrow")
    # everything but the block ids, which would take gigabytes as Python ints
    exp = [e[:5] + (None,) + e[6:] for e in expected_requests(src)]
    return t, exp, src


@slow
def test_every_request_of_the_corpus(corpus):
    t, exp, src = corpus
    assert len(t) == len(exp)
    c = t.column
    n = zero = 0
    # the importer writes in source order, so both sides stream in step
    for (r, content), e in zip(t.iter_content(range(len(t))), expected_requests(src), strict=True):
        rid, sid, turn, start, end, ids, n_in, n_out, model, stream = e
        n += 1
        assert (c("request_id")[r], c("session_id")[r], c("turn")[r]) == (rid, sid, turn)
        assert c("start_us")[r] == round(start * 1e6)
        assert c("end_us")[r] == (round(end * 1e6) if end is not None else None)
        assert content == ids
        assert c("input_tokens")[r] == n_in
        assert c("block_size")[r] == 64
        assert c("block_ns")[r] == sid.split("/")[0]  # sub-agents share the trace's ids
        assert t.params_text(r) == json.dumps(
            {
                "model": model,
                "prompt": None,
                # vLLM rejects max_tokens 0: a request recorded with no output
                # asks for one token, and its meta keeps what was recorded
                "max_tokens": max(1, n_out),
                "ignore_eos": True,
                "stream": stream,
            },
            separators=(",", ":"),
        )
        if n_out == 0:
            zero += 1
            assert (t.meta(r) or {}).get("recorded_out") == 0
        else:
            assert "recorded_out" not in (t.meta(r) or {})
    assert n == len(exp)
    assert zero == 27  # the corpus's requests with "out": 0


@slow
def test_bodies_token_for_token(corpus):
    from replayer.trace.tokens import TokenSpace

    t, exp, _ = corpus
    space = TokenSpace()
    # a spread of requests small enough to expand in Python (< 40K tokens)
    sample = [e for e in exp if e[6] < 40_000][::60]
    assert len(sample) >= 40
    for rid, _, _, _, _, _, n_in, n_out, model, stream in sample:
        r = t.row_of(rid)
        ns = t.column("block_ns")[r]
        tokens = [tok for b in t.content(r) for tok in block(f"{ns}:{b}", 64)]
        tokens += space.tail(rid, n_in - len(tokens))
        assert t.body(r) == {
            "model": model,
            "prompt": tokens,
            "max_tokens": max(1, n_out),
            "ignore_eos": True,
            "stream": stream,
        }
        assert len(t.body_json(r)) == t.column("body_bytes")[r]


@slow
def test_inspect_matches_the_data_readme(corpus):
    t, exp, _ = corpus
    info = inspect_trace(t)
    subagent_requests = sum(1 for e in exp if "/" in e[1])
    assert info["requests"] - subagent_requests == 48_658  # parent requests
    assert info["sessions"] == 710 + 63  # files + sub-agents
    assert info["input_tokens"]["max"] == 894_371
    assert info["input_tokens"]["min"] == min(e[6] for e in exp)
    assert Counter(t.column("session_id"))["trace_0002"] == 33


@slow
def test_traces_do_not_share_blocks_by_accident(corpus):
    t, _, _ = corpus
    a, b = t.row_of("trace_0001:0"), t.row_of("trace_0002:0")
    # both traces number their blocks from 1; their namespaces keep them apart
    assert t.content(a)[:3] == t.content(b)[:3] == [1, 2, 3]
    assert t.body(a)["prompt"][:64] != t.body(b)["prompt"][:64]


@slow
def test_subagents_share_their_parents_namespace(corpus):
    t, _, _ = corpus
    r1, r2 = t.row_of("trace_0003/agent_001:0"), t.row_of("trace_0003/agent_002:0")
    shared = [x for x, y in zip(t.content(r1), t.content(r2), strict=False) if x == y]
    assert len(shared) >= 100  # the sub-agents' common system prompt blocks
    assert t.meta(r1)["parent_session"] == "trace_0003"


@slow
def test_session_gap_spreads_sessions(shared_data, tmp_path):
    files = sorted((shared_data / "kv_cache_tester_claude_code").iterdir())[:3]
    t = import_trace("kv-cache-tester", files, tmp_path / "t.arrow", "--session-gap", "100")
    firsts = {
        s: t.column("start_us")[r]
        for r, s in enumerate(t.column("session_id"))
        if t.column("turn")[r] == 0 and "/" not in s
    }
    assert sorted(firsts.values()) == [0, 100_000_000, 200_000_000]


def doc(tid, requests):
    return {"id": tid, "block_size": 64, "requests": requests}


def req(t, api=1.0, **kw):
    return {"t": t, "type": "n", "in": 128, "out": 4, "hash_ids": [1, 2], "api_time": api, **kw}


def joined_import(tmp_path, d):
    src = tmp_path / "trace_9000.json"
    src.write_bytes(orjson.dumps(d))
    t = import_trace("kv-cache-tester", [src], tmp_path / "t.arrow")
    rid = t.column("request_id")
    return t, {rid[r]: (t.column("start_us")[r], t.column("after")[r]) for r in range(len(t))}


def test_sub_agents_are_placed_at_their_start_and_joined_both_ways(tmp_path):
    # p0 launches two sub-agents (results back at 40 and 52 s) and one in the
    # background; p1 carries both results; p2 follows p1 alone
    sub = [req(0, 2.0), req(5, 3.0)]
    d = doc(
        "trace_9000",
        [
            req(0, 3.0),
            {"type": "subagent", "agent_id": "agent_001", "t": 40.0, "duration_ms": 36_500,
             "status": "completed", "requests": sub},
            {"type": "subagent", "agent_id": "agent_002", "t": 52.0, "duration_ms": 48_000,
             "status": "completed", "requests": sub},
            {"type": "subagent", "agent_id": "agent_003", "t": 3.3,
             "status": "async_launched", "requests": sub},
            req(60, 2.0, think_time=57.0),
            req(70),
        ],
    )  # fmt: skip
    t, got = joined_import(tmp_path, d)
    assert got == {
        "trace_9000:0": (0, None),
        # started duration_ms before t: 40 - 36.5 = 3.5 s, after p0 ended at 3 s
        "trace_9000/agent_001:0": (3_500_000, ["trace_9000:0"]),
        "trace_9000/agent_001:1": (8_500_000, None),
        "trace_9000/agent_002:0": (4_000_000, ["trace_9000:0"]),
        "trace_9000/agent_002:1": (9_000_000, None),
        # no duration: in the background from its t, joined only at its launch
        "trace_9000/agent_003:0": (3_300_000, ["trace_9000:0"]),
        "trace_9000/agent_003:1": (8_300_000, None),
        "trace_9000:1": (60_000_000, ["trace_9000/agent_001:1", "trace_9000/agent_002:1"]),
        "trace_9000:2": (70_000_000, None),
    }
    info = inspect_trace(t)["joins"]
    assert (info["joins"], info["requests_waiting"], info["sub_sessions"]) == (5, 4, 3)
    assert info["sessions_with_sub_sessions"] == 1
    assert info["sub_sessions_per_parent"]["max"] == 3


def test_a_sub_agent_first_or_last_in_its_session_joins_one_way(tmp_path):
    sub = [req(0, 1.0)]
    d = doc(
        "trace_9001",
        [
            {"type": "subagent", "agent_id": "agent_001", "t": 5.0, "duration_ms": 2_000,
             "requests": sub},
            req(10),
            {"type": "subagent", "agent_id": "agent_002", "t": 30.0, "duration_ms": 9_000,
             "requests": sub},
        ],
    )  # fmt: skip
    _, got = joined_import(tmp_path, d)
    assert got == {
        "trace_9001/agent_001:0": (3_000_000, None),  # nothing launched it in the document
        "trace_9001:0": (10_000_000, ["trace_9001/agent_001:0"]),
        "trace_9001/agent_002:0": (21_000_000, ["trace_9001:0"]),  # nothing waits for it
    }
