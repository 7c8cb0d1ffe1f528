"""Reading the Arrow IPC streams replayer appends to while it runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc


def read_stream(path: Path) -> pa.Table:
    """Every whole batch of an IPC stream file (results.arrow, metrics.arrow).

    Those files are written batch by batch while a run goes on, so a killed
    run leaves a torn last batch: it is dropped, never an error. A run killed
    before its first whole message leaves a file with no schema: an empty
    table (no columns), not an error either."""
    batches: list[pa.RecordBatch] = []
    with pa.memory_map(str(path)) as src:
        try:
            reader = ipc.open_stream(src)
        except (pa.ArrowInvalid, OSError):
            return pa.table({})
        schema = reader.schema
        while True:
            try:
                batches.append(reader.read_next_batch())
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError):
                break
    return pa.Table.from_batches(batches, schema=schema)
