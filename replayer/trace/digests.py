"""Column digests, and how damage to a trace is named.

Since schema v2 every record batch carries, in its IPC custom metadata, an
8-byte BLAKE2b digest of each column (``replayer.column_digests``: hex, in
the file's column order) and one of the schema (``replayer.schema_digest``).
Digests are taken over *values*, never bytes: validity bits of the batch's
rows, the used extent of each buffer, dictionaries decoded. So they are
what a writer meant, whatever compression or padding it used, and zstd's
lack of a checksum (a flipped literal decodes to a different byte without
error) cannot hide a flip. The writer stores them (:func:`batch_metadata`);
the reader checks the index columns' digests at open and the content
columns' whenever it decodes a batch (:func:`check_columns`). Alignment
padding between buffers decodes to nothing and is not covered.

The writer and the reader both build on this module (and
:mod:`replayer.trace.framing` and :mod:`replayer.trace.verify` on it), so
it imports neither: it knows batches and schemas, not traces.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa

from replayer.errors import TraceCorruptError
from replayer.trace.schema import META_BATCH_START, META_COLUMN_DIGESTS, META_SCHEMA_DIGEST

DIGEST_BYTES = 8


def corrupt(path: Path, where: str, what: str) -> TraceCorruptError:
    """The one-line error a damaged trace raises: which file, where in it, what is wrong."""
    return TraceCorruptError(f"{path}: corrupt trace: {where}: {what}")


def batch_where(k: int, start: int, length: int) -> str:
    """A batch as a damage report names it: its number and its rows."""
    return f"batch {k} (rows {start}..{start + length - 1})" if length else f"batch {k} (empty)"


def short(exc: BaseException) -> str:
    """An exception as one short line (its first, at most 160 characters)."""
    s = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return s[:160]


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


def batch_metadata(
    batch: pa.RecordBatch, schema: pa.Schema, start: int | None = None
) -> dict[bytes, bytes]:
    """The custom metadata a writer stores with ``batch`` (of ``schema``);
    ``start``, the rows written before it, lets a reader see a batch moved,
    repeated or dropped from the middle of a stream (which does not count
    its batches), each of which still matches its own digests."""
    digests = b"".join(column_digest(c) for c in batch.columns)
    meta = {
        META_SCHEMA_DIGEST: schema_digest(schema).encode(),
        META_COLUMN_DIGESTS: digests.hex().encode(),
    }
    if start is not None:
        meta[META_BATCH_START] = str(start).encode()
    return meta


def check_start(path: Path, where: str, meta: pa.KeyValueMetadata | None, start: int) -> None:
    """Refuse a batch that says it starts at another row than where it is
    read (batches written before the start was stored say nothing)."""
    said = dict(meta or {}).get(META_BATCH_START)
    if said is None:
        return
    try:
        at = int(said.decode())
    except ValueError:
        raise corrupt(path, where, "its start row is unreadable") from None
    if at != start:
        raise corrupt(
            path,
            where,
            f"was written at row {at:,} but is read at row {start:,} "
            "(a batch before it moved, repeated or went missing)",
        )


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
