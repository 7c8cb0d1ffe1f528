"""What every importer shares: sources gzipped or not, JSON and JSONL errors
that name the file and line, the documented synthetic timing, the reply
length estimate, exact seconds to microseconds, and names for sources."""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import pytest

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import (
    SessionClock,
    SyntheticTiming,
    is_int64,
    iter_jsonl,
    load_json,
    message_problem,
    positive_int,
    reply_outcome,
    reply_tokens,
    require,
    seconds_to_us,
    session_starts,
    unique_stems,
)

pytestmark = pytest.mark.inprocess


def test_json_and_jsonl_read_gzipped_or_not(tmp_path):
    plain = tmp_path / "a.json"
    plain.write_text('{"a": 1}')
    zipped = tmp_path / "a.json.gz"
    zipped.write_bytes(gzip.compress(b'{"a": 1}'))
    assert load_json(plain, "x") == load_json(zipped, "x") == {"a": 1}
    lines = tmp_path / "a.jsonl.gz"
    lines.write_bytes(gzip.compress(b'{"n": 1}\n\n{"n": 2}\n'))
    assert list(iter_jsonl(lines, "x")) == [(1, {"n": 1}), (3, {"n": 2})]


def test_errors_name_the_file_the_line_and_the_format(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"n": 1}\n{"n": \n')
    with pytest.raises(ImportFormatError) as info:
        list(iter_jsonl(bad, "an AIPerf trace"))
    assert str(info.value).startswith(f"{bad}:2: not an AIPerf trace (invalid JSON: ")
    with pytest.raises(ImportFormatError) as info:
        load_json(bad, "a tau-bench run")
    assert str(info.value).startswith(f"{bad}: not a tau-bench run (invalid JSON: ")
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(b'{"a": 1}')[:12])
    with pytest.raises(ImportFormatError) as info:
        load_json(cut, "x")
    assert str(info.value).startswith(f"{cut}: not readable as x: ")
    with pytest.raises(ImportFormatError) as info:
        load_json(tmp_path / "missing.json", "x")
    assert str(info.value).startswith(f"{tmp_path / 'missing.json'}: cannot open: ")
    require(True, "p", "x", "never")
    with pytest.raises(ImportFormatError, match=r"^p: not x \(no sessions\)$"):
        require(False, "p", "x", "no sessions")


def test_a_sessions_clock_is_exact_microseconds():
    timing = SyntheticTiming(session_gap=1.5, think=2.0, api_base=0.5, api_per_token=0.02)
    clock = SessionClock(timing, session_index=2)
    assert clock.request(10) == (3_000_000, 3_700_000)  # starts 2 x 1.5 s, lasts 0.5 + 0.2
    assert clock.request(0) == (5_700_000, 6_200_000)  # think 2 s after the last end
    assert list(session_starts(3, 1.5, None, seed=0)) == [0.0, 1.5, 3.0]
    poisson = list(session_starts(4, 1.5, 2.0, seed=7))
    assert poisson[0] == 0.0 and poisson == sorted(poisson)
    assert poisson == list(session_starts(4, 1.5, 2.0, seed=7))


def test_the_reply_estimate_and_outcome():
    call = {"function": {"name": "read", "arguments": '{"p": 1}'}}  # 4 + 8 chars
    assert reply_tokens({"content": "x" * 9}) == 3
    assert reply_tokens({"content": [{"type": "text", "text": "abcd"}], "tool_calls": [call]}) == 4
    assert reply_tokens({"content": None}) == 1
    assert reply_outcome({"content": "hi"}) == {
        "output_text": "hi", "output_tool_calls": None, "finish_reason": "stop",
    }  # fmt: skip
    assert reply_outcome({"content": None, "tool_calls": [call]}) == {
        "output_text": None, "output_tool_calls": [call], "finish_reason": "tool_calls",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": None}], None),
        ({"role": "user"}, "messages is not a list"),
        ([{"content": "x"}], "message 0 is not an object with a role"),
        ([{"role": "user"}, {"role": "assistant", "tool_calls": {}}], None),
        ([{"role": "user"}, {"role": "assistant", "tool_calls": "x"}],
         "message 1: tool_calls is not a list"),
    ],
)  # fmt: skip
def test_message_problem(messages, problem):
    assert message_problem(messages) == problem


def test_seconds_to_microseconds_without_float_drift():
    assert seconds_to_us(1.000001) == 1_000_001
    assert seconds_to_us(0.1 + 0.2) == 300_000
    assert seconds_to_us(3) == 3_000_000
    assert seconds_to_us(1.5, scale=1000) == 1500  # milliseconds
    assert seconds_to_us(2.0000005) == 2_000_000  # half to even


def test_small_parsers():
    assert positive_int("16") == 16
    for text in ("0", "-1", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"got {text!r}"):
            positive_int(text)
    assert is_int64(2**63 - 1) and is_int64(-(2**63))
    assert not is_int64(2**63) and not is_int64(True) and not is_int64(1.0)


def test_unique_stems_in_source_order():
    paths = [Path("a/run.json.gz"), Path("b/run.json"), Path("c/other.jsonl"), Path("d/run")]
    assert unique_stems(paths) == ["run", "run~2", "other", "run~3"]
