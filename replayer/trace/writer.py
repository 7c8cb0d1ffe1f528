"""Streaming trace writer: full request bodies in, delta-encoded rows out.

Callers (importers, the recorder, synthesis, subsetting) hand over whole
requests; the writer finds each one's base (the previous request of its
session, or an explicit ``base_hint`` for forks and sub-agents), stores only
what it appends, and flushes record batches every N rows, every so many
bytes, or every T seconds. Each flushed batch is a complete IPC message on
disk, so a writer killed with SIGKILL leaves a readable file that loses at
most the batch in progress. A flush that fails (a full disk) cuts the file
back to the end of the last good batch and closes the writer: the trace
reads whole up to there, never ending in a torn batch it could have avoided.

The writer keeps the content of recent rows in memory to diff against; the
budget is bounded (``cache_bytes``), and a row whose base fell out of the
cache is stored whole (a keyframe): correctness never depends on the cache.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from replayer.errors import TraceError
from replayer.trace import content as cx
from replayer.trace.digests import batch_metadata
from replayer.trace.framing import EOS
from replayer.trace.model import RequestRecord, TraceMeta
from replayer.trace.schema import DICT_COLUMNS, NAMES, Kind, arrow_schema
from replayer.trace.tokens import (
    BlockPrompts,
    approx_item_tokens,
    approx_message_tokens,
    approx_text_tokens,
)

DEFAULT_PATHS = {
    Kind.CHAT: "/v1/chat/completions",
    Kind.TEXT: "/v1/completions",
    Kind.BLOCKS: "/v1/completions",
    Kind.MESSAGES: "/v1/messages",
    Kind.RESPONSES: "/v1/responses",
    Kind.RAW: "/v1/chat/completions",
}
# A keyframe after this many deltas bounds reconstruction by O(size + depth).
MAX_CHAIN = 1024


@dataclass(slots=True)
class _Row:
    """What the writer remembers of a written row to diff later rows against."""

    kind: Kind
    content: Any
    params_text: str
    depth: int
    block_size: int | None
    block_ns: str | None
    sizes: list[int] | None = None  # chat: running UTF-8 byte totals of messages
    toks: list[int] | None = None  # chat: running approximate token totals
    weight: int = 0


class TraceWriter:
    """Writes a trace incrementally.

    ``form="stream"`` (default) writes an Arrow IPC stream that survives
    SIGKILL; ``form="file"`` writes an IPC file (random access for other
    tools). Both flush batch by batch, so memory stays bounded.

    **Usage**::

        with TraceWriter(path, TraceMeta(source="synth")) as w:
            w.add(record)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: TraceMeta,
        *,
        form: Literal["stream", "file"] = "stream",
        flush_rows: int = 4096,
        flush_bytes: int = 32 << 20,
        flush_interval: float | None = None,
        compression_level: int = 3,
        cache_bytes: int = 256 << 20,
        fsync: bool = False,
    ) -> None:
        self.path = Path(path)
        self.meta = meta
        self._prompts = BlockPrompts(meta.tokens, cache_bytes=32 << 20)
        self._schema = arrow_schema(meta.to_metadata())
        self._sink = pa.OSFile(str(self.path), "wb")
        # Dictionaries only grow, so each flush emits a delta; both IPC forms accept them.
        opts = ipc.IpcWriteOptions(
            compression=pa.Codec("zstd", compression_level), emit_dictionary_deltas=True
        )
        new = ipc.new_stream if form == "stream" else ipc.new_file
        self._ipc = new(self._sink, self._schema, options=opts)
        self._cols: dict[str, list[Any]] = {n: [] for n in NAMES}
        self._dicts: dict[str, dict[str, int]] = {n: {} for n in DICT_COLUMNS}
        self._pending_bytes = 0
        self._flush_rows, self._flush_bytes = flush_rows, flush_bytes
        self._flush_interval = flush_interval
        self._last_flush = time.monotonic()
        self._fsync = fsync
        self._rows: OrderedDict[int, _Row] = OrderedDict()
        self._cache_budget = cache_bytes
        self._cache_weight = 0
        self._last_of_session: dict[str, int] = {}
        self._row_of: dict[str, int] = {}
        self.rows_written = 0
        self.batches_written = 0
        self._closed = False
        self._good = 0
        """Where the last good flush left the file: a failed one is cut back to here."""
        self._form = form
        self.failed: OSError | None = None
        """The write error that closed the writer (see :meth:`flush`)."""

    # -- public API --------------------------------------------------------

    def add(self, rec: RequestRecord) -> int:
        """Append one request; returns its row index."""
        if self._closed:
            raise TraceError("trace writer is closed")
        if rec.request_id in self._row_of:
            raise TraceError(f"duplicate request_id {rec.request_id!r}")
        row = self.rows_written + len(self._cols["request_id"])
        try:
            kind = Kind(rec.kind)
            after = _after(rec)
            params, content = self._normalize(rec, kind)
            params_text = orjson.dumps(params).decode()

            base_row = self._pick_base(rec, kind)
            base = self._rows.get(base_row) if base_row is not None else None
            keep = 0
            if base is not None and kind is not Kind.RAW and base.depth < MAX_CHAIN:
                if kind is Kind.BLOCKS and (base.block_size, base.block_ns) != (
                    rec.block_size,
                    rec.block_ns,
                ):
                    keep = 0
                else:
                    keep = cx.common_prefix(base.content, content)
            if keep == 0:
                base = None
                base_row = None
            appended: Any = content[keep:] if kind is not Kind.RAW else None
            if kind is Kind.BLOCKS and not all(type(b) is int for b in appended):
                raise TraceError(f"{rec.request_id}: block ids must be integers")
            stored_params = (
                None if base is not None and base.params_text == params_text else params_text
            )

            sizes: list[int] | None = None
            toks: list[int] | None = None
            if kind.itemized:
                # Running totals per message make a row's size O(appended) to compute.
                count = approx_message_tokens if kind is Kind.CHAT else approx_item_tokens
                sizes = base.sizes[:keep] if base is not None and base.sizes is not None else []
                toks = base.toks[:keep] if base is not None and base.toks is not None else []
                total = sizes[-1] if sizes else 0
                ntok = toks[-1] if toks else 0
                for m in appended:
                    total += cx.utf8_len(m)
                    sizes.append(total)
                    ntok += count(orjson.loads(m))
                    toks.append(ntok)
                n = len(content)
                content_len = 2 + (sizes[-1] if sizes else 0) + max(n - 1, 0)
                input_tokens = rec.input_tokens if rec.input_tokens is not None else ntok
            elif kind is Kind.TEXT:
                content_len = len(orjson.dumps(content))
                input_tokens = (
                    rec.input_tokens
                    if rec.input_tokens is not None
                    else approx_text_tokens(content)
                )
            elif kind is Kind.BLOCKS:
                if rec.input_tokens is None or rec.block_size is None:
                    raise TraceError(
                        f"{rec.request_id}: blocks payload needs input_tokens and block_size"
                    )
                input_tokens = rec.input_tokens
                fixed = self._prompts.json_len(input_tokens)
                content_len = (
                    fixed
                    if fixed is not None
                    else len(
                        self._prompts.json(
                            content, rec.block_size, input_tokens, rec.request_id, rec.block_ns
                        )
                    )
                )
            else:
                content_len = 4  # params_text already holds the whole body
                input_tokens = rec.input_tokens if rec.input_tokens is not None else 0
            body_bytes = (
                cx.utf8_len(params_text) - 4 + content_len
                if kind is not Kind.RAW
                else (cx.utf8_len(params_text))
            )
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            # malformed input must not leave the columns uneven or escape as a traceback
            raise TraceError(f"{rec.request_id}: malformed request: {exc}") from None

        c = self._cols
        c["request_id"].append(rec.request_id)
        c["session_id"].append(rec.session_id)
        c["turn"].append(rec.turn)
        c["start_us"].append(rec.start_us)
        c["end_us"].append(rec.end_us)
        c["after"].append(after)
        c["path"].append(rec.path or DEFAULT_PATHS[kind])
        c["model"].append(params.get("model") if isinstance(params.get("model"), str) else None)
        c["kind"].append(kind.value)
        c["base"].append(base_row)
        c["keep"].append(keep)
        c["messages"].append(appended if kind.itemized else None)
        c["text"].append(appended if kind is Kind.TEXT else None)
        c["blocks"].append(appended if kind is Kind.BLOCKS else None)
        c["block_size"].append(rec.block_size if kind is Kind.BLOCKS else None)
        c["block_ns"].append(rec.block_ns if kind is Kind.BLOCKS else None)
        c["params"].append(stored_params)
        c["input_tokens"].append(input_tokens)
        mt = params.get("max_tokens", params.get("max_completion_tokens"))
        if mt is None:
            mt = params.get("max_output_tokens")
        c["max_tokens"].append(mt if isinstance(mt, int) and not isinstance(mt, bool) else None)
        st = params.get("stream")
        c["stream"].append(st if isinstance(st, bool) else None)
        c["body_bytes"].append(body_bytes)
        c["body_sha256"].append(rec.body_sha256)
        c["status"].append(rec.status)
        c["ttft_us"].append(rec.ttft_us)
        c["finish_reason"].append(rec.finish_reason)
        c["output_text"].append(rec.output_text)
        c["output_tool_calls"].append(
            orjson.dumps(rec.output_tool_calls).decode() if rec.output_tool_calls else None
        )
        c["usage_prompt_tokens"].append(rec.usage_prompt_tokens)
        c["usage_completion_tokens"].append(rec.usage_completion_tokens)
        c["usage_cached_tokens"].append(rec.usage_cached_tokens)
        c["error"].append(rec.error)
        c["meta"].append(orjson.dumps(rec.meta).decode() if rec.meta else None)

        weight = _weight(kind, appended, params_text)
        self._pending_bytes += weight
        self._remember(
            row,
            _Row(
                kind=kind,
                content=content,
                params_text=params_text,
                depth=(base.depth + 1) if base is not None else 0,
                block_size=rec.block_size,
                block_ns=rec.block_ns,
                sizes=sizes,
                toks=toks,
                weight=_weight(kind, content, params_text),
            ),
        )
        prev = self._last_of_session.get(rec.session_id)
        if prev is not None and prev in self._rows:
            # no longer its session's default base: first in line for eviction
            self._rows.move_to_end(prev, last=False)
        self._last_of_session[rec.session_id] = row
        self._row_of[rec.request_id] = row
        self._maybe_flush()
        return row

    def flush(self) -> None:
        """Write buffered rows as one record batch and push it to the OS.

        On an ``OSError`` (disk full, I/O error) the file is cut back to the
        last good batch and the writer closed (:attr:`failed` says why);
        the error is raised. The rows of the failed batch are lost."""
        if self._closed:
            raise TraceError("trace writer is closed")
        n = len(self._cols["request_id"])
        try:
            if n:
                arrays = [
                    self._dict_array(f.name)
                    if f.name in DICT_COLUMNS
                    else pa.array(self._cols[f.name], type=f.type)
                    for f in self._schema
                ]
                batch = pa.RecordBatch.from_arrays(arrays, schema=self._schema)
                meta = batch_metadata(batch, self._schema, start=self.rows_written)
                self._ipc.write_batch(batch, custom_metadata=meta)
            self._sink.flush()
            if self._fsync:
                os.fsync(self._sink.fileno())
        except OSError as exc:
            self._abandon(exc)
            raise
        if n:
            self.rows_written += n
            self.batches_written += 1
            for v in self._cols.values():
                v.clear()
            self._pending_bytes = 0
        self._good = self._sink.tell()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        try:
            self._ipc.close()
            self._sink.close()
        except OSError as exc:  # no room for the end-of-stream marker: the batches stand
            self._abandon(exc)
            raise
        self._closed = True

    def _abandon(self, exc: OSError) -> None:
        """Cut the file back to its last good batch and end it there.

        A stream gets its end-of-stream marker after the last good batch (8
        bytes, nearly always inside the file's last block), or, cut before its
        first batch, the schema and marker of an empty trace: it reads as a
        whole trace, not a torn one. Where even that does not fit it stays
        cut at the batch boundary, which reads too (as a torn tail)."""
        self._closed = True
        self.failed = exc
        with contextlib.suppress(OSError, ValueError):
            fd = self._sink.fileno()
            os.ftruncate(fd, self._good)
            if self._form == "stream":
                end = pa.BufferOutputStream()
                ipc.new_stream(end, self._schema).close()
                tail = end.getvalue().to_pybytes() if self._good == 0 else EOS
                if os.pwrite(fd, tail, self._good) != len(tail):
                    os.ftruncate(fd, self._good)
        with contextlib.suppress(OSError, ValueError):
            self._sink.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def rows(self) -> int:
        """Rows accepted so far (written or buffered)."""
        return self.rows_written + len(self._cols["request_id"])

    # -- internals ---------------------------------------------------------

    def _dict_array(self, name: str) -> pa.DictionaryArray:
        """Indices into one dictionary per column that only ever grows."""
        codes = self._dicts[name]
        idx = [None if v is None else codes.setdefault(v, len(codes)) for v in self._cols[name]]
        return pa.DictionaryArray.from_arrays(
            pa.array(idx, type=pa.int32()), pa.array(list(codes), type=pa.string())
        )

    def _normalize(self, rec: RequestRecord, kind: Kind) -> tuple[dict[str, Any], Any]:
        params = dict(rec.params)
        key = kind.content_key
        if key is None:
            return params, None
        params[key] = None  # fixes the content's position; appended at the end if absent
        if kind.itemized:
            if not isinstance(rec.content, list):
                raise TraceError(f"{rec.request_id}: {kind} content must be a list of {key}")
            return params, [cx.message_text(m) for m in rec.content]
        if kind is Kind.TEXT:
            if not isinstance(rec.content, str):
                raise TraceError(f"{rec.request_id}: text content must be a string")
            return params, rec.content
        if not isinstance(rec.content, list | tuple):
            raise TraceError(f"{rec.request_id}: blocks content must be a list of block ids")
        return params, list(rec.content)  # element types are checked on the appended part

    def _pick_base(self, rec: RequestRecord, kind: Kind) -> int | None:
        if rec.base_hint is not None:
            row = self._row_of.get(rec.base_hint)
            if row is None:
                raise TraceError(
                    f"{rec.request_id}: base_hint {rec.base_hint!r} is not an earlier row"
                )
        else:
            row = self._last_of_session.get(rec.session_id)
        if row is None:
            return None
        cached = self._rows.get(row)
        if cached is None or cached.kind is not kind:
            return None
        self._rows.move_to_end(row)
        return row

    def _remember(self, row: int, state: _Row) -> None:
        self._rows[row] = state
        self._cache_weight += state.weight
        while self._cache_weight > self._cache_budget and len(self._rows) > 1:
            _, old = self._rows.popitem(last=False)
            self._cache_weight -= old.weight

    def _maybe_flush(self) -> None:
        if (
            len(self._cols["request_id"]) >= self._flush_rows
            or self._pending_bytes >= self._flush_bytes
            or (
                self._flush_interval is not None
                and time.monotonic() - self._last_flush >= self._flush_interval
            )
        ):
            self.flush()


def _after(rec: RequestRecord) -> list[str] | None:
    """A record's joins, each once, in its order (null when none)."""
    if not rec.after:
        return None
    if rec.request_id in rec.after:
        raise TraceError(f"{rec.request_id}: a request cannot wait for itself (after)")
    return list(dict.fromkeys(str(a) for a in rec.after))


def _weight(kind: Kind, content: Any, params_text: str) -> int:
    """Approximate bytes a content costs in memory (for the cache budget)."""
    if kind.itemized:
        return sum(len(m) for m in content) + 64 * len(content) + len(params_text)
    if kind is Kind.TEXT:
        return len(content) + len(params_text)
    if kind is Kind.BLOCKS:
        return 36 * len(content) + len(params_text)
    return len(params_text)
