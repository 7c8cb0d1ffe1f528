"""What the target tests share: emulator command lines, a readiness wait,
and checks that a process group and its port are really gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
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
