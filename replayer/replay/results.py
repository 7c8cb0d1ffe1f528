"""What a replay produced: one row per trace request per target.

Every request of the selection appears exactly once per target, sent or not,
with the reason (``status``). Rows stream to ``RUN/results.arrow`` (Arrow IPC
stream, flushed at least every second), so a replayer killed mid-run keeps what it
measured: every whole batch (a torn last one is dropped on reading), and a
full disk ends the file on its last whole batch. Times are microseconds after the shared anchor T0.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from replayer._arrow import read_stream
from replayer._files import output_error, truncate_quietly, writing
from replayer._version import __version__
from replayer.errors import OutputError


class Status(StrEnum):
    OK = "ok"
    HTTP_ERROR = "http_error"
    """A non-200 status, or an error event inside a 200 stream."""
    TRANSPORT_ERROR = "transport_error"
    """Connection refused or reset, or a stream cut before ``[DONE]``."""
    TIMEOUT = "timeout"
    ABORTED = "aborted"
    """The replay disconnected where the recorded client did (``--aborts
    replay``): by design, not a failure of the server."""
    NOT_SENT_AFTER_CRASH = "not_sent_after_crash"
    SKIPPED = "skipped"


@dataclass(slots=True)
class Result:
    """One request as one target saw it."""

    target: str
    row: int
    request_id: str
    session_id: str
    turn: int
    status: Status = Status.SKIPPED
    seq: int | None = None
    """Dispatch order on this target (0-based); None when not sent."""
    scheduled_us: int | None = None
    dispatched_us: int | None = None
    first_byte_us: int | None = None
    first_token_us: int | None = None
    done_us: int | None = None
    http_status: int | None = None
    error_class: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    output_hash: str | None = None
    chunks: int | None = None
    itl_mean_us: int | None = None
    itl_max_us: int | None = None
    finish_reason: str | None = None
    output_text: str | None = None
    spec_drafts: int | None = None
    """Speculative decoding, as the server reported it for this request (vLLM
    ``--per-request-spec-decode-metrics``): verify steps, draft tokens
    proposed, draft tokens accepted. None when it reported none; columns a
    results file from before them lacks read as None."""
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None

    @property
    def lag_us(self) -> int | None:
        if self.dispatched_us is None or self.scheduled_us is None:
            return None
        return self.dispatched_us - self.scheduled_us


_TYPES: dict[str, pa.DataType] = {
    "target": pa.string(),
    "row": pa.int64(),
    "request_id": pa.string(),
    "session_id": pa.string(),
    "turn": pa.int32(),
    "status": pa.string(),
    "seq": pa.int64(),
    "scheduled_us": pa.int64(),
    "dispatched_us": pa.int64(),
    "first_byte_us": pa.int64(),
    "first_token_us": pa.int64(),
    "done_us": pa.int64(),
    "http_status": pa.int32(),
    "error_class": pa.string(),
    "error": pa.string(),
    "prompt_tokens": pa.int64(),
    "completion_tokens": pa.int64(),
    "cached_tokens": pa.int64(),
    "output_hash": pa.string(),
    "chunks": pa.int64(),
    "itl_mean_us": pa.int64(),
    "itl_max_us": pa.int64(),
    "finish_reason": pa.string(),
    "output_text": pa.string(),
    "spec_drafts": pa.int64(),
    "spec_draft_tokens": pa.int64(),
    "spec_accepted_tokens": pa.int64(),
}
FIELDS = [f.name for f in fields(Result)]
SCHEMA = pa.schema(
    [pa.field(n, _TYPES[n]) for n in FIELDS],
    metadata={b"replayer.results_version": b"1", b"replayer.version": __version__.encode()},
)


FLUSH_ROWS = 256
"""Results per written batch at most (see :meth:`ResultsWriter.add`)."""


class ResultsWriter:
    """Appends results as they settle; a batch hits the disk every second.

    ``on_add`` sees every result as it is added: every request of a replay
    passes here exactly once, so live counters fed from it (``--metrics-port``,
    :mod:`replayer.telemetry`) agree with the file by construction.

    A batch that cannot be written (a full disk) is cut back off the file,
    so it ends on its last whole batch; :attr:`error` holds the one
    :class:`~replayer.errors.OutputError`, ``on_error`` hears it once (the
    replay stops on it), and nothing more is written."""

    def __init__(
        self,
        path: Path,
        flush_interval: float = 1.0,
        *,
        on_add: Callable[[Result], None] | None = None,
        on_error: Callable[[OutputError], None] | None = None,
    ) -> None:
        self.path = path
        self.on_add = on_add
        self.on_error = on_error
        self.error: OutputError | None = None
        self._rows: list[Result] = []
        self._interval = flush_interval
        self._last = time.monotonic()
        self.written = 0
        # the schema is written to a temporary file renamed into place: a
        # results.arrow that exists is a readable stream, whenever a kill came
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with writing(path):
                self._sink = pa.OSFile(str(tmp), "wb")
                # lz4, not zstd: a batch is written on the event loop, and zstd's
                # per-buffer set-up made a 256-row batch cost 1.2 ms there (lz4:
                # 0.2 ms, for a file ~1.8x larger: a few MB per 100,000 requests)
                self._w = ipc.new_stream(
                    self._sink, SCHEMA, options=ipc.IpcWriteOptions(compression="lz4")
                )
                # pyarrow writes the schema with the first batch: an empty one now
                self._w.write_batch(pa.RecordBatch.from_pylist([], schema=SCHEMA))
                self._sink.flush()
                os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError, AttributeError):
                self._sink.close()
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        self._good = self._sink.tell()
        """Bytes of whole batches: where a failed write is cut back to."""
        _open.add(self)

    def add(self, r: Result) -> None:
        if self.on_add is not None:
            self.on_add(r)
        if self.error is not None:
            return
        self._rows.append(r)
        # A batch is written on the event loop: a second of a fast replay's
        # results at once (~900 rows) held it ~30 ms; 256 rows hold it a few.
        if len(self._rows) >= FLUSH_ROWS:
            self.flush()
        else:
            self.flush_due()

    def flush_due(self) -> None:
        """Flush if a second has passed since the last flush. The replay
        calls it on its progress tick too: results that settled just before
        a target hung must not wait in memory for the next one to settle."""
        if self._rows and time.monotonic() - self._last >= self._interval:
            self.flush()

    def flush(self) -> None:
        """Write the pending rows as one batch; never raises for a failed
        write (see the class doc)."""
        if self._rows and self.error is None:
            cols = {n: [getattr(r, n) for r in self._rows] for n in FIELDS}
            cols["status"] = [s.value if s is not None else None for s in cols["status"]]
            batch = pa.record_batch([pa.array(cols[n], _TYPES[n]) for n in FIELDS], schema=SCHEMA)
            try:
                self._w.write_batch(batch)
                self._sink.flush()
            except OSError as exc:
                self._fail(exc)
                return
            self.written += len(self._rows)
            self._rows.clear()
            self._good = self._sink.tell()
        self._last = time.monotonic()

    def _fail(self, exc: OSError) -> None:
        truncate_quietly(self.path, self._good)
        self._rows.clear()
        self.error = output_error(exc, self.path)
        if self.on_error is not None:
            self.on_error(self.error)

    def close(self) -> None:
        """Flush and end the stream; after a failed write, only let go of the
        file (it already ends on its last whole batch)."""
        _open.discard(self)
        if self._sink.closed:
            return
        self.flush()
        if self.error is None:
            try:
                self._w.close()
                self._sink.flush()
            except OSError as exc:  # the end-of-stream mark: the batches stand without it
                self._fail(exc)
        with contextlib.suppress(OSError):
            self._sink.close()


_open: weakref.WeakSet[ResultsWriter] = weakref.WeakSet()


def close_open_writers() -> None:
    """Close every results file still open. The CLI calls it when a forced
    interrupt (a second Ctrl-C) cut a replay's clean-up short: the results
    already measured are written instead of lost."""
    for w in list(_open):
        w.close()


def read_results(path: Path) -> list[dict[str, Any]]:
    """All result rows of a run (a killed run's torn tail is dropped). A
    column a file from an older replayer lacks (one added since) reads as None."""
    table = read_stream(path)
    rows: list[dict[str, Any]] = table.to_pylist()
    missing = [n for n in FIELDS if n not in table.column_names] if table.num_columns else []
    for row in rows if missing else ():
        for n in missing:
            row[n] = None
    return rows
