"""Trace reader: IPC file or stream, memory-mapped, bodies built on demand.

Opening a trace reads only the small *index* columns (ids, timing, sizes):
Arrow decompresses just the buffers it is asked for, so opening a multi-GB
trace costs milliseconds. Content batches are decoded when a body is first
needed and kept in a bounded LRU.

A stream whose writer was killed ends in a torn message; the reader keeps
every complete batch, drops the tail and says so (``Trace.torn_tail``, and a
warning on the ``replayer.trace`` logger). An IPC file whose footer was never
written is read the same way. Anything else wrong with the bytes is damage
(:class:`~replayer.errors.TraceCorruptError`, see :mod:`replayer.trace.digests`):
the index is checked at open, each content batch when decoded, and
:meth:`Trace.verify` reads a selection up front (:mod:`replayer.trace.verify`,
through this module's public methods only). Older schema versions are
migrated on the fly (:mod:`replayer.trace.compat`).

The token space blocks prompts are drawn from and the caches are a
:class:`Trace`'s own; :meth:`Trace.configured` makes a sibling with others
(a replay's ``--token-range``) over the same opened file, copying nothing,
so whoever holds a trace sees it as they opened it.

Reconstruction walks the delta chain backwards taking only the units each
level contributes, so building request N costs O(size of N + chain depth),
never O(N²). Sequential iteration (:meth:`Trace.iter_json`) additionally
keeps each row's content until its last dependant is built, so replaying a
session in order costs O(appended bytes) per request.
"""

from __future__ import annotations

import bisect
import copy
import logging
import os
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from replayer.errors import TraceCorruptError, TraceError
from replayer.trace import compat
from replayer.trace import content as cx
from replayer.trace import verify as verification
from replayer.trace.digests import (
    Stored,
    batch_where,
    check_columns,
    check_start,
    corrupt,
    schema_digest,
    short,
    stored,
)
from replayer.trace.framing import (
    EOS,
    batch_length,
    check_footer,
    check_framing,
    has_trailer,
    scan,
)
from replayer.trace.model import RequestRecord
from replayer.trace.schema import (
    FORMAT_NAME,
    HEAVY_COLUMNS,
    META_FORMAT,
    META_PROVENANCE,
    META_SCHEMA_DIGEST,
    META_TOKENS,
    META_VERSION,
    SCHEMA,
    Kind,
)
from replayer.trace.tokens import BlockPrompts, PromptKey, TokenSpace
from replayer.trace.verify import Cell, VerifyReport

log = logging.getLogger("replayer.trace")

_FILE_MAGIC = b"ARROW1"
NOTHING_LEFT = "torn before its first batch was complete (writer interrupted): nothing left to read"
"""What every reader says of a torn trace with no complete batch: an empty
read would pass for a trace that recorded nothing."""
_CONTENT = ("messages", "text", "blocks", "params")
_P = ParamSpec("_P")
_R = TypeVar("_R")
# What a damaged row's values make reconstruction raise.
_DAMAGE = (IndexError, KeyError, ValueError, TypeError, AttributeError, pa.ArrowException)


