"""Mooncake importer on the real FAST'25 traces, checked against an
independent reading of the source files."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from replayer.cli import build_parser
from replayer.trace import Trace
from replayer.trace.stats import inspect_trace
from tests.helpers.importers import block

pytestmark = pytest.mark.inprocess


def import_trace(fmt, sources, out, *options):
    args = build_parser().parse_args(
        ["import", fmt, *map(str, sources), "-o", str(out), "--force", *options]
    )
    assert args.func(args) == 0
    return Trace.open(out)


def source_rows(path):
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def conv(shared_data, tmp_path_factory):
    src = shared_data / "mooncake" / "conversation_trace.jsonl.gz"
    out = tmp_path_factory.mktemp("mc") / "conv.arrow"
    return src, source_rows(src), import_trace("mooncake", [src], out)


def test_every_request_reconstructs(conv):
    _, rows, t = conv
    assert set(t.column("block_ns")) == {None}  # one file: the ids are global
    assert len(t) == len(rows) == 12_031
    assert [t.column("request_id")[r] for r in t.order] == [
        f"conversation_trace-{i:06d}" for i in range(len(rows))
    ]
    contents = dict(t.iter_content())
    for i, src in enumerate(rows):
        assert contents[i] == src["hash_ids"]
        assert t.column("start_us")[i] == src["timestamp"] * 1000
        assert t.column("input_tokens")[i] == src["input_length"]
        assert t.params_text(i) == (
            f'{{"prompt":null,"max_tokens":{src["output_length"]},"ignore_eos":true}}'
        )
    # whole bodies, token for token, on a spread of requests
    for i in range(0, len(rows), 97):
        src = rows[i]
        tokens = [tok for b in src["hash_ids"] for tok in block(b, 512)][: src["input_length"]]
        assert t.body(i) == {
            "prompt": tokens,
            "max_tokens": src["output_length"],
            "ignore_eos": True,
        }


def test_inspect_matches_the_source(conv):
    _, rows, t = conv
    info = inspect_trace(t)
    assert info["requests"] == 12_031
    assert info["input_tokens"]["max"] == max(r["input_length"] for r in rows) == 126_195
    assert info["duration_s"] == max(r["timestamp"] for r in rows) / 1000
    assert info["kinds"] == {"blocks": 12_031}


def naive_sessions(rows, forks):
    """Brute force: each request joins the latest earlier request whose
    full-block chain (>= 2 blocks) is a prefix of its own hash ids."""
    session, last_of, out = {}, {}, []
    for i, r in enumerate(rows):
        h = r["hash_ids"]
        parent = None
        for j in range(i - 1, -1, -1):
            full = rows[j]["hash_ids"][: rows[j]["input_length"] // 512]
            if len(full) >= 2 and h[: len(full)] == full:
                parent = j
                break
        if parent is not None and (forks == "join" or last_of[session[parent]] == parent):
            session[i] = session[parent]
        else:
            session[i] = i
        last_of[session[i]] = i
        out.append(session[i])
    return out


@pytest.mark.parametrize("forks", ["split", "join"])
def test_session_inference_matches_brute_force(shared_data, tmp_path, forks):
    src = shared_data / "mooncake" / "conversation_trace.jsonl.gz"
    rows = source_rows(src)[:1500]
    cut = tmp_path / "head.jsonl"
    cut.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = import_trace("mooncake", [cut], tmp_path / "h.arrow", "--forks", forks)
    expected = naive_sessions(rows, forks)
    got = t.column("session_id")
    # same partition of requests into sessions
    assert len(set(got)) == len(set(expected))
    assert {tuple(i for i in range(len(rows)) if got[i] == s) for s in set(got)} == {
        tuple(i for i in range(len(rows)) if expected[i] == s) for s in set(expected)
    }
    turns = t.column("turn")
    for s in set(got):
        assert [turns[i] for i in range(len(rows)) if got[i] == s] == list(range(Counter(got)[s]))


@pytest.mark.parametrize(
    "name,chains,multi,longest",
    [("conversation_trace", 8_056, 2_012, 43), ("synthetic_trace", 2_549, 299, 24)],
)
def test_chain_counts_match_the_data_readme(shared_data, tmp_path, name, chains, multi, longest):
    src = shared_data / "mooncake" / f"{name}.jsonl.gz"
    t = import_trace("mooncake", [src], tmp_path / "t.arrow", "--forks", "join")
    sizes = Counter(t.column("session_id"))
    assert (len(sizes), sum(1 for v in sizes.values() if v >= 2), max(sizes.values())) == (
        chains,
        multi,
        longest,
    )


def test_forks_split_into_sessions_that_share_the_prefix(conv):
    _, rows, t = conv
    sizes = Counter(t.column("session_id"))
    assert len(sizes) == 8_101  # 45 forks of the README's 8,056 chains become sessions
    bases, sessions = t.column("base"), t.column("session_id")
    forks = [r for r in range(len(t)) if bases[r] is not None and t.column("turn")[r] == 0]
    assert len(forks) == 45
    assert all(sessions[bases[r]] != sessions[r] for r in forks)


def test_two_files_do_not_share_block_ids(shared_data, tmp_path):
    a = shared_data / "mooncake" / "conversation_trace.jsonl.gz"
    b = shared_data / "mooncake" / "synthetic_trace.jsonl.gz"
    t = import_trace("mooncake", [a, b], tmp_path / "t.arrow")
    assert len(t) == 12_031 + 3_993
    rows_b = source_rows(b)
    first_b = t.row_of("synthetic_trace-000000")
    first_a = t.row_of("conversation_trace-000000")
    assert t.content(first_b) == rows_b[0]["hash_ids"]
    assert (t.column("block_ns")[first_a], t.column("block_ns")[first_b]) == (
        "conversation_trace",
        "synthetic_trace",
    )
    # both files number their blocks from 0, yet their prompts differ
    assert t.content(first_a)[0] == t.content(first_b)[0] == 0
    assert t.body(first_a)["prompt"][:512] != t.body(first_b)["prompt"][:512]
