"""The event-stream decoder: the WHATWG rules, and the same events however the
bytes are split (at every boundary of small inputs, at random ones of random
streams, checked against a whole-input reference reading of the spec)."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayer.wire import Event, SSEDecoder, is_event_stream
from tests.helpers.wire import CHAT

pytestmark = pytest.mark.inprocess

BOM = b"\xef\xbb\xbf"


def feed_all(chunks: list[bytes]) -> tuple[list[Event], SSEDecoder]:
    dec = SSEDecoder()
    out: list[Event] = []
    for c in chunks:
        out.extend(dec.feed(c))
    return out, dec


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def reference(raw: bytes) -> tuple[list[Event], int | None]:
    """The spec's algorithm on the whole stream: line ends split first, the
    unterminated last line dropped, then the fields interpreted."""
    if raw.startswith(BOM):
        raw = raw[3:]
    lines = re.split(rb"\r\n|\r|\n", raw)[:-1]
    events: list[Event] = []
    data: list[bytes] = []
    kind, last_id, retry = "", "", None
    for line in lines:
        if not line:
            if data:
                events.append(Event(b"\n".join(data), kind or "message", last_id))
            data, kind = [], ""
            continue
        if line.startswith(b":"):
            continue
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            kind = value.decode(errors="replace")
        elif name == b"id" and b"\0" not in value:
            last_id = value.decode(errors="replace")
        elif name == b"retry" and re.fullmatch(rb"[0-9]+", value):
            retry = int(value)
    return events, retry


# -- the rules ------------------------------------------------------------------


def test_vllm_chat_stream():
    events, _ = feed_all([CHAT])
    assert [e.data[:12] for e in events] == [b'{"id":"chatc'] * 4 + [b"[DONE]"]
    assert {(e.event, e.id) for e in events} == {("message", "")}


def test_fields_comments_and_line_ends():
    raw = (
        b": keep-alive\n\n"  # a comment alone dispatches nothing
        b"data:a\ndata: b\r\n\r\n"  # lines joined by LF; one leading space dropped
        b"event: delta\rid: 7\rdata:  two spaces\r\r"  # lone CRs end lines
        b"data\n\n"  # no colon: the field with an empty value
        b"data:\ndata:\n\n"
        b"event: lonely\n\n"  # no data: nothing dispatched, the type forgotten
        b"Data: case matters\nfoo: bar\ndata: x\n\n"
    )
    events, _ = feed_all([raw])
    assert events == [
        Event(b"a\nb"),
        Event(b" two spaces", "delta", "7"),
        Event(b"", "message", "7"),  # the id persists
        Event(b"\n", "message", "7"),
        Event(b"x", "message", "7"),
    ]


def test_id_and_retry():
    dec = SSEDecoder()
    got = dec.feed(b"id: a\x00b\ndata: 1\n\nid\ndata: 2\n\nretry: 1500\nretry: 2x\nretry:\n")
    assert [(e.data, e.id) for e in got] == [(b"1", ""), (b"2", "")]  # NUL: ignored; bare id: reset
    assert dec.retry == 1500 and dec.last_event_id == ""
    assert dec.feed(b"id: \xc3\xa9\ndata: 3\n\n") == [Event(b"3", "message", "é")]


def test_bom_only_at_the_start_and_split_across_reads():
    for cut in range(1, 4):
        events, _ = feed_all([(BOM + b"data: x\n\n")[:cut], (BOM + b"data: x\n\n")[cut:]])
        assert events == [Event(b"x")]
    events, _ = feed_all([b"data: 1\n\n" + BOM + b"data: 2\n\n"])
    assert events == [Event(b"1")]  # a BOM later is part of a field name: the line is ignored
    events, _ = feed_all([b"\xef", b"data: 3\n\n"])  # not a BOM after all
    assert events == []  # the line is "\xefdata: 3": an unknown field


def test_a_cr_ending_a_read_ends_its_line_at_once():
    # The old replay decoder held a final CR back (maybe half of a CRLF): an
    # event whose blank line ended a read was dispatched only at the next read.
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r\n\r") == [Event(b"a")]
    assert dec.feed(b"\n") == []  # the CR's LF: not another blank line
    assert dec.feed(b"\r") == []
    assert dec.feed(b"data: b\n\n") == [Event(b"b")]  # the lone CR was an empty line
    dec = SSEDecoder()
    assert dec.feed(b"event: x\r") == []
    assert dec.feed(b"\ndata: 1\n\n") == [Event(b"1", "x")]  # no blank line came between


def test_utf8_split_inside_a_sequence():
    raw = 'event: ü\ndata: {"content":"日本語 🎉"}\n\n'.encode()
    for cut in range(1, len(raw)):
        events, _ = feed_all([raw[:cut], raw[cut:]])
        assert events == [Event('{"content":"日本語 🎉"}'.encode(), "ü")]


def test_close_drops_an_unterminated_event():
    # The recorder used to dispatch it at the end (a cut stream's last event);
    # the spec and the openai SDK drop it, and so does the replay.
    dec = SSEDecoder()
    assert dec.feed(b"data: 1\n\ndata: 2\n") == [Event(b"1")]
    assert dec.pending == 1
    assert dec.close() is True
    assert dec.feed(b"\n") == []  # the state is gone
    assert dec.close() is False
    dec = SSEDecoder()
    dec.feed(b"data: tail")
    assert dec.close() is True
    dec = SSEDecoder()
    dec.feed(BOM[:2])
    assert dec.close() is False  # half a BOM is nothing


def test_feed_returns_a_list_so_state_is_kept_whole():
    dec = SSEDecoder()
    first = dec.feed(b"data: 1\n\ndata: 2\n\n")
    assert isinstance(first, list) and len(first) == 2
    assert dec.feed(b"") == [] and not dec.pending


@pytest.mark.parametrize(
    ("ctype", "yes"),
    [
        ("text/event-stream", True),
        ("text/event-stream; charset=utf-8", True),
        ("Text/Event-Stream ;charset=UTF-8", True),
        ("application/json", False),
        ("text/event-streams", False),
        ("", False),
        (None, False),
    ],
)
def test_is_event_stream(ctype, yes):
    assert is_event_stream(ctype) is yes


# -- chunking -------------------------------------------------------------------

TRICKY = BOM + "data: é\r\n: c\r\revent: ü\rid: 1\ndata\r\n\r\ndata: 🎉\r\r".encode()


@pytest.mark.parametrize("raw", [CHAT, CHAT.replace(b"\n", b"\r\n"), CHAT.replace(b"\n", b"\r")])
def test_every_single_split_of_a_vllm_stream(raw):
    whole, _ = feed_all([raw])
    assert len(whole) == 5
    for cut in range(1, len(raw)):
        assert feed_all([raw[:cut], raw[cut:]])[0] == whole


def test_every_pair_of_splits_of_a_tricky_stream():
    whole, _ = feed_all([TRICKY])
    assert whole == reference(TRICKY)[0]
    assert [e.data for e in whole] == ["é".encode(), b"", "🎉".encode()]
    for a, b in itertools.combinations(range(1, len(TRICKY)), 2):
        assert feed_all(split(TRICKY, [a, b]))[0] == whole


def test_byte_at_a_time():
    for raw in (CHAT, TRICKY):
        assert feed_all([raw[i : i + 1] for i in range(len(raw))])[0] == feed_all([raw])[0]


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=6)
_line = st.one_of(
    _text.map(lambda t: "data: " + t),
    _text.map(lambda t: "data:" + t),
    _text.map(lambda t: ":" + t),
    _text.map(lambda t: "event: " + t),
    _text.map(lambda t: "id: " + t),
    st.sampled_from(["", "", "", "data", "id", "event", "retry: 100", "retry: 1x", "retry:"]),
    _text,
)
_stream = st.tuples(
    st.booleans(),
    st.lists(st.tuples(_line, st.sampled_from(["\n", "\r\n", "\r"])), max_size=24),
    st.sampled_from(["", "data: cut", "\r"]),
)


@settings(max_examples=300, deadline=None)
@given(_stream, st.data())
def test_any_stream_split_anywhere_reads_as_the_spec_says(stream, data):
    bom, lines, tail = stream
    raw = (BOM if bom else b"") + ("".join(line + end for line, end in lines) + tail).encode()
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12))
    events, dec = feed_all(split(raw, cuts))
    want, retry = reference(raw)
    assert events == want
    assert dec.retry == retry
