"""Trace integrity: column digests, the IPC framing and footer, and the
verification pass a command runs before it trusts a selection.

Since schema v2 every record batch carries, in its IPC custom metadata, an
8-byte BLAKE2b digest of each column (``replayer.column_digests``: hex, in
the file's column order) and one of the schema (``replayer.schema_digest``).
Digests are taken over *values*, never bytes: validity bits of the batch's
rows, the used extent of each buffer, dictionaries decoded. So they are
what a writer meant, whatever compression or padding it used, and zstd's
lack of a checksum (a flipped literal decodes to a different byte without
error) cannot hide a flip. The reader checks the index columns' digests at
open and the content columns' whenever it decodes a batch. Alignment padding
between buffers decodes to nothing and is not covered.

The framing scan tells a torn tail (a killed writer's last message, running
past the end of a file that has no proper end) from damage: a message that
is all there but does not read, bytes after the end-of-stream marker, an IPC
file footer that does not match its messages.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from replayer.errors import TraceCorruptError
from replayer.trace import content as cx
from replayer.trace.schema import META_COLUMN_DIGESTS, META_SCHEMA_DIGEST, Kind

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from replayer.trace.reader import Trace

DIGEST_BYTES = 8
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_CONTINUATION = 0xFFFFFFFF


def corrupt(path: Path, where: str, what: str) -> TraceCorruptError:
    return TraceCorruptError(f"{path}: corrupt trace: {where}: {what}")


def batch_where(k: int, start: int, length: int) -> str:
    return f"batch {k} (rows {start}..{start + length - 1})" if length else f"batch {k} (empty)"


# -- digests -----------------------------------------------------------------


def column_digest(arr: pa.Array) -> bytes:
    """The digest of one column of one batch (its values, see module doc)."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    _feed(h, arr)
    return h.digest()


