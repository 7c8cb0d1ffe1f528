"""What the target tests share: emulator command lines, a readiness wait,
checks that a process group and its port are really gone, and the
processes a test started (:class:`ProcessTree`: by lineage, never by name,
so another server on the same machine is never taken for ours)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import httpx
import pytest

MODEL = "moonshotai/Kimi-K3"


def emulator_cmd(port: int, *args: str, load_time: float = 0.0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "replayer.emulator",
        "--port",
        str(port),
        "--load-time",
        str(load_time),
        "--speed",
        "instant",
        *args,
    ]


async def until_up(url: str, within: float) -> None:
    """Until ``url/health`` answers 200 (bounded): the server's own word
    that it is listening, whatever the model."""
    async with httpx.AsyncClient(base_url=url, timeout=5) as c:
        for _ in range(int(within / 0.05)):
            with contextlib.suppress(httpx.TransportError):
                if (await c.get("/health")).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} not up within {within:g}s")


def chat(content: str = "hello there " * 20, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


def live_members(pgid: int) -> list[int]:
    """Non-zombie members of a process group, read from /proc independently of
    the code under test (PID 1 here does not reap orphans, so a dead
    grandchild can linger as a zombie)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(entry.name))
    return out


def assert_group_gone(pgid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def assert_port_free(port: int) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    with socket.socket() as s:  # nobody listens or holds it bound
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def _stats() -> dict[int, tuple[str, int, int, int]]:
    """Every process's (state, ppid, process group, session), from /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            f = stat[stat.rindex(")") + 2 :].split()
            out[int(entry.name)] = (f[0], int(f[1]), int(f[2]), int(f[3]))
    return out


def alive(pid: int) -> bool:
    """Running, not a zombie (this machine's PID 1 may never reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def titled(pids: Iterable[int], title: bytes) -> list[int]:
    """Those of ``pids`` whose command line starts with ``title`` (vLLM
    retitles EngineCore and its workers ``VLLM::...``). Only ever over a
    test's own pids: by name alone, another user's vLLM would match."""
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(title):
                out.append(pid)
    return out


class ProcessTree:
    """What a test started, found by kinship, never by name: the root (a
    session leader the test started, ``start_new_session=True``), everything
    in its session, and every descendant that made a session or group of its
    own (a server replayer launches does), seen by its parent while that
    lived. Call :meth:`scan` while the root runs; a decoy that shares a name
    with a member, but not its lineage, is never one."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.pids: set[int] = {root}
        self.sessions: set[int] = {root}
        self.groups: set[int] = {root}
        self.titles: dict[int, bytes] = {}
        """Every member's command line when last seen (dead ones' too)."""

    def scan(self) -> set[int]:
        """Adopt the new members; all ever seen."""
        stats = _stats()
        for _ in range(32):  # each round adopts one more generation
            new = {
                pid
                for pid, (_, ppid, pgrp, sid) in stats.items()
                if pid not in self.pids
                and (ppid in self.pids or pgrp in self.groups or sid in self.sessions)
            }
            if not new:
                break
            for pid in new:
                _, _, pgrp, sid = stats[pid]
                if sid == pid:  # a session of its own, made by one of ours
                    self.sessions.add(sid)
                if pgrp == pid:
                    self.groups.add(pgrp)
            self.pids |= new
        for pid in self.pids:  # vLLM's processes retitle themselves after they start
            with contextlib.suppress(OSError):
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
                if title:  # a zombie's is empty: keep what it was
                    self.titles[pid] = title
        return set(self.pids)

    def alive(self) -> list[int]:
        """Members still running (not zombies), after a last scan."""
        self.scan()
        return sorted(p for p in self.pids if alive(p))

    def kill(self) -> None:
        """SIGKILL every live member and its group (idempotent)."""
        for pid in self.alive():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pgid in self.groups:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)


def with_soft_nofile(cmd: Sequence[str], soft: int) -> list[str]:
    """``cmd`` exec'd with its soft open-files limit lowered to ``soft``."""
    code = (
        "import os, resource, sys; "
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard)); "
        "os.execv(sys.argv[2], sys.argv[2:])"
    )
    return [sys.executable, "-c", code, str(soft), *cmd]
