"""What the conformance suite's modules (test_wire.py, test_agent_apis.py)
share: the servers' configuration (alike on the emulator and a real vLLM),
one :class:`Server` interface over either, JSON shapes, and the start of
the servers a death test kills: both time the kill by the server's
watchdog, so both note when the port began accepting."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from replayer.testing.emulator import EmulatorProcess, poll_until
from tests.helpers.net import accepting

BOUND = 60.0
"""Upper bound, in seconds, on any single wait here."""


def watched_emulator(emu: EmulatorProcess) -> Iterator[EmulatorProcess]:
    """Run ``emu`` for a fixture (``yield from``), with ``listening_since``
    the ``time.monotonic()`` when its port began accepting."""
    emu.launch()  # bound, not yet listening
    poll_until(lambda: accepting(emu.port), BOUND, what="the emulator listening")
    emu.listening_since = time.monotonic()  # type: ignore[attr-defined]
    emu.wait_ready()
    try:
        yield emu
    finally:
        emu.stop()


def watched_vllm(vllm_env: Any, model: Path, log: Path, served_name: str) -> Iterator[Any]:
    """Run a dedicated real vLLM for a fixture (``yield from``): no tool
    flags, prompt-token details, ~100 tokens/s (the plugin's 10 ms a step),
    with ``listening_since`` noted by a thread that watches its port (vLLM's
    watchdog starts then, give or take its lifespan start-up)."""
    from replayer.testing.vllm import VLLMServer, free_port

    srv = VLLMServer(
        vllm_env,
        model,
        log,
        tools=False,
        extra=("--enable-prompt-tokens-details",),
        served_name=served_name,
        port=free_port(),
        environ={"REPLAYER_VLLM_FAULTS": "slow add=0.01 when step=1"},
    )
    seen: list[float] = []

    def watch() -> None:
        poll_until(lambda: accepting(srv.port), srv.startup_timeout, what="vLLM listening")
        seen.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    srv.start()
    try:
        watcher.join(BOUND)
        srv.listening_since = seen[0] if seen else None
        yield srv
    finally:
        srv.stop()


MODEL = "tiny-llama"
VOCAB = 8192
MAX_MODEL_LEN = 16384
BLOCK = 128
"""vLLM's KV block on CPU; the emulator is started with the same."""
WATCHDOG = 5.0
"""vLLM's watchdog period: a dead engine with no request hitting it ends the
server at the next tick, counted from when the server started listening."""
EMULATOR_ARGS = [
    "--vllm-version", "0.32.0",
    "--model", "/models/tiny-llama",
    "--served-model-name", MODEL,
    "--vocab-size", str(VOCAB),
    "--max-model-len", str(MAX_MODEL_LEN),
    "--block-size", str(BLOCK),
    "--tensor-parallel-size", "1",
    "--enable-prompt-tokens-details",
    "--stats-interval", "0",
]  # fmt: skip
TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"]


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass
class Server:
    """One server under test, whatever it is."""

    kind: str
    port: int
    kill_engine: Callable[[], None] = field(repr=False)
    wait_exit: Callable[[float], int | None] = field(repr=False)
    listening_since: float | None = None
    """``time.monotonic()`` when the port started accepting (the watchdog's phase)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=BOUND)
        try:
            data = raw if raw is not None else None if body is None else json.dumps(body)
            hdrs = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers={**hdrs, **(headers or {})})
            resp = conn.getresponse()
            return Reply(resp.status, resp.getheaders(), resp.read())
        finally:
            conn.close()

    def post(self, path: str, body: object, **kw: Any) -> Reply:
        return self.request("POST", path, body, **kw)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def health(self) -> int | None:
        """``/health``'s status, or None when the connection is refused (or
        dropped: a probe that races the listening socket's close)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def openai(self) -> openai.OpenAI:
        """A client to use as a context manager: one left open holds its
        socket until a garbage collection (a ResourceWarning at some later,
        unrelated test)."""
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="x", max_retries=0, timeout=BOUND)


def emulator_server(emu: EmulatorProcess) -> Server:
    return Server(
        "emulator",
        emu.port,
        kill_engine=lambda: os.kill(emu.pid, signal.SIGUSR1),
        wait_exit=lambda t: emu.wait_exit(t),
        listening_since=getattr(emu, "listening_since", None),
    )


def vllm_server(srv: Any) -> Server:
    return Server(
        "vllm",
        srv.port,
        kill_engine=lambda: os.kill(srv.engine_core(), signal.SIGKILL),
        wait_exit=lambda t: srv.wait_exit(t),
        listening_since=getattr(srv, "listening_since", None),
    )


def words(n: int, seed: str) -> str:
    """``n`` random words: a prompt no earlier request shares a block with."""
    rng = random.Random(seed + os.urandom(8).hex())
    return " ".join(f"w{rng.randrange(10**8)}" for _ in range(n))


def shape(obj: Any) -> str:
    """A JSON value's shape: keys in order, scalars by type (``s`` string, ``i``
    int, ``f`` float, ``b`` bool, ``n`` null), a list by its first item."""
    if isinstance(obj, dict):
        return "{" + ",".join(f"{k}:{shape(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + (shape(obj[0]) if obj else "") + "]"
    if obj is None:
        return "n"
    return {bool: "b", int: "i", float: "f", str: "s"}[type(obj)]


def names(reply: Reply) -> list[str]:
    return [k for k, _ in reply.headers]
