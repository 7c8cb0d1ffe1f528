"""The IPC framing: where each message of a trace lies, and whether the
file ends as it should.

The scan tells a torn tail (a killed writer's last message, running past
the end of a file that has no proper end) from damage: a message that is
all there but does not read, bytes after the end-of-stream marker, an IPC
file footer that does not match its messages. The reader runs it at open.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from replayer.trace.digests import corrupt, short

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_CONTINUATION = 0xFFFFFFFF


@dataclass(slots=True)
class Framing:
    """Where each IPC message of a stream lies (offsets into the stream)."""

    messages: list[tuple[pa.Message, int, int]] = field(default_factory=list)
    end: int = 0
    """Where reading stopped: after the end-of-stream marker, or at the message that failed."""
    eos: bool = False
    error: str | None = None
    """Why the message at ``end`` could not be read."""
    torn: bool = False
    """That message runs past the end of the file (a writer was interrupted)."""


def scan(body: pa.Buffer) -> Framing:
    """Read the messages of a stream until its end-of-stream marker, its
    last complete message, or the first message that does not read."""
    out = Framing()
    src = pa.BufferReader(body)
    reader = ipc.MessageReader.open_stream(src)
    while True:
        pos = src.tell()
        try:
            msg = reader.read_next_message()
        except StopIteration:
            out.end = src.tell()
            out.eos = out.end >= 8 and body.slice(out.end - 8, 8).to_pybytes() == EOS
            return out
        except (pa.ArrowException, OSError, ValueError) as exc:
            out.end, out.error = pos, short(exc)
            out.torn = _runs_past_end(body, pos)
            return out
        if msg.type not in ("dictionary", "record batch") and (
            out.messages or msg.type != "schema"
        ):
            out.end, out.error = pos, f"unexpected {msg.type} message"
            return out
        out.messages.append((msg, pos, src.tell()))


def has_trailer(buf: pa.Buffer) -> bool:
    """Whether an IPC file ends with its footer length and ``ARROW1``."""
    return bool(buf.size >= 18 and buf.slice(buf.size - 6).to_pybytes() == b"ARROW1")


def check_framing(
    path: Path, buf: pa.Buffer, body: pa.Buffer, framing: Framing, trailer: bool
) -> bool:
    """Raise if the framing shows damage; return whether a torn tail (a
    killed writer's last message, or an IPC file's missing footer) is dropped.

    ``buf`` is the file, ``body`` its stream part, ``trailer`` whether an IPC
    file ends properly. Only a file without a proper end can be torn."""
    stream = buf.size == body.size
    proper_end = trailer or (
        stream and body.size >= 8 and body.slice(body.size - 8).to_pybytes() == EOS
    )
    if framing.error is not None:
        if framing.torn and not proper_end:
            return True
        eos_at = body.size - 8
        if trailer:  # the footer follows the marker
            flen = int.from_bytes(buf.slice(buf.size - 10, 4).to_pybytes(), "little", signed=True)
            eos_at = buf.size - 10 - flen - 16
        n = sum(1 for m in framing.messages if m[0].type == "record batch")
        at = framing.end + buf.size - body.size
        where = (
            "end-of-stream marker" if framing.end == eos_at else f"batch {n} (message at byte {at})"
        )
        raise corrupt(path, where, f"does not read ({framing.error})")
    if stream:
        if framing.eos and framing.end != body.size:
            raise corrupt(path, "end of stream", f"{body.size - framing.end:,} bytes after it")
        return not framing.eos  # cut at a message boundary: the writer never closed it
    if not trailer:
        if framing.end != body.size:
            raise corrupt(path, "file footer", "damaged (no trailing ARROW1 marker)")
        return True  # the writer never wrote the footer
    return False


def _runs_past_end(body: pa.Buffer, pos: int) -> bool:
    """Whether the message at ``pos`` declares more bytes than the file has."""
    size = body.size
    if size - pos < 8:
        return True
    mv = memoryview(body)
    cont, length = struct.unpack_from("<Ii", mv, pos)
    start = pos + 8
    if cont != _CONTINUATION:  # pre-1.0 framing: no continuation marker
        length, start = struct.unpack_from("<i", mv, pos)[0], pos + 4
    if length < 0:
        return False
    if start + length > size:
        return True
    try:
        meta = mv[start : start + length]
        table = _root(meta)
        at = _field(meta, table, 3)  # Message.bodyLength
        body_len = int(struct.unpack_from("<q", meta, at)[0]) if at is not None else 0
    except (struct.error, ValueError):
        return False
    return bool(start + length + body_len > size)


def batch_length(msg: pa.Message) -> int | None:
    """The row count a record batch message declares (None if unreadable)."""
    try:
        meta = memoryview(msg.metadata)
        at = _field(meta, _root(meta), 2)  # Message.header: the RecordBatch table
        if at is None:
            return None
        table = at + struct.unpack_from("<I", meta, at)[0]
        length = _field(meta, table, 0)  # RecordBatch.length
        return int(struct.unpack_from("<q", meta, length)[0]) if length is not None else 0
    except (struct.error, ValueError):
        return None


def _root(buf: memoryview) -> int:
    return int(struct.unpack_from("<I", buf, 0)[0])


def _field(buf: memoryview, table: int, index: int) -> int | None:
    """Absolute position of field ``index`` of the flatbuffer table at ``table``."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    size = struct.unpack_from("<H", buf, vtable)[0]
    slot = 4 + 2 * index
    if slot + 2 > size:
        return None
    off = struct.unpack_from("<H", buf, vtable + slot)[0]
    return table + off if off else None


def _blocks(buf: memoryview, table: int, index: int) -> list[tuple[int, int, int]]:
    at = _field(buf, table, index)
    if at is None:
        return []
    vec = at + struct.unpack_from("<I", buf, at)[0]
    n = struct.unpack_from("<I", buf, vec)[0]
    if vec + 4 + 24 * n > len(buf):
        raise ValueError("block vector runs past the footer")
    out = []
    for i in range(n):
        offset, meta_len, _pad, body_len = struct.unpack_from("<qiiq", buf, vec + 4 + 24 * i)
        out.append((offset, meta_len, body_len))
    return out


def check_footer(path: Path, buf: pa.Buffer, framing: Framing, schema: pa.Schema) -> None:
    """An IPC file's footer must follow the end-of-stream marker, name every
    message's place and repeat the stream's schema."""
    size = buf.size
    mv = memoryview(buf)
    (flen,) = struct.unpack_from("<i", mv, size - 10)
    start = size - 10 - flen
    if not framing.eos or flen < 0 or start != 8 + framing.end:
        raise corrupt(path, "file footer", "does not follow the last message")
    want: tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]] = ([], [])
    for msg, a, b in framing.messages:
        if msg.type in ("dictionary", "record batch"):
            body_len = msg.body.size if msg.body is not None else 0
            want[msg.type == "record batch"].append((8 + a, b - a - body_len, body_len))
    try:
        footer = mv[start : size - 10]
        table = _root(footer)
        got = (_blocks(footer, table, 2), _blocks(footer, table, 3))
        fschema = ipc.open_file(buf).schema
    except (struct.error, ValueError, pa.ArrowException, OSError) as exc:
        raise corrupt(path, "file footer", f"unreadable ({short(exc)})") from None
    if got != want:
        raise corrupt(path, "file footer", "its record batch table does not match the messages")
    if not fschema.equals(schema, check_metadata=True):
        raise corrupt(path, "file footer", "its schema differs from the header's")
