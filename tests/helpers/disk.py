"""A small disk that fills up: a tmpfs of a few kilobytes mounted for one test.

Mounting needs root (or CAP_SYS_ADMIN); where the machine refuses, the test
is skipped with one line saying so (CI runs as root, so it runs there).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(parent: Path, size: str = "256k") -> Iterator[Path]:
    """A fresh tmpfs of ``size`` bytes (mount's suffixes: ``k``, ``m``) at a
    new folder under ``parent``; unmounted (lazily, so a process still holding
    a file cannot keep it) when the block ends."""
    mnt = parent / f"disk-{uuid.uuid4().hex[:8]}"
    mnt.mkdir(parents=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) on this machine: the full-disk tests need a small tmpfs")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def fill(disk: Path, leave: int = 0) -> None:
    """Fill ``disk`` until ``leave`` bytes (about) are free."""
    free = shutil.disk_usage(disk).free
    if free > leave:
        with (disk / "ballast").open("wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * (free - leave))


def free_bytes(disk: Path) -> int:
    return shutil.disk_usage(disk).free
