"""Bodies built in worker processes (``--workers N``).

One core builds token-id bodies at ~400 MB/s and sends them at ~1.3 GB/s
(bench/RESULTS.md, "Bodies at wire speed"): past a few hundred MB/s the
build, not the send, is what one process cannot do. So the build is what is
sharded. Sessions are dealt to N worker processes (by their tokens, so the
bytes are shared evenly); each builds its sessions' static bodies in plan
order, as due, into a shared-memory ring, and the replay's own process copies
them out and sends them. Everything that decides *when* and *in what order*
a request leaves stays in that one process, on one event loop: strict order,
the schedule, the results file and the monitor are exactly those of a
one-process replay, and the bodies are the same bytes (the same builder runs
on the same trace; tests/replay/test_workers.py compares them).

Bodies that wait for live replies (live mode, chained Responses) are built
in the replay's process when asked for, as with one worker. A worker that
dies is reported (:attr:`ProcBodies.died`, ``summary.json``'s
``body_workers``) and the bodies it still owed are built in the replay's
process: its requests are sent, late, never lost.

Why a ring in shared memory rather than a pipe: a multiprocessing pipe costs
the receiver ~1.2 ms of CPU per MB (measured), as much as building the body;
a copy out of shared memory ~0.07 (``pread`` would copy without the GIL,
but costs 0.19: on two busy cores the CPU counts more).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import multiprocessing as mp
import os
import signal
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer.replay.bodies import Bodies, body_patch

if TYPE_CHECKING:
    from replayer.replay.policy import ReplayPolicy
    from replayer.trace.reader import Trace

log = logging.getLogger("replayer.replay")

RING_MIN = 64 << 20
"""Bytes of each worker's ring at least (a body longer than its ring goes by pipe)."""
_HEADER = 64
"""The ring's header: the consumer's position (u64 at 0), then the bodies."""
START_TIMEOUT = 60.0
"""Seconds a worker may take to import and open the trace."""
AUTO_MIN_CPUS = 4
"""``--workers auto`` stays in one process below this many usable CPUs: on
two cores a worker takes the core the sends or the server need (measured:
1.12x one pinned process at best, bench/RESULTS.md)."""
AUTO_MIN_BYTES = 1 << 30
"""... and below this many bytes of static bodies: each worker's start-up
(spawn, imports, opening the trace) is ~1.5 s of CPU."""
AUTO_THREAD_MB_S = 300.0
"""The average rate (MB/s of bodies the schedule asks for) past which a
thread sharing the sending core falls behind: it builds ~1,300 MB per CPU
second but the sends want most of that core. Two processes then: together
they build faster than one process sends, so more would not help."""


def auto_workers(body_bytes: int, span_s: float | None, cpus: int) -> tuple[int, str]:
    """``--workers auto``: (workers, why). ``body_bytes``: the static bodies
    of the selection; ``span_s``: the schedule's length in seconds at the
    replay's speed (None: as fast as possible)."""
    mb = body_bytes / 1e6
    if cpus < AUTO_MIN_CPUS:
        return 1, f"{cpus} usable CPU(s): a worker process would take a core from the sends"
    if body_bytes < AUTO_MIN_BYTES:
        return 1, f"{mb:,.0f} MB of bodies: one thread builds them"
    if span_s is not None and span_s > 0 and mb / span_s < AUTO_THREAD_MB_S:
        return 1, f"{mb / span_s:,.0f} MB/s of bodies on average: one thread keeps up"
    rate = "as fast as possible" if span_s is None or span_s <= 0 else f"{mb / span_s:,.0f} MB/s"
    return 2, f"{mb:,.0f} MB of bodies at {rate}, {cpus} usable CPUs"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class BodySpec:
    """What a worker process needs to build a static body exactly as the
    replay's own process would (picklable: it crosses to the worker)."""

    trace_path: str
    token_space: tuple[int, int, str]
    cache_bytes: int
    model: str | None
    force_stream: bool

    def builder(self, rows: Sequence[int]) -> Callable[[int], bytes]:
        from replayer.trace.reader import Trace
        from replayer.trace.tokens import TokenSpace

        trace = Trace.open(self.trace_path).configured(
            tokens=TokenSpace(*self.token_space), body_cache_bytes=self.cache_bytes
        )
        builder = trace.builder(rows)
        base: dict[str, Any] = {"model": self.model} if self.model else {}

        def build(row: int) -> bytes:
            return builder.json(row, body_patch(trace, row, base, self.force_stream))

        return build


