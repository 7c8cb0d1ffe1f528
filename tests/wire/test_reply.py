"""What one response amounted to (:class:`~replayer.wire.reply.Reply`), apart
from any API: output times and gaps, choice 0 as the summary, the output
hash per choice, and the two assistant messages a client keeps."""

from __future__ import annotations

import hashlib

import pytest

from replayer.wire.envelope import ErrorInfo
from replayer.wire.reply import Reply

pytestmark = pytest.mark.inprocess


def test_output_times_count_chunks_and_gaps():
    r = Reply()
    for now in (1.0, 1.5, 1.75, 3.0):
        r.output(now)
    assert (r.first_token, r.last_token, r.chunks) == (1.0, 3.0, 4)
    assert (r.gap_sum, r.gap_max) == (2.0, 1.25)


def test_an_empty_reply():
    r = Reply(keep_text=True)
    assert (r.first, r.choices, r.text, r.reasoning, r.tool_calls, r.finish_reason) == (
        None, 0, None, None, None, None,
    )  # fmt: skip
    assert r.output_hash == hashlib.sha256().hexdigest()[:16]
    assert not r.finishing
    assert r.message() == {"role": "assistant", "content": None}


def test_choice_zero_is_the_summary_and_text_is_kept_only_when_asked():
    for keep in (True, False):
        r = Reply(keep_text=keep)
        r.choice(1).text.append("second")
        r.choice(0).text += ["Hel", "lo"]
        r.choice("not an index").reasoning.append("hmm")  # counts as choice 0
        r.choice(0).finish = "stop"
        assert r.choices == 2
        assert r.text == ("Hello" if keep else None)
        assert (r.reasoning, r.finish_reason, r.finishing) == ("hmm", "stop", True)


def test_the_hash_is_choice_zeros_digest_or_all_of_them_in_index_order():
    one = Reply()
    one.choice(0).digest.update(b"abc")
    assert one.output_hash == hashlib.sha256(b"abc").hexdigest()[:16]
    two = Reply()
    two.choice(1).digest.update(b"y")  # arrived first
    two.choice(0).digest.update(b"x")
    both = hashlib.sha256(hashlib.sha256(b"x").digest() + hashlib.sha256(b"y").digest())
    assert two.output_hash == both.hexdigest()[:16]


def test_an_error_or_the_end_event_is_finishing():
    r = Reply()
    r.set_error(ErrorInfo("boom", "InternalServerError", 500))
    assert (r.error, r.error_type, r.error_code, r.finishing) == (
        "boom", "InternalServerError", 500, True,
    )  # fmt: skip
    done = Reply()
    done.done = True
    assert done.finishing


def test_the_messages_a_client_keeps():
    r = Reply(keep_text=True)
    r.choice(0).calls[1] = {"id": "b", "type": "function", "function": {"name": "g"}}
    r.choice(0).calls[0] = {"id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}}
    assert [c["id"] for c in r.tool_calls] == ["a", "b"]  # by index, not arrival
    assert r.message() == {"role": "assistant", "content": "", "tool_calls": r.tool_calls}
    assert r.assistant_message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
        ],
    }