def _feed(h: hashlib.blake2b, arr: pa.Array) -> None:
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    t = arr.type
    offsets = pa.types.is_string(t) or pa.types.is_list(t)
    if arr.offset or (offsets and len(arr) and _offsets(arr)[0] != 0):
        arr.validate(full=True)  # concatenation trusts the offsets
        arr = pa.concat_arrays([arr])  # zero-based offsets, as replayer writes them
    n = len(arr)
    h.update(struct.pack("<qq", n, arr.null_count))
    if n == 0:
        return
    bufs = arr.buffers()
    if arr.null_count:
        _bitmap(h, bufs[0], n)
    if pa.types.is_boolean(t):
        _bitmap(h, bufs[1], n)
    elif pa.types.is_integer(t):
        h.update(memoryview(bufs[1])[: n * (t.bit_width // 8)])
    elif offsets:
        offs = _offsets(arr)
        h.update(offs)
        last = offs[n] - offs[0]
        if pa.types.is_string(t):
            if last:
                h.update(memoryview(bufs[2])[offs[0] : offs[n]])
        else:
            _feed(h, arr.values.slice(offs[0], last))
    else:
        h.update(orjson.dumps(arr.to_pylist(), default=str))


def _offsets(arr: pa.Array) -> memoryview:
    return memoryview(arr.buffers()[1])[: 4 * (len(arr) + 1)].cast("i")


def _bitmap(h: hashlib.blake2b, buf: pa.Buffer, n: int) -> None:
    full, rest = divmod(n, 8)
    mv = memoryview(buf)
    h.update(mv[:full])
    if rest:
        h.update(bytes([mv[full] & ((1 << rest) - 1)]))


def schema_digest(schema: pa.Schema) -> str:
    """Digest of the names, nullability and metadata of a schema (types are
    checked against the format on open, and their spelling is pyarrow's)."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for f in schema:
        h.update(orjson.dumps([f.name, f.nullable]))
    for k, v in sorted((schema.metadata or {}).items()):
        h.update(struct.pack("<q", len(k)) + k + struct.pack("<q", len(v)) + v)
    return h.hexdigest()


def batch_metadata(batch: pa.RecordBatch, schema: pa.Schema) -> dict[bytes, bytes]:
    """The custom metadata a writer stores with ``batch`` (of ``schema``)."""
    digests = b"".join(column_digest(c) for c in batch.columns)
    return {
        META_SCHEMA_DIGEST: schema_digest(schema).encode(),
        META_COLUMN_DIGESTS: digests.hex().encode(),
    }


@dataclass(frozen=True, slots=True)
class Stored:
    """What a batch says about itself: the schema digest and one digest per column."""

    schema: str
    columns: tuple[bytes, ...]


def stored(path: Path, where: str, meta: pa.KeyValueMetadata | None, ncols: int) -> Stored:
    m = dict(meta or {})
    fp, digests = m.get(META_SCHEMA_DIGEST), m.get(META_COLUMN_DIGESTS)
    if fp is None or digests is None:
        raise corrupt(path, where, "carries no digests (schema v2 batches all do)")
    try:
        raw = bytes.fromhex(digests.decode())
    except ValueError:
        raw = b""
    if len(raw) != ncols * DIGEST_BYTES:
        raise corrupt(path, where, "its column digests are unreadable")
    cols = tuple(raw[i : i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES))
    return Stored(fp.decode(errors="replace"), cols)


def check_columns(
    path: Path, where: str, batch: pa.RecordBatch, positions: Sequence[int], digests: Stored
) -> None:
    """Raise unless every column of ``batch`` (file columns ``positions``) matches.

    Safe on a batch validated for structure only: values are read through
    bounds-checked views, and a column that needs re-basing is fully
    validated first."""
    for name, arr, i in zip(batch.schema.names, batch.columns, positions, strict=True):
        try:
            got = column_digest(arr)
        except (pa.ArrowException, ValueError, IndexError) as exc:
            raise corrupt(path, where, f"column {name!r} does not decode ({short(exc)})") from None
        if got != digests.columns[i]:
            raise corrupt(path, where, f"column {name!r} does not match its digest")


# -- framing -----------------------------------------------------------------


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
        return False
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


def short(exc: BaseException) -> str:
    s = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return s[:160]


# -- verification ------------------------------------------------------------


@dataclass(slots=True)
class VerifyReport:
    """What :meth:`Trace.verify` checked (everything it reports passed)."""

    path: Path
    schema_version: int
    """As stored; older versions are migrated in memory."""
    digests: bool
    """Whether the batches carry column digests (schema v2 and later)."""
    batches: int = 0
    """Content batches decoded (and, with digests, matched)."""
    bodies: int = 0
    """Bodies rebuilt (their delta chains walked)."""
    lengths: int = 0
    """Bodies whose length equals the row's ``body_bytes``."""
    invariants: list[str] = field(default_factory=list)
    footer: bool = False
    torn_tail: bool = False

    def lines(self) -> list[str]:
        from replayer.trace.schema import TRACE_SCHEMA_VERSION

        v = f"schema v{self.schema_version}"
        if self.schema_version < TRACE_SCHEMA_VERSION:
            v += f" (migrated to v{TRACE_SCHEMA_VERSION} in memory)"
        out = [f"{self.path}: OK, {v}"]
        out.append(
            "  framing       every message reads"
            + ("; torn tail dropped (writer interrupted)" if self.torn_tail else "")
            + ("; footer matches every message" if self.footer else "")
        )
        out.append(
            f"  batches       {self.batches:,} decoded and validated"
            + (
                ", every column matches its digest"
                if self.digests
                else " (no digests before schema v2: `replayer trace convert` adds them)"
            )
        )
        if self.bodies:
            out.append(
                f"  bodies        {self.bodies:,} rebuilt along their delta chains; "
                f"{self.lengths:,} of exactly body_bytes"
            )
        for inv in self.invariants:
            out.append(f"  invariant     {inv}")
        return out


def batches_of(trace: Trace, rows: Iterable[int]) -> list[int]:
    """The batches holding ``rows`` and every row of their delta chains."""
    base = trace.column("base")
    seen: set[int] = set()
    out: set[int] = set()
    for r in rows:
        cur: int | None = r
        while cur is not None and cur not in seen:
            seen.add(cur)
            out.add(trace._batch_of(cur))
            b = base[cur]
            cur = b if isinstance(b, int) and 0 <= b < cur else None
    return sorted(out)


def verify(trace: Trace, rows: Sequence[int] | None, *, bodies: bool) -> VerifyReport:
    report = VerifyReport(
        path=trace.path,
        schema_version=trace.schema_version,
        digests=trace.has_digests,
        footer=trace.form == "file" and not trace.torn_tail,
        torn_tail=trace.torn_tail,
    )
    if rows is None and bodies:
        report.invariants = check_invariants(trace)
    selected = list(trace.order) if rows is None else list(rows)
    if not bodies:
        ks = range(trace.num_batches) if rows is None else batches_of(trace, selected)
        for k in ks:
            trace._decode(k)
            report.batches += 1
        return report
    report.batches = len(batches_of(trace, selected))
    check_lengths = trace.tokens == trace.recorded_tokens
    c = trace.column
    sizes, ids, kinds, ntok = c("body_bytes"), c("request_id"), c("kind"), c("input_tokens")
    for row, content, cell in trace._sequential(selected):
        report.bodies += 1
        # A blocks prompt is a pure function of ids already matched: size it
        # as the writer did instead of generating every token.
        fixed = trace._prompts.json_len(ntok[row]) if kinds[row] == Kind.BLOCKS else None
        try:
            if fixed is not None:
                params = trace.params_text(row, cell)
                orjson.loads(params)
                size = cx.utf8_len(params) - 4 + fixed
            else:
                body = trace.body_json(row, _content=content, _cell=cell)
                if not report.digests:
                    orjson.loads(body)
                size = len(body)
        except orjson.JSONDecodeError as exc:
            raise corrupt(
                trace.path, f"row {row} ({ids[row]})", f"body is not JSON ({short(exc)})"
            ) from None
        if check_lengths:
            if size != sizes[row]:
                raise corrupt(
                    trace.path,
                    f"row {row} ({ids[row]})",
                    f"body is {size:,} bytes, body_bytes says {sizes[row]:,}",
                )
            report.lengths += 1
    return report


def check_invariants(trace: Trace) -> list[str]:
    """The index facts every writer guarantees; returns what was checked."""
    p = trace.path
    c = trace.column
    ids, kinds, base, keep = c("request_id"), c("kind"), c("base"), c("keep")
    start, end, size, bsize = c("start_us"), c("end_us"), c("body_bytes"), c("block_size")
    sess, turn = c("session_id"), c("turn")
    seen: dict[str, int] = {}
    known = {k.value for k in Kind}
    for r in range(len(trace)):
        where = f"row {r} ({ids[r]})"
        if ids[r] in seen:
            raise corrupt(p, where, f"request id also names row {seen[ids[r]]}")
        seen[ids[r]] = r
        if kinds[r] not in known:
            raise corrupt(p, where, f"unknown payload kind {kinds[r]!r}")
        b = base[r]
        if b is not None and not 0 <= b < r:
            raise corrupt(p, where, f"delta base {b} is not an earlier row")
        if keep[r] < 0 or (b is None) != (keep[r] == 0):
            raise corrupt(p, where, f"keep {keep[r]} with base {b}")
        if b is not None and kinds[b] != kinds[r]:
            raise corrupt(p, where, f"a {kinds[r]} row deltas on a {kinds[b]} row")
        if kinds[r] == Kind.BLOCKS and not (bsize[r] or 0) > 0:
            raise corrupt(p, where, "a blocks row without a block size")
        if end[r] is not None and end[r] < start[r]:
            raise corrupt(p, where, "ends before it starts")
        if size[r] <= 0:
            raise corrupt(p, where, f"body_bytes {size[r]}")
    last: dict[str, tuple[int, int]] = {}
    for r in trace.order:
        s = sess[r]
        prev = last.get(s)
        if prev is not None and turn[r] < prev[0]:
            raise corrupt(
                p, f"row {r} ({ids[r]})", f"turn {turn[r]} of {s!r} starts after turn {prev[0]}"
            )
        last[s] = (turn[r], r)
    return [
        f"{len(trace):,} request ids unique",
        "delta bases are earlier rows of the same kind; keep and base agree",
        "blocks rows have a block size; no request ends before it starts",
        f"turns of each of {len(last):,} sessions never decrease in trace order",
    ]
