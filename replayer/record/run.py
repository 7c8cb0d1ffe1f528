"""``replayer record`` as a process: signals, progress lines, the port file.

SIGTERM and SIGINT stop the recorder cleanly: it stops listening, gives
in-flight exchanges ``--drain`` seconds, records those still open as
abandoned (``meta.abandoned = "shutdown"``), flushes and closes the trace,
and says where it is. A second signal cuts the drain short. SIGKILL needs no
handling: an exchange is written before its client gets the response's end
(see :mod:`replayer.record.sink`).

If the trace cannot be written (a full disk), recording stops and traffic
goes on: one line says so at once (path and free bytes), the progress line
repeats it, and at the stop the recorder exits 2 (:data:`EXIT_STOPPED`).
Rows that could not be built while recording went on exit 1.

Progress goes to stderr every ``progress`` seconds while something changed:
exchanges recorded, in flight, bytes on disk.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from replayer._async import spawn
from replayer.options.record import RecordOptions, parse_listen
from replayer.record.proxy import RecordConfig, RecordingProxy, is_loopback

EXIT_STOPPED = 2
"""Recording stopped before the recorder did (the trace could not be written)."""
EXIT_ROWS_LOST = 1
"""Some rows could not be built; recording went on."""


class RecorderObserver(Protocol):
    """What may watch a recording (live metrics): it reads the proxy's
    public counters (:meth:`RecordingProxy.stats`) when it likes."""

    def attach_recorder(self, proxy: RecordingProxy) -> None: ...


def say(msg: str) -> None:
    print(f"record: {msg}", file=sys.stderr, flush=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def status_line(proxy: RecordingProxy) -> str:
    rec = proxy.recorder
    n, failed = (rec.recorded, rec.failed) if rec is not None else (0, 0)
    line = (
        f"{n:,} exchanges recorded ({failed:,} failed), {proxy.inflight} in flight, "
        f"{proxy.forwarded:,} requests forwarded, {human(_size(proxy.config.output))} written"
    )
    st = proxy.stats()
    if st.stopped is not None:
        line += f"; RECORDING STOPPED ({st.stopped}): {st.rows_lost:,} not recorded"
    return line


async def _progress(proxy: RecordingProxy, every: float) -> None:
    last = ""
    while True:
        await asyncio.sleep(every)
        line = status_line(proxy)
        if line != last:
            say(line)
            last = line


def tune_gc() -> None:
    """Make the cyclic garbage collector cheaper for the rest of the process.

    Everything alive once the proxy is up (modules, the proxy, its pools)
    lives as long as the process: frozen, it is never scanned again. And a
    relayed request allocates a few hundred short-lived containers, so the
    default young-generation threshold (700) collects every couple of
    requests. With 10,000 the recorder spends ~6% less CPU per request
    (bench/RESULTS.md); memory grows by at most that many young objects.
    """
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when uvloop is installed (~7% less recorder CPU
    per request, bench/RESULTS.md), else None: asyncio's default.

    **Usage**::

        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(serve(config))
    """
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


async def serve(
    config: RecordConfig,
    *,
    port_file: Path | None = None,
    progress: float = 10.0,
    segment_of: Path | None = None,
    live: RecorderObserver | None = None,
) -> int:
    """Run the recorder until SIGTERM/SIGINT; the exit code. ``live``
    (``--metrics-port``) reads the proxy's counters at scrape time."""
    proxy = RecordingProxy(config)
    proxy.on_stop = lambda why: say(f"error: {why}")
    await proxy.start()
    tune_gc()
    if live is not None:
        live.attach_recorder(proxy)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = [0]

    def on_signal() -> None:
        signals[0] += 1
        if signals[0] == 1:
            stop.set()
        else:
            say("second signal: cutting in-flight exchanges")
            proxy.hurry()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    if not is_loopback(config.host):
        say(
            f"warning: listening on {config.host}, not loopback: anyone who can reach "
            "this port can use the upstream through it"
        )
    say(
        f"listening on {proxy.url} -> {proxy.upstream}; recording to {config.output} "
        "(each exchange written before its client gets the response's end)"
    )
    if port_file is not None:
        assert proxy.address is not None
        write_port_file(port_file, proxy.address[1])
    ticker = spawn(_progress(proxy, progress), name="record-progress") if progress > 0 else None
    await stop.wait()
    if proxy.inflight:
        say(f"stopping: {proxy.inflight} in flight, up to {config.drain:g} s to finish")
    if ticker is not None:
        ticker.cancel()
    await proxy.stop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
    sink = proxy.sink
    rec = proxy.recorder
    n = rec.recorded if rec is not None else 0
    size = human(_size(config.output))
    say(f"stopped; {n:,} exchanges recorded in {config.output} ({size})")
    if rec is not None:
        for count, what in (
            (rec.raw, "stored raw: a body not in its API's shape (meta.unreadable says why)"),
            (
                rec.unexpanded,
                "chained by previous_response_id to a response not recorded: stored as "
                "sent (meta.unexpanded); a server without a response store will refuse them",
            ),
            (rec.unrecorded, "forwarded, not recorded: the body was not a JSON object"),
        ):
            if count:
                say(f"  {count:,} {what}")
    if segment_of is not None and config.output != segment_of:
        say(
            f"this is a segment of {segment_of}; join the segments with: "
            f"replayer trace merge <segments> -o <merged.arrow>"
        )
    if sink.stopped is not None:
        say(
            f"error: recording stopped early ({sink.stopped}): the trace holds "
            f"{sink.flushed:,} exchanges, {sink.lost:,} were forwarded but not recorded"
        )
        return EXIT_STOPPED
    if sink.errors:
        say(f"error: {sink.errors} row(s) could not be written (last: {sink.last_error})")
        return EXIT_ROWS_LOST
    return 0


def config_of(options: RecordOptions, output: Path, segment: int, segment_of: Path) -> RecordConfig:
    """What the proxy is told, from the declared options and the claimed file."""
    host, port = parse_listen(options.listen)
    assert options.upstream is not None
    return RecordConfig(
        upstream=options.upstream,
        output=output,
        host=host,
        port=port,
        flush_interval=options.flush_interval,
        session_headers=options.session_headers,
        drop_headers=options.drop_header,
        redact=options.redact,
        fsync=options.fsync,
        drain=options.drain,
        max_connections=options.max_connections,
        connect_timeout=options.connect_timeout,
        add_request_id=options.add_request_id,
        record_count_tokens=options.record_count_tokens,
        id_prefix="rec-" if segment == 0 else f"rec{segment}-",
        details={"segment": segment, "segment_of": str(segment_of)},
    )


def record(options: RecordOptions, output: Path, *, live: RecorderObserver | None = None) -> int:
    """Claim ``output`` (or its next segment) and record into it until stopped;
    nothing recorded (the port was taken, say) leaves no empty file behind."""
    import contextlib

    from replayer.record.segments import claim

    path, segment = claim(output)
    config = config_of(options, path, segment, output)
    if segment:
        say(f"{output} exists: recording to a new segment, {path}")
    try:
        # uvloop when it is installed: ~7% less CPU per relayed request
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(
                serve(
                    config,
                    port_file=Path(options.port_file) if options.port_file else None,
                    progress=options.progress,
                    segment_of=output,
                    live=live,
                )
            )
    except BaseException:
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()
        raise
