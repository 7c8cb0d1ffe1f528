"""The content operations the writer and the reader share: a message as
compact JSON, the longest common prefix, chat JSON by concatenation, UTF-8
lengths."""

from __future__ import annotations

import orjson
import pytest

from replayer.errors import TraceError
from replayer.trace.content import chat_json, common_prefix, message_text, utf8_len

pytestmark = pytest.mark.inprocess


def test_message_text_is_compact_json_in_key_order():
    assert message_text({"role": "user", "content": "hi ü"}) == '{"role":"user","content":"hi ü"}'
    assert message_text({"content": "x", "role": "user"}) == '{"content":"x","role":"user"}'
    assert message_text('{"already":"text"}') == '{"already":"text"}'


def test_message_text_refuses_what_json_cannot_hold():
    with pytest.raises(TraceError) as info:
        message_text({"role": "user", "content": {1, 2}})
    assert str(info.value).startswith("chat message is not JSON-serializable: ")


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ([], [], 0),
        ([1, 2, 3], [1, 2, 3, 4], 3),  # a session that extends its previous turn
        ([1, 2, 3, 4], [1, 2], 2),
        ([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 0, 7], 5),
        ([9, 2], [1, 2], 0),
        ("abcdef", "abcxef", 3),
    ],
)
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n
    assert common_prefix(b, a) == n


def test_common_prefix_agrees_with_a_plain_scan():
    for cut in range(40):
        a = list(range(40))
        b = a[:cut] + [-1] + a[cut + 1 :]
        assert common_prefix(a, b) == cut


def test_chat_json_is_the_array_of_its_messages():
    msgs = [message_text({"role": "user", "content": "a"}), message_text({"role": "x"})]
    assert chat_json(msgs) == '[{"role":"user","content":"a"},{"role":"x"}]'
    assert orjson.loads(chat_json(msgs)) == [{"role": "user", "content": "a"}, {"role": "x"}]
    assert chat_json([]) == "[]"


def test_utf8_len():
    assert utf8_len("abc") == 3
    assert utf8_len("ü€😀") == 2 + 3 + 4
    assert utf8_len("") == 0