def shard(sessions: Sequence[str], weight: Sequence[int], n: int) -> list[int]:
    """Each plan position's worker: whole sessions, dealt in order of first
    appearance to the least loaded worker (load: the weights so far)."""
    load = [0] * n
    owner: dict[str, int] = {}
    total: dict[str, int] = {}
    for s, w in zip(sessions, weight, strict=True):
        total[s] = total.get(s, 0) + max(1, w)
    for s in sessions:
        if s not in owner:
            k = min(range(n), key=load.__getitem__)
            owner[s] = k
            load[k] += total[s]
    return [owner[s] for s in sessions]


# -- the worker process --------------------------------------------------------


def _worker_main(
    spec: BodySpec,
    conn: Connection,
    ring_path: str,
    ring_size: int,
    positions: list[int],
    rows: list[int],
    due: list[float] | None,
    horizon: float,
) -> None:
    """Build ``rows`` (plan ``positions``) in order, as due, into the ring."""
    # Ctrl-C reaches the whole process group: the replay's process decides
    # what stops, and tells its workers (or they see its pipe close)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        build = spec.builder(rows)
        fd = os.open(ring_path, os.O_RDWR)
        try:
            ring = mmap.mmap(fd, _HEADER + ring_size)
        finally:
            os.close(fd)
    except BaseException as exc:  # the parent reports it and builds the bodies itself
        with contextlib.suppress(OSError):
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    with contextlib.suppress(OSError):  # (BrokenPipeError: the replay's process is gone)
        conn.send(("ready",))
        _Producer(conn, ring, ring_size, due, horizon).run(positions, rows, build)


class _Producer:
    def __init__(
        self,
        conn: Connection,
        ring: mmap.mmap,
        size: int,
        due: list[float] | None,
        horizon: float,
    ) -> None:
        self.conn, self.ring, self.size = conn, ring, size
        self.due, self.horizon = due, horizon
        self.t0: float | None = None
        self.skip: set[int] = set()
        self.stopped = False
        self.head = 0  # bytes ever written (the ring's producer position)

    def _control(self, timeout: float) -> None:
        """Read the parent's messages (waiting at most ``timeout``)."""
        try:
            while self.conn.poll(timeout):
                msg = self.conn.recv()
                timeout = 0.0
                if msg[0] == "t0":
                    self.t0 = msg[1]
                elif msg[0] == "skip":
                    self.skip.add(msg[1])
                else:  # "stop"
                    self.stopped = True
        except (EOFError, OSError):  # the parent is gone
            self.stopped = True

    def _wait_due(self, i: int) -> bool:
        """Until position ``i`` is within the horizon of the schedule."""
        if self.due is None:
            return not self.stopped
        for _ in range(1_000_000):  # bounded; each wait ends on a message or 0.2 s
            now = 0.0 if self.t0 is None else time.monotonic() - self.t0
            wait = self.due[i] - self.horizon - now
            if self.stopped or wait <= 0:
                break
            self._control(min(0.2, wait) if self.t0 is not None else 0.2)
        return not self.stopped

    def _tail(self) -> int:
        return int(struct.unpack_from("<Q", self.ring, 0)[0])

    def _room(self, n: int) -> int | None:
        """Where ``n`` bytes go (ring offset), waiting for the consumer; None if stopped."""
        for _ in range(10_000_000):  # bounded; each wait ends on a message or 1 ms
            off = self.head % self.size
            skip = self.size - off if off + n > self.size else 0  # no wrap inside a body
            if self.head + skip + n - self._tail() <= self.size:
                self.head += skip
                return self.head % self.size
            self._control(0.001)
            if self.stopped:
                return None
        return None

    def run(self, positions: list[int], rows: list[int], build: Callable[[int], bytes]) -> None:
        for pos, row in zip(positions, rows, strict=True):
            self._control(0.0)
            if self.stopped:
                return
            if pos in self.skip:
                continue
            if not self._wait_due(pos):
                return
            if pos in self.skip:  # discarded while it waited
                continue
            try:
                body = build(row)
            except Exception as exc:  # the dispatcher raises it, as with one worker
                self.conn.send(("error", pos, f"{type(exc).__name__}: {exc}"))
                continue
            n = len(body)
            if n > self.size:
                self.conn.send(("big", pos, body))
                continue
            off = self._room(n)
            if off is None:
                return
            self.ring[_HEADER + off : _HEADER + off + n] = body
            self.head += n
            self.conn.send(("body", pos, off, n, self.head))
        with contextlib.suppress(OSError):
            self.conn.send(("done",))
        # stay until told to stop: a closed pipe would read as a death
        for _ in range(1_000_000):  # bounded; each wait ends on a message or 0.2 s
            if self.stopped:
                return
            self._control(0.2)


