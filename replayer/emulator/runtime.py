"""Per-server state and the process lifecycle after a crash.

One :class:`Runtime` per app: configuration, logs, metrics, the fault plan,
the engine, id generators, and the shutdown sequence vLLM runs when its
engine dies (VLLM.md §2.1 steps 5-7): ``Shutting down``, stop accepting,
let in-flight responses finish, ``Application shutdown complete.``,
``Finished server process``, exit.

How the process actually stops is injected: :mod:`.server` passes hooks that
close the listening socket and ``os._exit``; an in-process app (tests) gets
hooks that only record what would have happened, so a test runner is never
killed by a fault.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from replayer._async import spawn
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.effects import Effects
from replayer.emulator.engine import Engine
from replayer.emulator.faults import FaultPlan, load_rules
from replayer.emulator.logs import ServerLog
from replayer.emulator.metrics import Metrics
from replayer.emulator.requestlog import RequestLog

SHUTDOWN_TIMEOUT = 10.0
WATCHDOG_S = 5.0
"""vLLM's ``VLLM_WATCHDOG_TIME_S``: how often the API server checks for a dead engine."""
DEFAULT_EXIT_DELAY = 1.0


class Runtime:
    """Everything one emulated server owns.

    Usage::

        rt = Runtime(cfg)                       # in-process: exits are recorded
        rt = Runtime(cfg, exit_hook=os._exit)   # as a process
    """

    def __init__(
        self,
        cfg: EmulatorConfig,
        *,
        exit_hook: Callable[[int], None] | None = None,
        kill_hook: Callable[[], None] | None = None,
        log_stdout: bool = True,
    ) -> None:
        self.cfg = cfg
        self.log = ServerLog(cfg, stdout=log_stdout, path=cfg.log_file)
        self.reqlog = RequestLog(cfg.request_log)
        self.metrics = Metrics(cfg)
        self.plan = FaultPlan(load_rules(cfg.faults, cfg.fault_files), cfg.seed)
        self.effects = Effects(self)
        self.engine = Engine(cfg, self.metrics, self.plan, self.reqlog, self.effects)
        self.created = int(time.time())
        self._ids = random.Random(f"ids:{cfg.seed}")
        self.perm_id = f"modelperm-{self.hex(16)}"
        self.seq = 0
        self.inflight = 0
        self.exit_code: int | None = None
        """Set when an ``exit`` fault killed the engine: the code to exit with."""
        self.exited: int | None = None
        """In-process only: the code the process would have exited with."""
        self.killed = False
        self.api_stalled = False
        """A ``hang api=stall`` fired: no request is answered any more."""
        self.shutting_down = False
        self.stop_server: Callable[[], Awaitable[None]] | None = None
        self.paths: frozenset[str] = frozenset()
        """The app's route paths (the ``handler`` label of ``http_*`` metrics)."""
        self.active = 0
        """HTTP requests being handled right now (any path)."""
        self.quiet = asyncio.Event()
        """Set while no HTTP request is being handled (the shutdown waits for it)."""
        self.quiet.set()
        self._exit_hook = exit_hook
        self._kill_hook = kill_hook
        self._stats_task: asyncio.Task[None] | None = None
        self.started_at = time.monotonic()
        """When the app started (the phase of vLLM's watchdog)."""

    # -- ids ---------------------------------------------------------------------------

    def hex(self, n: int) -> str:
        return f"{self._ids.getrandbits(4 * n):0{n}x}"

    def request_started(self) -> None:
        self.active += 1
        self.quiet.clear()

    def request_done(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.quiet.set()

    def stall_api(self) -> None:
        self.api_stalled = True

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.started_at = time.monotonic()
        self.engine.start()
        if self.cfg.stats_interval > 0:
            self._stats_task = spawn(self._stats(), name="emulator-stats")

    async def stop(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            await asyncio.gather(self._stats_task, return_exceptions=True)
        await self.effects.stop()
        await self.engine.stop()

    def dead_engine_hit(self) -> None:
        """A request met the dead engine: vLLM's ``terminate_if_errored``."""
        if self.exit_code is not None:
            self.begin_shutdown(self.exit_code)

    def schedule_exit(self, code: int, after: float | None) -> None:
        """Shut down ``after`` seconds from now (None: :meth:`exit_delay`)."""
        self.exit_code = code
        delay = self.exit_delay() if after is None else after
        asyncio.get_running_loop().call_later(delay, self.begin_shutdown, code)

    def exit_delay(self) -> float:
        """Seconds from engine death to shutdown when nothing hits the dead engine.
        vLLM's ``watchdog_loop`` checks every 5 s from start-up, so the 503 window
        is 0-5 s depending on when the engine died (measured on 0.32: 0.7 s and
        1.9 s after kills at different times); the 0.32 profile emulates that
        tick, other profiles keep a fixed 1 s."""
        if self.cfg.profile != "0.32":
            return DEFAULT_EXIT_DELAY
        since = time.monotonic() - self.started_at
        return WATCHDOG_S - since % WATCHDOG_S

    def begin_shutdown(self, code: int) -> None:
        if self.shutting_down:
            return
        self.shutting_down = True
        spawn(self._shutdown(code), name="emulator-shutdown")

    async def _shutdown(self, code: int) -> None:
        self.log.shutdown()
        if self.stop_server is not None:
            await self.stop_server()
        self.log.shutdown_complete()
        self.exited = code
        if self._exit_hook is not None:
            self._exit_hook(code)

    def kill(self) -> None:
        """The API process dies at once (``cut kill=1``)."""
        self.killed = True
        if self._kill_hook is not None:
            self._kill_hook()

    async def _stats(self) -> None:
        interval = self.cfg.stats_interval
        e = self.engine
        last_prompt, last_gen, last_q, last_h = 0, 0, 0, 0
        while not e.dead:
            await asyncio.sleep(interval)
            if e.dead:
                return
            moved = e.prompt_tokens_done != last_prompt or e.generated != last_gen
            if moved or not e.idle:
                dq, dh = e.queries - last_q, e.hits - last_h
                self.log.stats(
                    (e.prompt_tokens_done - last_prompt) / interval,
                    (e.generated - last_gen) / interval,
                    len(e.running),
                    len(e.waiting),
                    e.preemptions,
                    e.pool.usage,
                    dh / dq if dq else 0.0,
                )
            last_prompt, last_gen, last_q, last_h = (
                e.prompt_tokens_done,
                e.generated,
                e.queries,
                e.hits,
            )
