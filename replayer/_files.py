"""Output files that never clobber or half-write: results are written to a
temporary sibling and renamed into place only when complete."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from replayer.errors import UsageError


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path; rename it to ``path`` if the block succeeds.

    An existing ``path`` is refused unless ``force``: replayer never
    overwrites a trace or a result by accident."""
    out = Path(path)
    if out.exists() and not force:
        raise UsageError(f"{out} already exists (use --force to overwrite)")
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
