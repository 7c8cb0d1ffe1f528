"""The IPC framing: torn tails told from damage, whatever byte is flipped
or wherever a file is cut."""

from __future__ import annotations

import logging
import struct

import pyarrow as pa
import pytest

from replayer.errors import TraceCorruptError, TraceError
from replayer.trace import Trace
from replayer.trace.framing import scan
from replayer.trace.reader import NOTHING_LEFT
from tests.helpers.traces import write_current

pytestmark = pytest.mark.inprocess


def _contents(t):
    return [(t.body_json(r), t.outcome(r)) for r in range(len(t))], t.column("request_id")


@pytest.mark.parametrize("form", ["file", "stream"])
def test_every_flip_is_damage_or_changes_nothing(tmp_path, form):
    """One byte in every 89, flipped: the trace is refused with a TraceError,
    or (padding) reads exactly as before. Never another exception, never
    different content."""
    path = write_current(tmp_path / "t.arrow", form=form)
    data = path.read_bytes()
    want = _contents(Trace.open(path))
    bad = tmp_path / "bad.arrow"
    refused = 0
    for off in range(0, len(data), 89):
        d = bytearray(data)
        d[off] ^= 0x55
        bad.write_bytes(bytes(d))
        try:
            t = Trace.open(bad)
            t.verify()
        except TraceError:
            refused += 1
            continue
        assert _contents(t) == want, off
    assert refused > 0.8 * (len(data) // 89)


@pytest.mark.parametrize("form", ["file", "stream"])
def test_every_cut_is_a_torn_tail_or_refused(tmp_path, form, caplog):
    """A prefix of a trace (a killed writer, for a stream) keeps its complete
    batches; a cut inside an IPC file's footer, before the schema is complete,
    or before the first batch is complete (nothing left), is refused."""
    path = write_current(tmp_path / "t.arrow", form=form)
    data = path.read_bytes()
    body = pa.py_buffer(data[8:] if form == "file" else data)
    framing = scan(body)
    footer_at = (8 + framing.end) if form == "file" else len(data)
    first_end = next(b for m, _, b in framing.messages if m.type == "record batch")
    first_end += 8 if form == "file" else 0
    cut_path = tmp_path / "cut.arrow"
    caplog.set_level(logging.ERROR, logger="replayer.trace")
    for cut in range(1, len(data), 61):
        cut_path.write_bytes(data[:cut])
        try:
            t = Trace.open(cut_path)
        except TraceCorruptError as exc:
            if cut < first_end:
                assert str(exc).endswith(f"batch 0: {NOTHING_LEFT}"), (cut, exc)
            else:
                assert form == "file" and cut > footer_at, (cut, exc)
            continue
        except TraceError as exc:
            assert "not an Arrow IPC file or stream" in str(exc), (cut, exc)
            continue
        t.verify()
        assert t.torn_tail or cut == len(data)
        assert len(t) in (3, 6, 9, 12, 14)


def test_bytes_after_the_end_of_stream_are_damage(tmp_path):
    path = write_current(tmp_path / "t.arrow", form="stream")
    path.write_bytes(path.read_bytes() + b"\0" * 16)
    with pytest.raises(TraceCorruptError, match="end of stream: 16 bytes after it"):
        Trace.open(path)


def test_a_file_missing_only_its_footer_is_torn_with_every_batch(tmp_path, caplog):
    path = write_current(tmp_path / "t.arrow")
    data = path.read_bytes()
    end = scan(pa.py_buffer(data[8:])).end
    path.write_bytes(data[: 8 + end])
    with caplog.at_level(logging.WARNING, logger="replayer.trace"):
        t = Trace.open(path)
    assert t.torn_tail and len(t) == 14
    assert "incomplete tail dropped" in caplog.text
    t.verify()


def test_a_footer_that_misplaces_a_batch_is_damage(tmp_path):
    path = write_current(tmp_path / "t.arrow")
    data = bytearray(path.read_bytes())
    framing = scan(pa.py_buffer(bytes(data[8:])))
    first = next(a for m, a, _ in framing.messages if m.type == "record batch")
    at = data.rindex(struct.pack("<q", 8 + first))
    data[at] ^= 0x08
    path.write_bytes(bytes(data))
    with pytest.raises(TraceCorruptError, match="file footer: its record batch table"):
        Trace.open(path)
