"""Verification: the pass a command runs before it trusts a selection.

:func:`verify` reads rows as a replay would, before anything is sent:
it decodes the batches holding them and their delta bases (each matched
against its column digests as it decodes), rebuilds every body and matches
its length with the row's ``body_bytes``; whatever the selection, it also
checks the index invariants every writer guarantees
(:func:`check_invariants`).

It reads a trace only through what the reader offers any caller (the
:class:`Readable` protocol: index columns, batches, one sequential pass),
never the reader's internals, so a change to how the reader keeps batches
or caches cannot change what verification checks. The reader's
:meth:`~replayer.trace.reader.Trace.verify` hands itself here; this module
does not import the reader (the protocol is the whole contract, and mypy
holds :class:`~replayer.trace.reader.Trace` to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
import pyarrow as pa

from replayer.trace import content as cx
from replayer.trace.digests import corrupt, short
from replayer.trace.model import RequestRecord
from replayer.trace.schema import TRACE_SCHEMA_VERSION, Kind
from replayer.trace.tokens import TokenSpace

Cell = Callable[[int, str], Any]
"""Reads one content cell (row, column) from the batches a pass holds."""


class Readable(Protocol):
    """What verification reads of a trace: the reader's public surface."""

    @property
    def path(self) -> Path: ...
    @property
    def schema_version(self) -> int: ...
    @property
    def form(self) -> str: ...
    @property
    def torn_tail(self) -> bool: ...
    @property
    def has_digests(self) -> bool: ...
    @property
    def num_batches(self) -> int: ...
    @property
    def order(self) -> list[int]: ...
    @property
    def tokens(self) -> TokenSpace: ...
    @property
    def recorded_tokens(self) -> TokenSpace: ...
    def __len__(self) -> int: ...
    def column(self, name: str) -> list[Any]: ...
    def batch_of(self, row: int) -> int: ...
    def decode_batch(self, k: int) -> pa.RecordBatch: ...
    def sequential(self, rows: Iterable[int] | None) -> Iterator[tuple[int, Any, Cell]]: ...
    def params_text(self, row: int, cell: Cell | None = None) -> str: ...
    def body_json(
        self,
        row: int,
        patch: dict[str, Any] | None = None,
        *,
        content: Any = None,
        cell: Cell | None = None,
    ) -> bytes: ...
    def prompt_json_len(self, input_tokens: int) -> int | None: ...
    def record(self, row: int, content: Any = None) -> RequestRecord: ...


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify` checked (everything it reports passed)."""

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


def batches_of(trace: Readable, rows: Iterable[int]) -> list[int]:
    """The batches holding ``rows`` and every row of their delta chains."""
    base = trace.column("base")
    seen: set[int] = set()
    out: set[int] = set()
    for r in rows:
        cur: int | None = r
        while cur is not None and cur not in seen:
            seen.add(cur)
            out.add(trace.batch_of(cur))
            b = base[cur]
            cur = b if isinstance(b, int) and 0 <= b < cur else None
    return sorted(out)


def verify(
    trace: Readable, rows: Sequence[int] | None = None, *, bodies: bool = True
) -> VerifyReport:
    """Read ``rows`` of ``trace`` (default: every row) as a replay would (see
    the module doc); raise :class:`~replayer.errors.TraceCorruptError` naming
    the first bad batch or row. Streaming: memory stays bounded whatever the
    trace's size. ``bodies=False`` only decodes and matches the batches (and
    checks the index invariants)."""
    report = VerifyReport(
        path=trace.path,
        schema_version=trace.schema_version,
        digests=trace.has_digests,
        footer=trace.form == "file" and not trace.torn_tail,
        torn_tail=trace.torn_tail,
    )
    # Always, and over the whole index (cheap): a duplicated, dropped or moved
    # batch reads as batches that each match their digests, and shows only here.
    report.invariants = check_invariants(trace)
    selected = list(trace.order) if rows is None else list(rows)
    if not bodies:
        ks = range(trace.num_batches) if rows is None else batches_of(trace, selected)
        for k in ks:
            trace.decode_batch(k)
            report.batches += 1
        return report
    report.batches = len(batches_of(trace, selected))
    check_lengths = trace.tokens == trace.recorded_tokens
    c = trace.column
    sizes, ids, kinds, ntok = c("body_bytes"), c("request_id"), c("kind"), c("input_tokens")
    for row, content, cell in trace.sequential(selected):
        report.bodies += 1
        # A blocks prompt is a pure function of ids already matched: size it
        # as the writer did instead of generating every token. Without
        # digests (schema v1) nothing is matched: the body is built in full.
        blocks = kinds[row] == Kind.BLOCKS and report.digests
        fixed = trace.prompt_json_len(ntok[row]) if blocks else None
        try:
            if fixed is not None:
                params = trace.params_text(row, cell)
                orjson.loads(params)
                size = cx.utf8_len(params) - 4 + fixed
            else:
                body = trace.body_json(row, content=content, cell=cell)
                if not report.digests:
                    orjson.loads(body)
                size = len(body)
            if not report.digests:
                # nothing matched a digest: every JSON cell the record holds
                # (its outcome, its meta) must parse, as convert will ask
                trace.record(row, content)
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


def check_invariants(trace: Readable) -> list[str]:
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
