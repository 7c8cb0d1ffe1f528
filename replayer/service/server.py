"""Running the service: bind, announce, wait for SIGTERM/SIGINT, stop cleanly.

One serve per data directory (an exclusive ``flock`` on ``DIR/.serve.lock``).
Abusive clients are bounded (:mod:`replayer._http`): a request head must
arrive whole, and a stalled body resume, within ``$REPLAYER_CLIENT_TIMEOUT``
(60 s); heads are bounded in size and count; the open-files limit is raised
for idle connections.
On a stop signal the listener closes, running workers are asked to stop
(their jobs stay ``running`` on disk and resume at the next start, see
:mod:`replayer.service.scheduler`), and the process exits 0.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import sys
from pathlib import Path

from aiohttp import web

from replayer._http import (
    CLIENT_TIMEOUT_S,
    MAX_HEADERS,
    SERVER_LOG,
    ClientDeadline,
    client_timeout,
    quiet_client_faults,
    raise_fd_limit,
)
from replayer.errors import UsageError
from replayer.options.service import ServeOptions
from replayer.service.app import ServeConfig, Service

SERVE_FDS = 4096
"""Open files serve wants: client connections (idle ones included), its
workers' pipes and logs, and the files it serves."""


def _lock_data(data: Path) -> int | None:
    """An exclusive lock on DIR for this process's lifetime: a second serve on
    the same DIR would take the first one's running jobs for a dead serve's
    and stop them. None if another serve holds it."""
    fd = os.open(data / ".serve.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd  # kept open (and locked) until the process exits


async def serve(
    cfg: ServeConfig,
    host: str,
    port: int,
    *,
    port_file: Path | None = None,
    source: str = "",
    client_timeout_s: float = CLIENT_TIMEOUT_S,
) -> int:
    lock = _lock_data(cfg.data)
    if lock is None:
        print(
            f"replayer serve: error: another replayer serve is using {cfg.data}",
            file=sys.stderr,
        )
        return 2
    warning = raise_fd_limit(SERVE_FDS)
    if warning is not None:
        print(f"replayer serve: warning: {warning}", file=sys.stderr, flush=True)
    # a client vanishing mid-upload fails its handler: one line, not a traceback
    quiet_client_faults(logging.getLogger("replayer.service"))
    svc = Service(cfg)
    runner = web.AppRunner(
        svc.app(),
        access_log=None,
        handle_signals=False,
        logger=SERVER_LOG,
        max_headers=MAX_HEADERS,
    )
    await runner.setup()
    assert runner.server is not None
    deadline = ClientDeadline(runner.server, client_timeout_s).start()
    site = web.TCPSite(runner, host, port, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        deadline.stop()
        await runner.cleanup()
        print(
            f"replayer serve: error: cannot listen on {host}:{port}: {exc.strerror}",
            file=sys.stderr,
        )
        return 2
    bound = port
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        bound = int(server.sockets[0].getsockname()[1])
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(f"{bound}\n")
        os.replace(tmp, port_file)
    print(
        f"replayer serve: listening on http://{host}:{bound} (data {cfg.data}; "
        f"{len(cfg.targets.by_name)} target(s), {len(cfg.targets.pools)} pool(s); "
        f"token {source})",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        print("replayer serve: stopping", file=sys.stderr, flush=True)
        deadline.stop()
        await runner.cleanup()
    return 0


def run(options: ServeOptions) -> int:
    """Run the service the declared options describe until SIGTERM/SIGINT."""
    from replayer.service.auth import load_token
    from replayer.service.config import load_targets

    assert options.data is not None
    data = Path(options.data)
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--data {data}: cannot create: {exc.strerror}") from None
    targets = load_targets(Path(options.targets) if options.targets else None)
    token, source = load_token(
        Path(options.token_file) if options.token_file else None, data, options.host
    )
    cfg = ServeConfig(
        data=data.resolve(),
        token=token,
        targets=targets,
        max_concurrent=options.max_concurrent_jobs,
        max_upload_bytes=options.max_upload,
        cancel_grace=options.cancel_grace,
    )
    port_file = Path(options.port_file) if options.port_file else None
    serving = serve(
        cfg,
        options.host,
        options.port,
        port_file=port_file,
        source=source,
        client_timeout_s=client_timeout(),
    )
    return asyncio.run(serving)