# -- the replay's side ---------------------------------------------------------


_DEAD = b"\x00dead\x00"  # a future's value when its worker died before building it


class _Worker:
    def __init__(self, k: int, proc: Any, conn: Connection, ring: mmap.mmap, path: str) -> None:
        self.k, self.proc, self.conn, self.ring, self.path = k, proc, conn, ring, path
        self.send_lock = threading.Lock()
        self.alive = True
        self.done = False
        self.thread: threading.Thread | None = None

    def tell(self, *msg: Any) -> None:
        if not self.alive:
            return
        with self.send_lock, contextlib.suppress(OSError, ValueError):
            self.conn.send(msg)


class ProcBodies:
    """:class:`~replayer.replay.bodies.Bodies`' interface, its static bodies
    built by ``n`` worker processes (see the module docstring)."""

    def __init__(
        self,
        spec: BodySpec,
        n: int,
        build: Callable[[int], bytes],
        static: Sequence[bool],
        rows: Sequence[int],
        sessions: Sequence[str],
        weight: Sequence[int],
        *,
        ahead_bytes: int,
        due: Sequence[float] | None,
        horizon: float,
        lock: threading.Lock | None = None,
        ring_bytes: int | None = None,
    ) -> None:
        """``ring_bytes``: each worker's ring (default: the budget's share,
        at least :data:`RING_MIN`); a body longer than it goes by pipe."""
        self.n = n
        self.died: list[str] = []
        self._budget = max(ahead_bytes, 1)
        self._owner = shard(sessions, weight, n)
        self._cv = threading.Condition()
        self._futs: dict[int, Future[bytes]] = {}
        self._held = 0
        self._asked = -1  # the highest position asked for
        self._waiting = 0  # readers waiting for room in the budget
        self._dropped: set[int] = set()
        self._closed = False
        # what no worker builds (live bodies, a dead worker's) is built here, when asked
        self._local = Bodies(build, [False] * len(static), ahead_bytes=0, lock=lock)
        ring_size = ring_bytes if ring_bytes is not None else max(RING_MIN, ahead_bytes // n)
        ctx = mp.get_context("spawn")  # never fork a process that runs threads
        self._workers: list[_Worker] = []
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        for k in range(n):
            mine = [i for i in range(len(static)) if static[i] and self._owner[i] == k]
            fd, path = tempfile.mkstemp(prefix="replayer-bodies-", dir=shm)
            try:
                os.ftruncate(fd, _HEADER + ring_size)
                ring = mmap.mmap(fd, _HEADER + ring_size)
            finally:
                os.close(fd)
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=_worker_main,
                args=(
                    spec,
                    child,
                    path,
                    ring_size,
                    mine,
                    [rows[i] for i in mine],
                    None if due is None else [float(d) for d in due],
                    horizon,
                ),
                name=f"replayer-bodies-{k}",
                daemon=True,
            )
            proc.start()
            child.close()
            w = _Worker(k, proc, parent, ring, path)
            for i in mine:
                self._futs[i] = Future()
            w.thread = threading.Thread(
                target=self._read, args=(w,), name=f"replayer-bodies-rx-{k}", daemon=True
            )
            self._workers.append(w)
            w.thread.start()

    @property
    def pids(self) -> list[int]:
        return [int(w.proc.pid) for w in self._workers]

    # -- the dispatcher's interface (that of Bodies) --------------------------

    def start(self, t0: float) -> None:
        for w in self._workers:
            w.tell("t0", t0)

    async def get(self, i: int) -> bytes:
        fut = self._futs.get(i)
        if fut is None:
            return await self._local.get(i)
        if not fut.done():  # (a done one costs no loop round trip)
            with self._cv:
                self._asked = max(self._asked, i)
                if self._waiting:
                    self._cv.notify_all()
            await asyncio.wrap_future(fut)
        body = fut.result()
        if body is _DEAD:
            return await self._local.get(i)
        with self._cv:
            self._futs.pop(i, None)
            before = self._held
            self._held -= len(body)
            if self._waiting and self._held < self._budget <= before:
                self._cv.notify_all()  # a reader held a body back for the budget
        return body

    def discard(self, i: int) -> None:
        fut = self._futs.get(i)
        if fut is None:
            return
        with self._cv:
            self._dropped.add(i)
            if fut.done():
                self._futs.pop(i, None)
                body = fut.result()
                if body is not _DEAD:
                    self._held -= len(body)
            self._cv.notify_all()
        self._workers[self._owner[i]].tell("skip", i)

    async def warm(self, k: int, within: float) -> int:
        """Wait (at most ``within`` seconds) until the first ``k`` positions'
        bodies are here, or the budget is full."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        first = [f for i, f in self._futs.items() if i < k]
        ready = 0
        for _ in range(int(within / 0.01) + 1):  # bounded by ``within``
            while ready < len(first) and first[ready].done():  # they come in order
                ready += 1
            with self._cv:
                full = self._held >= self._budget
            if full or ready == len(first) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.01)
        return sum(f.done() for f in first)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for w in self._workers:
            w.tell("stop")
        for w in self._workers:
            w.proc.join(timeout=1.0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=1.0)
            with contextlib.suppress(OSError):
                w.conn.close()
            if w.thread is not None:
                w.thread.join(timeout=1.0)
            with contextlib.suppress(OSError):
                os.unlink(w.path)
            with contextlib.suppress(BufferError, ValueError):
                w.ring.close()
        self._local.close()

    # -- one reader thread per worker -----------------------------------------

    def _read(self, w: _Worker) -> None:
        why = "its pipe closed"
        try:
            why = self._receive(w)
        except (EOFError, OSError) as exc:
            why = f"its pipe closed ({type(exc).__name__})"
        finally:
            w.alive = False
            self._gone(w, why)

    def _receive(self, w: _Worker) -> str:
        for _ in range(1 << 40):  # bounded by the worker's bodies and its lifetime
            msg = w.conn.recv()
            kind = msg[0]
            if kind == "ready":
                with contextlib.suppress(OSError):
                    os.unlink(w.path)  # mapped by both: nothing is left behind
            elif kind == "failed":
                return f"it could not start: {msg[1]}"
            elif kind == "done":
                w.done = True
            elif kind == "error":
                fut = self._futs.get(msg[1])
                if fut is not None and not fut.done():
                    fut.set_exception(RuntimeError(msg[2]))
            elif kind == "big":
                self._deliver(msg[1], msg[2])
            else:  # "body": pos, offset, length, the producer's position after it
                _, pos, off, n, end = msg
                if not self._wait_room(pos):
                    return "stopped"
                body = w.ring[_HEADER + off : _HEADER + off + n]
                struct.pack_into("<Q", w.ring, 0, end)  # its bytes are free again
                self._deliver(pos, body)
        return "stopped"

    def _wait_room(self, pos: int) -> bool:
        """Hold a body in the ring while the budget is full, unless it is
        asked for (or earlier than one that is): never a deadlock."""
        with self._cv:
            for _ in range(1 << 30):  # bounded; each wait ends on a get/discard or 1 s
                if self._closed:
                    return False
                if self._held < self._budget or pos <= self._asked or pos in self._dropped:
                    return True
                self._waiting += 1
                try:
                    self._cv.wait(1.0)
                finally:
                    self._waiting -= 1
        return True

    def _deliver(self, pos: int, body: bytes) -> None:
        with self._cv:
            fut = self._futs.get(pos)
            if fut is None or fut.done():
                return
            if pos in self._dropped:
                self._futs.pop(pos, None)
                return
            self._held += len(body)
        fut.set_result(body)

    def _gone(self, w: _Worker, why: str) -> None:
        if self._closed:
            return
        w.proc.join(timeout=1.0)
        code = w.proc.exitcode
        owed = [i for i, f in list(self._futs.items()) if self._owner[i] == w.k and not f.done()]
        if not owed and w.done:
            return
        note = (
            f"body worker {w.k} (pid {w.proc.pid}) died"
            + (f" with exit code {code}" if code is not None else "")
            + f" ({why}); its {len(owed)} remaining bodies are built in the replay's process"
        )
        self.died.append(note)
        log.warning("%s", note)
        for i in owed:
            with contextlib.suppress(InvalidStateError):  # (a body came meanwhile)
                self._futs[i].set_result(_DEAD)


def spec_of(trace: Trace, policy: ReplayPolicy) -> BodySpec | None:
    """The worker's spec for a trace on disk (None for one held in memory)."""
    path = trace.path
    if path is None or not Path(path).is_file():
        return None
    t = trace.tokens
    return BodySpec(
        trace_path=str(path),
        token_space=(t.lo, t.hi, t.salt),
        cache_bytes=trace.body_cache_bytes,
        model=policy.model or None,
        force_stream=policy.force_stream,
    )
