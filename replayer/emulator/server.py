"""Run the emulator as a process, with vLLM's start-up and exit behaviour.

Start-up (VLLM.md §1.1): the port is *bound* at once but not listening, so
clients get ECONNREFUSED while the "engine loads" (``--load-time``); then
the socket starts listening and the ready lines are logged (``Starting vLLM
server on ...``, the route list, uvicorn's ``Application startup complete.``).
``--port 0`` binds a free port; ``--port-file`` receives it as soon as it is
bound, so a parent process never races for ports.

Exit: an ``exit`` fault ends in vLLM's shutdown sequence, then
``os._exit(code)`` (0 by default, as single-API-server vLLM exits after
engine death); ``cut kill=1`` is a real SIGKILL; SIGTERM/SIGINT shut down
gracefully with code 0. SIGUSR1 stands for ``kill -9`` of vLLM's EngineCore
process: the engine dies (in-flight streams get the error event, ``/health``
503), then the API server exits 0 - the emulator's side of a test that kills
a real vLLM's engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import fields
from pathlib import Path

from aiohttp import web

from replayer.emulator.app import AccessLog, create_app, routes
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.faults import load_rules
from replayer.emulator.runtime import SHUTDOWN_TIMEOUT, Runtime
from replayer.errors import UsageError

KEEPALIVE_TIMEOUT = 5.0  # VLLM_HTTP_TIMEOUT_KEEP_ALIVE


def _non_default(cfg: EmulatorConfig) -> dict[str, object]:
    base = EmulatorConfig()
    out: dict[str, object] = {}
    for f in fields(cfg):
        if f.name.startswith("_") or f.name in (
            "env",
            "port_file",
            "faults",
            "fault_files",
            "request_log",
            "log_file",
        ):
            continue
        v = getattr(cfg, f.name)
        if v != getattr(base, f.name) and not (
            f.name == "served_model_names" and v == (cfg.model,)
        ):
            out[f.name] = "[REDACTED]" if f.name == "api_key" else v
    return out


def bind(host: str, port: int) -> socket.socket:
    """A bound, not yet listening TCP socket (connections are refused)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def _write_port(path: Path, port: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(path)


def _exit_now(code: int) -> None:
    logging.shutdown()
    os._exit(code)


def _kill_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def serve(cfg: EmulatorConfig) -> None:
    """Serve until a fault or a signal ends the process (never returns normally
    after an exit fault: the process is gone)."""
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    rt = Runtime(cfg, exit_hook=_exit_now, kill_hook=_kill_now)
    sock = bind(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    if cfg.port_file is not None:
        _write_port(cfg.port_file, port)
    rt.log.startup(_non_default(cfg))
    if cfg.load_time > 0:
        await asyncio.sleep(cfg.load_time)
    app = create_app(cfg, rt)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log_class=AccessLog,
        access_log=logging.getLogger("replayer.emulator.access") if cfg.access_log else None,
        handler_cancellation=True,
        keepalive_timeout=KEEPALIVE_TIMEOUT,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    await runner.setup()
    site = web.SockSite(runner, sock, backlog=1024)
    await site.start()
    rt.log.ready(cfg.host, port, routes(app))

    async def stop_server() -> None:
        # uvicorn's order: stop listening (refused from here on), let requests in
        # progress finish, close every other connection. aiohttp alone would
        # keep a connection accepted as the socket closed open until its client
        # gives up (it drops the request data once shutting down).
        for site in list(runner.sites):
            await site.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rt.quiet.wait(), SHUTDOWN_TIMEOUT)
        if runner.server is not None:
            for conn in list(runner.server.connections):
                conn.force_close()
        await runner.cleanup()

    rt.stop_server = stop_server
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, rt.begin_shutdown, 0)
    loop.add_signal_handler(signal.SIGUSR1, rt.effects.engine_killed)
    await asyncio.Event().wait()  # the exit hook ends the process


def run(cfg: EmulatorConfig) -> int:
    """Validate the fault rules, then serve (blocking)."""
    load_rules(cfg.faults, cfg.fault_files)  # bad specs fail before the port is bound
    asyncio.run(serve(cfg))
    return 0