def _guarded(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A row method whose failures on damaged values become one
    :class:`TraceCorruptError` naming the row (never a traceback)."""

    @wraps(method)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        trace, row = args[0], cast(int, args[1])
        assert isinstance(trace, Trace)
        if not 0 <= row < len(trace):  # a caller's bad row is not damage
            raise IndexError(f"row {row} out of range (trace has {len(trace)})")
        try:
            return method(*args, **kwargs)
        except TraceError:
            raise
        except _DAMAGE as exc:
            raise trace._corrupt_row(row, exc) from None

    return run


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """The index facts of one request (no body)."""

    row: int
    request_id: str
    session_id: str
    turn: int
    start_us: int
    end_us: int | None
    path: str
    model: str | None
    kind: Kind
    input_tokens: int
    max_tokens: int | None
    body_bytes: int


@dataclass(slots=True)
class _Derived:
    """What is computed from the file alone, once for a trace and all its
    :meth:`~Trace.configured` siblings (it does not depend on their settings)."""

    cols: dict[str, list[Any]] = field(default_factory=dict)
    """Index columns as Python lists."""
    order: list[int] | None = None
    row_of: dict[str, int] | None = None
    params: dict[int, str] = field(default_factory=dict)
    """Params texts resolved along delta chains (see :meth:`Trace.params_text`)."""


class Trace:
    """A trace opened for reading.

    **Usage**::

        trace = Trace.open("t.arrow")
        for row in trace.order:
            body = trace.body(row)
        small = trace.configured(tokens=TokenSpace(100, 8192))  # trace itself unchanged
    """

    def __init__(
        self,
        path: Path,
        file_schema: pa.Schema,
        index: pa.Table,
        messages: list[pa.Message],
        preludes: list[bytes],
        batch_lengths: list[int],
        form: str,
        torn_tail: bool,
        cache_bytes: int,
        steps: list[compat.Migration] | None = None,
        digests: list[Stored] | None = None,
    ) -> None:
        self.path = path
        self.file_schema = file_schema
        """The schema as stored (before migrations)."""
        self._steps = steps or []
        self.schema = compat.migrate_schema(file_schema, self._steps)
        """The schema as read: the current version's."""
        self.index = index
        self.form = form
        """``"file"`` or ``"stream"``."""
        self.torn_tail = torn_tail
        """True when an incomplete tail (killed writer) was dropped."""
        self._messages = messages
        self._preludes = preludes
        self._heavy = [i for i, f in enumerate(file_schema) if f.name in HEAVY_COLUMNS]
        self._digests = digests
        self._batch_starts: list[int] = []
        self._batch_lengths = batch_lengths
        n = 0
        for length in batch_lengths:
            self._batch_starts.append(n)
            n += length
        self._num_rows = index.num_rows
        meta = file_schema.metadata or {}
        self.schema_version = int(meta.get(META_VERSION, b"0"))
        """The version as stored (older ones are migrated in memory)."""
        try:
            self.provenance: dict[str, Any] = orjson.loads(meta.get(META_PROVENANCE, b"{}"))
            tok = orjson.loads(meta.get(META_TOKENS, b"{}"))
            if not isinstance(self.provenance, dict) or not isinstance(tok, dict | None):
                raise ValueError("provenance and tokens must be JSON objects")
            recorded = TokenSpace(**tok) if tok else TokenSpace()
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise corrupt(path, "header", f"schema metadata unreadable ({short(exc)})") from None
        self.recorded_tokens = recorded
        """The token space stored in the trace (:attr:`tokens` is a sibling's own)."""
        self._derived = _Derived()
        # Each sibling's own (see configured): the prompts and decoded batches it keeps.
        self._prompts = BlockPrompts(self.recorded_tokens)
        self._batches: OrderedDict[int, pa.RecordBatch] = OrderedDict()
        self._batch_budget = cache_bytes
        self._batch_weight = 0

    # -- opening -----------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, cache_bytes: int = 512 << 20) -> Trace:
        """Open a trace; raise :class:`TraceError` with a one-line reason if it
        is not one (:class:`TraceCorruptError` if it is a damaged one).

        Checks every message's framing, the index columns (validated, and
        against their digests), and an IPC file's footer; content batches are
        checked when decoded (see :meth:`verify`)."""
        p = Path(path)
        if not p.exists():
            raise TraceError(f"{p}: no such file")
        if p.is_dir():
            raise TraceError(f"{p}: is a directory, not a trace file")
        if p.stat().st_size == 0:
            raise TraceError(f"{p}: empty file, not a trace")
        try:
            buf = pa.memory_map(str(p)).read_buffer()
        except OSError as exc:
            raise TraceError(f"{p}: cannot read: {exc}") from None
        form = "stream"
        body = buf
        if buf.size >= 8 and buf.slice(0, 6).to_pybytes() == _FILE_MAGIC:
            form = "file"
            body = buf.slice(8)
        try:
            schema = ipc.open_stream(pa.BufferReader(body)).schema
            _ = schema.names, schema.metadata  # decoded lazily: a damaged name raises here
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise TraceError(f"{p}: not an Arrow IPC file or stream ({short(exc)})") from None
        version = _check_format(p, schema)
        steps = compat.chain(p, version)
        mschema = compat.migrate_schema(schema, steps)
        _check_columns(p, mschema)

        framing = scan(body)
        trailer = form == "file" and has_trailer(buf)
        torn = check_framing(p, buf, body, framing, trailer)
        batches = [m for m in framing.messages if m[0].type == "record batch"]

        wanted = [i for i, f in enumerate(schema) if f.name not in HEAVY_COLUMNS]
        idx_reader = ipc.open_stream(
            pa.BufferReader(body),
            options=ipc.IpcReadOptions(included_fields=wanted, use_threads=False),
        )
        idx_batches: list[pa.RecordBatch] = []
        digests: list[Stored] | None = [] if version >= 2 else None
        fp = schema_digest(schema)
        start = 0
        for k, (msg, _, _) in enumerate(batches):
            n = batch_length(msg)
            where = batch_where(k, start, n) if n is not None else f"batch {k}"
            try:
                batch, meta = idx_reader.read_next_batch_with_custom_metadata()
                batch.validate(full=True)
            except (pa.ArrowException, OSError, StopIteration) as exc:
                raise corrupt(p, where, f"does not decode ({short(exc)})") from None
            where = batch_where(k, start, batch.num_rows)
            if digests is None and meta is not None and META_SCHEMA_DIGEST in dict(meta):
                raise corrupt(p, "header", f"says schema v{version}, but {where} has digests")
            if digests is not None:
                got = stored(p, where, meta, len(schema))
                if got.schema != fp:
                    raise corrupt(p, "header", "the schema does not match its digest")
                check_columns(p, where, batch, wanted, got)
                check_start(p, where, meta, start)
                digests.append(got)
            idx_batches.append(compat.migrate_batch(batch, steps))
            start += batch.num_rows
        if trailer:
            check_footer(p, buf, framing, schema)
        # Remember the schema and dictionary messages before each record
        # batch: decoding one batch's content later replays just those as a
        # tiny stream.
        messages: list[pa.Message] = []
        preludes: list[bytes] = []
        prelude: list[bytes] = []
        for msg, _, _ in framing.messages:
            if msg.type == "record batch":
                messages.append(msg)
                preludes.append(b"".join(prelude))
            else:
                prelude.append(msg.serialize().to_pybytes())
        if torn and not messages:
            raise corrupt(p, "batch 0", NOTHING_LEFT)
        if torn:
            log.warning(
                "%s: incomplete tail dropped (writer was interrupted); %d complete batches kept",
                p,
                len(messages),
            )
        idx_schema = pa.schema([f for f in mschema if f.name not in HEAVY_COLUMNS])
        try:
            index = pa.Table.from_batches(idx_batches, schema=idx_schema)
        except (pa.ArrowException, ValueError) as exc:
            raise TraceError(f"{p}: wrong schema: {short(exc)}") from None
        lengths = [b.num_rows for b in idx_batches]
        return cls(
            p, schema, index, messages, preludes, lengths, form, torn, cache_bytes, steps, digests
        )

    @property
    def num_batches(self) -> int:
        return len(self._messages)

    @property
    def has_digests(self) -> bool:
        """Whether batches carry column digests (schema v2 and later)."""
        return self._digests is not None

    def verify(self, rows: Sequence[int] | None = None, *, bodies: bool = True) -> VerifyReport:
        """Read ``rows`` (default: every row) as a replay would, before
        anything is sent: decode the batches holding them and their delta
        bases (matching their digests), rebuild each body and match its length
        with ``body_bytes``; and (whatever the selection) the index invariants
        (:func:`~replayer.trace.verify.check_invariants`). Raises
        :class:`TraceCorruptError` naming the first bad batch or row.

        Streaming, like :meth:`iter_json`: memory stays bounded whatever the
        trace's size. ``bodies=False`` only decodes and matches the batches.
        Reads through a :meth:`configured` sibling, so the prompts and
        batches it builds leave with it: this trace's caches are as before."""
        return verification.verify(self.configured(), rows, bodies=bodies)

    # -- index access ------------------------------------------------------

    def __len__(self) -> int:
        return int(self._num_rows)

    def column(self, name: str) -> list[Any]:
        """An index column as a Python list (cached)."""
        col = self._derived.cols.get(name)
        if col is None:
            if name in HEAVY_COLUMNS:
                raise KeyError(f"{name} is a content column; use body()/outcome()")
            col = _to_list(self.index.column(name))
            self._derived.cols[name] = col
        return col

    def model_of(self, rows: Iterable[int], override: str | None = None) -> str | None:
        """The one model these rows name (what a launched server must serve);
        None when they name none or several. ``override`` wins."""
        if override:
            return override
        models = {self.column("model")[r] for r in rows} - {None}
        return next(iter(models)) if len(models) == 1 else None

    @property
    def order(self) -> list[int]:
        """Rows in trace order: by recorded start, ties by row (stable)."""
        d = self._derived
        if d.order is None:
            idx = pc.sort_indices(self.index, sort_keys=[("start_us", "ascending")])
            d.order = idx.to_pylist()
        return d.order

    def request(self, row: int) -> RequestInfo:
        c = self.column
        return RequestInfo(
            row=row,
            request_id=c("request_id")[row],
            session_id=c("session_id")[row],
            turn=c("turn")[row],
            start_us=c("start_us")[row],
            end_us=c("end_us")[row],
            path=c("path")[row],
            model=c("model")[row],
            kind=Kind(c("kind")[row]),
            input_tokens=c("input_tokens")[row],
            max_tokens=c("max_tokens")[row],
            body_bytes=c("body_bytes")[row],
        )

    def row_of(self, request_id: str) -> int:
        m = self._derived.row_of
        if m is None:
            m = {rid: i for i, rid in enumerate(self.column("request_id"))}
            self._derived.row_of = m
        try:
            return int(m[request_id])
        except KeyError:
            raise TraceError(f"{self.path}: no request {request_id!r}") from None

    # -- content access ----------------------------------------------------

    def decode_batch(self, k: int) -> pa.RecordBatch:
        """Decode the content columns of batch ``k`` (replaying only the
        schema and dictionary messages before it, then the batch), validated
        and matched against their digests, then migrated. Not cached: the
        caller holds what it needs (a pass, verification)."""
        stream = self._preludes[k] + self._messages[k].serialize().to_pybytes() + EOS
        where = batch_where(k, self._batch_starts[k], self._batch_lengths[k])
        try:
            reader = ipc.open_stream(
                pa.py_buffer(stream),
                options=ipc.IpcReadOptions(included_fields=self._heavy, use_threads=False),
            )
            batch = reader.read_next_batch()
            # Structure only (buffer sizes) when the columns carry digests: a
            # match says every value is the one the writer hashed, so the full
            # pass (offsets, UTF-8: a third of a chat trace's read) would
            # find nothing. Without digests, the full pass is the check.
            batch.validate(full=self._digests is None)
        except (pa.ArrowException, OSError, StopIteration) as exc:
            raise corrupt(self.path, where, f"does not decode ({short(exc)})") from None
        if batch.num_rows != self._batch_lengths[k]:
            raise corrupt(self.path, where, f"content has {batch.num_rows} rows")
        if self._digests is not None:
            check_columns(self.path, where, batch, self._heavy, self._digests[k])
        return compat.migrate_batch(batch, self._steps)

    def _where(self, row: int) -> str:
        try:
            return f"row {row} ({self.column('request_id')[row]})"
        except (IndexError, KeyError):
            return f"row {row}"

    def _corrupt_row(self, row: int, exc: BaseException) -> TraceCorruptError:
        what = f"body does not rebuild ({type(exc).__name__}: {short(exc)})"
        return corrupt(self.path, self._where(row), what)

    def batch_of(self, row: int) -> int:
        """The record batch holding ``row``."""
        if not 0 <= row < self._num_rows:
            raise IndexError(f"row {row} out of range (trace has {self._num_rows})")
        return bisect.bisect_right(self._batch_starts, row) - 1

    def _batch(self, k: int) -> pa.RecordBatch:
        b = self._batches.get(k)
        if b is not None:
            self._batches.move_to_end(k)
            return b
        b = self.decode_batch(k)
        self._batches[k] = b
        self._batch_weight += b.nbytes
        while self._batch_weight > self._batch_budget and len(self._batches) > 1:
            _, old = self._batches.popitem(last=False)
            self._batch_weight -= old.nbytes
        return b

    def _cell(self, row: int, name: str) -> Any:
        k = self.batch_of(row)
        return self._batch(k).column(name)[row - self._batch_starts[k]].as_py()

    def _appended(self, row: int, kind: Kind, cell: Cell) -> Any:
        if kind.itemized:
            return cell(row, "messages") or []
        if kind is Kind.TEXT:
            return cell(row, "text") or ""
        if kind is Kind.BLOCKS:
            return cell(row, "blocks") or []
        return None

    @_guarded
    def content(
        self,
        row: int,
        live: dict[int, Any] | None = None,
        cell: Cell | None = None,
        *,
        compact: bool = False,
    ) -> Any:
        """The full content of a row (messages as JSON texts, prompt, or block ids).

        ``live`` maps rows to already-built contents and ``cell`` reads a
        content cell (both supplied by sequential iteration). ``compact``:
        block ids as an int64 ``array`` (8 bytes an id, not a list's 40: the
        body builder holds hundreds of sessions' contexts)."""
        cell = cell or self._cell
        kind = Kind(self.column("kind")[row])
        if kind is Kind.RAW:
            return None
        base_col, keep_col = self.column("base"), self.column("keep")
        pieces: list[Any] = []
        need: int | None = None
        prefix: Any = "" if kind is Kind.TEXT else []
        cur: int | None = row
        while cur is not None:
            if live is not None and cur in live:
                full = live[cur]
                prefix = full if need is None else full[:need]
                break
            app = self._appended(cur, kind, cell)
            keep = keep_col[cur]
            want = keep + len(app) if need is None else need
            pieces.append(app[: max(0, want - keep)])
            need = min(want, keep)
            if need == 0:
                break
            cur = base_col[cur]
            if cur is None:
                raise corrupt(self.path, self._where(row), "delta chain broken (keep without base)")
        if kind is Kind.TEXT:
            return prefix + "".join(reversed(pieces))
        out = array("q", prefix) if compact and kind is Kind.BLOCKS else list(prefix)
        for p in reversed(pieces):
            out.extend(p)
        return out

    @_guarded
    def params_text(self, row: int, cell: Cell | None = None) -> str:
        """The effective params JSON of a row (inherited along the chain).

        Resolved rows are memoized (they share one string per keyframe), so a
        session read in order walks one step per request, not its whole chain."""
        memo = self._derived.params
        cell = cell or self._cell
        base_col = self.column("base")
        walked: list[int] = []
        cur: int | None = row
        text: str | None = None
        while cur is not None:
            walked.append(cur)
            text = memo.get(cur)
            if text is None:
                text = cell(cur, "params")
            if text is not None:
                break
            cur = base_col[cur]
        if text is None:
            raise corrupt(self.path, self._where(row), "no params along its delta chain")
        if len(memo) > 1_000_000:
            memo.clear()
        # the row that held the text too: its later turns inherit it after a
        # sequential pass has dropped its cells (a re-decode of its batch else)
        for r in walked:
            memo[r] = text
        return text

    def _content_json(self, row: int, kind: Kind, content: Any) -> str | bytes:
        if kind.itemized:
            return cx.chat_json(content)
        if kind is Kind.TEXT:
            return orjson.dumps(content).decode()
        return self._prompts.json_bytes(
            content,
            self.column("block_size")[row],
            self.column("input_tokens")[row],
            self.column("request_id")[row],
            self.column("block_ns")[row],
        )

    @_guarded
    def body_json(
        self,
        row: int,
        patch: dict[str, Any] | None = None,
        *,
        content: Any = None,
        cell: Cell | None = None,
    ) -> bytes:
        """The request body as compact JSON bytes, optionally with top-level
        keys replaced or added (``patch``; a value of ``None`` removes a key).

        ``content`` (the row's, already built) and ``cell`` (the cell reader
        of a pass holding its batch) come from :meth:`sequential` or a
        :class:`BodyBuilder`, so nothing is rebuilt or decoded again."""
        kind = Kind(self.column("kind")[row])
        params = orjson.loads(self.params_text(row, cell))
        key = kind.content_key
        if key is None:
            content = None
        else:
            if content is None:
                content = self.content(row)
            blocks = kind is Kind.BLOCKS
            params[key] = orjson.Fragment(
                _MARK if blocks else self._content_json(row, kind, content)
            )
        if patch:
            for k, v in patch.items():
                if v is None:
                    params.pop(k, None)
                else:
                    params[k] = v
        out = orjson.dumps(params)
        at = out.find(_MARK) if kind is Kind.BLOCKS else -1
        if at >= 0 and content is not None:
            # the token ids are assembled straight into the body: one copy
            c = self.column
            return self._prompts.json_bytes(
                content, c("block_size")[row], c("input_tokens")[row], c("request_id")[row],
                c("block_ns")[row], prefix=out[:at], suffix=out[at + len(_MARK) :],
            )  # fmt: skip
        return out

    def body(self, row: int) -> dict[str, Any]:
        """The request body as a dict (equal as JSON to the recorded one)."""
        result: dict[str, Any] = orjson.loads(self.body_json(row))
        return result

    def iter_content(self, rows: Iterable[int] | None = None) -> Iterator[tuple[int, Any]]:
        """Contents of ``rows`` (default: trace order), built incrementally.

        Each content batch is decoded once, when its first planned row is
        reached, and its planned rows are kept until consumed; each row's
        content is kept only until the last later row that deltas on it. A
        session replayed in order costs O(appended) per request."""
        for r, content, _ in self.sequential(rows):
            yield r, content

    def iter_json(
        self, rows: Iterable[int] | None = None, patch: dict[str, Any] | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """Bodies of ``rows`` (default: trace order), built incrementally."""
        for r, content, cell in self.sequential(rows):
            yield r, self.body_json(r, patch, content=content, cell=cell)

    def sequential(self, rows: Iterable[int] | None) -> Iterator[tuple[int, Any, Cell]]:
        """The pass under :meth:`iter_content` and :meth:`iter_json`: each of
        ``rows`` (default: trace order) with its content and the pass's cell
        reader. Hand both to :meth:`body_json` or the reader to
        :meth:`params_text` (verification sizes a blocks body from its params
        without building its prompt)."""
        seq = list(self.order if rows is None else rows)
        base_col = self.column("base")
        kinds = self.column("kind")
        last_use: dict[int, int] = {}
        pos = {r: i for i, r in enumerate(seq)}
        for i, r in enumerate(seq):
            b = base_col[r]
            if b is not None and pos.get(b, i) < i:
                last_use[b] = i
        reader = _Pass(self, pos)
        live: dict[int, Any] = {}
        expire: dict[int, list[int]] = {}
        for i, r in enumerate(seq):
            content = self.content(r, live, reader.cell) if kinds[r] != Kind.RAW else None
            yield r, content, reader.cell
            reader.consume(r)
            if r in last_use:
                live[r] = content
                expire.setdefault(last_use[r], []).append(r)
            for done in expire.pop(i, ()):
                live.pop(done, None)

    @_guarded
    def outcome(self, row: int) -> dict[str, Any]:
        """The recorded outcome of a row (None where unknown)."""
        names = (
            "status",
            "ttft_us",
            "finish_reason",
            "output_text",
            "output_tool_calls",
            "usage_prompt_tokens",
            "usage_completion_tokens",
            "usage_cached_tokens",
            "error",
        )
        out = {n: self._cell(row, n) if n in HEAVY_COLUMNS else self.column(n)[row] for n in names}
        if out["output_tool_calls"] is not None:
            out["output_tool_calls"] = orjson.loads(out["output_tool_calls"])
        return out

    @_guarded
    def record(self, row: int, content: Any = None) -> RequestRecord:
        """The row as a :class:`RequestRecord`, to write it into another trace
        (a subset, a merge): same body, ids, timing and recorded outcome."""
        c = self.column
        kind = Kind(c("kind")[row])
        out = self.outcome(row)
        if content is None and kind is not Kind.RAW:
            content = self.content(row)
        return RequestRecord(
            request_id=c("request_id")[row],
            session_id=c("session_id")[row],
            turn=c("turn")[row],
            start_us=c("start_us")[row],
            end_us=c("end_us")[row],
            kind=kind,
            params=orjson.loads(self.params_text(row)),
            after=c("after")[row],
            content=content,
            path=c("path")[row],
            block_size=c("block_size")[row],
            block_ns=c("block_ns")[row],
            input_tokens=c("input_tokens")[row],
            body_sha256=c("body_sha256")[row],
            status=out["status"],
            ttft_us=out["ttft_us"],
            finish_reason=out["finish_reason"],
            output_text=out["output_text"],
            output_tool_calls=out["output_tool_calls"],
            usage_prompt_tokens=out["usage_prompt_tokens"],
            usage_completion_tokens=out["usage_completion_tokens"],
            usage_cached_tokens=out["usage_cached_tokens"],
            error=out["error"],
            meta=self.meta(row),
        )

    @_guarded
    def meta(self, row: int) -> dict[str, Any] | None:
        text = self._cell(row, "meta")
        return orjson.loads(text) if text is not None else None

    @_guarded
    def block_tokens(self, row: int) -> list[int]:
        """Token ids of a blocks row, as sent."""
        c = self.column
        return self._prompts.tokens(
            self.content(row),
            c("block_size")[row],
            c("input_tokens")[row],
            c("request_id")[row],
            c("block_ns")[row],
        )

    def prompt_keys(self, rows: Iterable[int]) -> dict[int, PromptKey]:
        """The prompt-cache key each blocks row of ``rows`` is built under
        (none for a prompt without a whole block): a replay's planned builds
        per key let the cache keep what is built again soonest, and drop a
        finished session's prompts at its last turn.

        Decodes only the batches that hold blocks rows, for their appended
        ids' first and count (nothing is kept): a row's first id is its
        base's when it keeps some of the base, else its own first."""
        kinds = self.column("kind")
        want = [r for r in rows if kinds[r] == Kind.BLOCKS]
        if not want:
            return {}
        base, keep = self.column("base"), self.column("keep")
        first: list[int | None] = [None] * self._num_rows
        length = [0] * self._num_rows
        top = max(want)
        for k, start in enumerate(self._batch_starts):
            if start > top:
                break
            end = start + self._batch_lengths[k]
            if not any(kinds[r] == Kind.BLOCKS for r in range(start, end)):
                continue
            for r, ids in enumerate(_id_arrays(self.decode_batch(k).column("blocks")), start):
                b = base[r]
                kept = min(keep[r], length[b]) if b is not None else 0
                length[r] = kept + len(ids or ())
                first[r] = first[b] if kept else (ids[0] if ids else None)
        pa.default_memory_pool().release_unused()  # the decoded batches' pages (~30 MB here)
        size, ns, ntok = (
            self.column("block_size"),
            self.column("block_ns"),
            self.column("input_tokens"),
        )
        out: dict[int, PromptKey] = {}
        for r in want:
            f = first[r]
            if f is not None and min(length[r], ntok[r] // size[r]) >= 1:
                out[r] = (ns[r], size[r], f)
        return out

    def builder(self, rows: Iterable[int]) -> BodyBuilder:
        """A :class:`BodyBuilder` for a replay of ``rows``."""
        return BodyBuilder(self, rows)

    @property
    def tokens(self) -> TokenSpace:
        """The token space blocks prompts are drawn from: the recorded one,
        unless this trace was :meth:`configured` with another."""
        return self._prompts.space

    @property
    def body_cache_bytes(self) -> int:
        """The bound on recent token-id prompts kept for reuse."""
        return self._prompts.cache_bytes

    def prompt_json_len(self, input_tokens: int) -> int | None:
        """The length of a blocks prompt of ``input_tokens`` ids as JSON, known
        without drawing it when every id in :attr:`tokens` has one width."""
        return self._prompts.json_len(input_tokens)

    def configured(
        self, *, tokens: TokenSpace | None = None, body_cache_bytes: int | None = None
    ) -> Trace:
        """A sibling reading the same opened file with its own token space
        (default: this trace's) and its own caches: an empty prompt cache
        bounded by ``body_cache_bytes`` (default: this trace's bound), and a
        decoded-batch LRU that starts with this trace's batches.

        What a replay builds through (a model's ``--token-range``, its
        ``--body-cache-mb``), so the caller's trace keeps its settings and
        bodies. Copies no data: the index, the memory-mapped messages and
        everything derived from the file alone (index columns as lists, the
        trace order, resolved params) are the same objects, shared."""
        sibling = copy.copy(self)  # the same file, index and _derived
        sibling._prompts = BlockPrompts(
            tokens or self.tokens,
            self.body_cache_bytes if body_cache_bytes is None else body_cache_bytes,
        )
        sibling._batches = OrderedDict(self._batches)  # the same batches, its own order
        return sibling


_MARK = b"\x00prompt\x00"
"""Where a blocks body's token ids go: a NUL never appears in orjson's output
(it escapes control characters), so the mark is found exactly once."""


def _id_arrays(col: pa.ListArray) -> list[array[int] | None]:
    """A batch's block-id cells as int64 arrays: held until their rows are
    built, as Python lists they cost ~90 MB for the kv-cache-tester corpus."""
    offs = col.offsets.to_numpy().tolist()
    raw = col.values.to_numpy().astype("=i8", copy=False).tobytes()
    valid = col.is_valid().to_pylist()
    out: list[array[int] | None] = []
    for i, ok in enumerate(valid):
        if ok:
            ids = array("q")
            ids.frombytes(raw[8 * offs[i] : 8 * offs[i + 1]])
            out.append(ids)
        else:
            out.append(None)
    return out


def _to_list(col: pa.ChunkedArray) -> list[Any]:
    """A column as Python values; dictionary chunks map their indices through
    one converted dictionary (to_pylist per element is ~50x slower, and this
    shares one string object per distinct value)."""
    if not pa.types.is_dictionary(col.type):
        return list(col.to_pylist())
    out: list[Any] = []
    prev: pa.Array | None = None
    values: list[Any] = []
    for chunk in col.chunks:
        d = chunk.dictionary
        # Stream readers apply dictionary deltas by growing the dictionary, so
        # each chunk's usually extends the last: convert only the new tail.
        if prev is not None and len(d) >= len(prev) and d.slice(0, len(prev)).equals(prev):
            values[-1:] = d.slice(len(prev)).to_pylist()
        else:
            values = d.to_pylist()
        values.append(None)
        prev = d
        idx = chunk.indices.fill_null(len(values) - 1).to_pylist()
        out.extend([values[i] for i in idx])
    return out


class _Pass:
    """Content cells for one sequential pass: a batch is decoded once, when
    its first planned row is needed, and its planned rows' cells are held
    until consumed (never re-decoded, whatever the storage order)."""

    def __init__(self, trace: Trace, planned: dict[int, int]) -> None:
        self.trace = trace
        self.planned = planned
        self.held: dict[int, tuple[Any, ...]] = {}
        self.decoded: set[int] = set()

    def cell(self, row: int, name: str) -> Any:
        held = self.held.get(row)
        if held is None and row in self.planned:
            k = self.trace.batch_of(row)
            if k not in self.decoded:
                self._extract(k)
                held = self.held.get(row)
        if held is not None:
            return held[_CONTENT.index(name)]
        return self.trace._cell(row, name)

    def _extract(self, k: int) -> None:
        self.decoded.add(k)
        batch = self.trace.decode_batch(k)
        start = self.trace._batch_starts[k]
        cols = [
            _id_arrays(batch.column(n)) if n == "blocks" else batch.column(n).to_pylist()
            for n in _CONTENT
        ]
        for i in range(batch.num_rows):
            if start + i in self.planned:
                self.held[start + i] = tuple(c[i] for c in cols)

    def consume(self, row: int) -> None:
        self.held.pop(row, None)
        self.planned.pop(row, None)


class BodyBuilder:
    """Builds the bodies of planned rows on demand, in any order, cheaply when
    the order is roughly trace order (a replay's dispatch order).

    Each session's latest built content is kept until the session's last
    planned row, so a turn that extends the previous one costs O(appended);
    anything else (a fork's base in another session, an out-of-plan base)
    falls back to the chain walk. Content batches are decoded once each.

    **Usage**::

        builder = trace.builder(rows)
        body = builder.json(row, patch={"stream": True})
    """

    def __init__(self, trace: Trace, rows: Iterable[int]) -> None:
        self.trace = trace
        plan = list(rows)
        self._pass = _Pass(trace, {r: i for i, r in enumerate(plan)})
        sess = trace.column("session_id")
        self._last: dict[str, int] = {sess[r]: r for r in plan}
        self._live: dict[str, tuple[int, Any]] = {}
        self._sess = sess
        self._kinds = trace.column("kind")
        self._prompts = trace._prompts
        at = {r: i for i, r in enumerate(plan)}  # a row planned twice: its last place
        self._keys = {r: (k, at[r]) for r, k in trace.prompt_keys(at).items()}
        owners: dict[PromptKey, set[str]] = {}
        for r, (k, _) in self._keys.items():
            owners.setdefault(k, set()).add(sess[r])
        self._prompts.expect(self._keys.values(), sessions={k: len(v) for k, v in owners.items()})

    def content(self, row: int) -> Any:
        """The row's content (see :meth:`Trace.content`)."""
        if self._kinds[row] == Kind.RAW:
            return None
        s = self._sess[row]
        held = self._live.get(s)
        live = {held[0]: held[1]} if held is not None else None
        content = self.trace.content(row, live, self._pass.cell, compact=True)
        if self._last.get(s) == row:
            self._live.pop(s, None)
        else:
            self._live[s] = (row, content)
        return content

    def json(self, row: int, patch: dict[str, Any] | None = None, content: Any = None) -> bytes:
        """The body as JSON bytes; ``content`` replaces the row's own (live mode)."""
        if content is None:
            content = self.content(row)
        body = self.trace.body_json(row, patch, content=content, cell=self._pass.cell)
        self._pass.consume(row)
        planned = self._keys.pop(row, None)
        if planned is not None:
            self._prompts.built(*planned)
        return body

    def close(self) -> None:
        """Take back the planned builds that did not happen (a replay that
        stopped early), so those prompts age out like any others."""
        self._prompts.expect(self._keys.values(), -1)
        self._keys.clear()


def _check_format(p: Path, schema: pa.Schema) -> int:
    """The stored schema version of a replayer trace."""
    meta = schema.metadata or {}
    if meta.get(META_FORMAT) != FORMAT_NAME.encode():
        raise TraceError(
            f"{p}: an Arrow file, but not a replayer trace (no {FORMAT_NAME} metadata)"
        )
    version = meta.get(META_VERSION, b"")
    try:
        return int(version)
    except ValueError:
        raise TraceError(f"{p}: bad schema version {version!r}") from None


def _check_columns(p: Path, schema: pa.Schema) -> None:
    names = schema.names
    for f in SCHEMA:
        if f.name not in names:
            raise TraceError(f"{p}: wrong schema: column {f.name!r} is missing")
        if names.count(f.name) > 1:
            # e.g. a v4 trace whose version says 3: the migration adds a second one
            raise TraceError(f"{p}: wrong schema: column {f.name!r} appears twice")
        got = schema.field(f.name).type
        if got != f.type:
            raise TraceError(f"{p}: wrong schema: column {f.name!r} is {got}, expected {f.type}")
