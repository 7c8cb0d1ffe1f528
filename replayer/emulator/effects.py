"""Fault effects: what each failure mode does to the engine, the log and the
process (VLLM.md §2, §7.4).

* ``exit``/``dead``: the crash report (GPU error, scheduler dump, EngineCore
  traceback, ``AsyncLLM output_handler failed``), then engine death: every
  in-flight request gets the dead-engine error, ``/health`` turns 503. For
  ``exit`` the shutdown follows ``after`` seconds later (default: see
  :meth:`~replayer.emulator.runtime.Runtime.exit_delay`), or at once when a
  new request meets the dead engine (vLLM's ``terminate_if_errored``),
  unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``.
* ``unhealthy`` (with ``--enable-fault-tolerance``): vLLM's fault tolerance
  keeps the faulted engine, UNHEALTHY: the sentinel's log lines with the
  fault's traceback, every in-flight request fails, the engine stops
  stepping (new requests wait for a recovery that never comes), ``/health``
  stays 200 and ``/fault_tolerance/status`` says ``unhealthy``; after
  ``timeout`` s, "[FT] No recovery" and engine death, exit 0. Without fault
  tolerance the fault kills the engine: ``exit``.
* :meth:`Effects.engine_killed` (SIGUSR1 to the process): what ``kill -9`` of
  vLLM's EngineCore does - no GPU error or engine traceback, the API server's
  ``engine core exited unexpectedly`` and ``EngineDeadError``, then the same
  death and exit 0.
* ``hang``: the engine stops stepping; the shm-broadcast warning repeats;
  optionally an RPC-timeout crash later; with ``api=stall`` no endpoint
  answers any more, ``/health`` included.
* ``cut``: streams lose their connection mid-body; ``kill=1`` kills the process.
* ``slow``: the step-time multiplier and per-step delay.
* ``error``: one request fails with the per-request internal error.

Effects are applied by the engine loop; this module must not block. It sees
the server through :class:`Host`, the few things it acts on, not through
:class:`~replayer.emulator.runtime.Runtime` (which owns the effects): the
dependency goes one way, runtime -> effects.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from replayer._async import spawn
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.engine import Engine
from replayer.emulator.faults import FaultRule
from replayer.emulator.logs import BatchDump, ServerLog

if TYPE_CHECKING:
    from replayer.emulator.request import Request


FT_ERRORS = {
    "cuda": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "hip": "RuntimeError: HIP error: an illegal memory access was encountered",
    "hsa": "RuntimeError: HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to "
    "access memory beyond the largest legal address. code: 0x29",
}
"""The exception a fault-tolerant busy loop catches, by GPU flavour."""
FT_TRACEBACK = (
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/fault_tolerance/'
    'engine_core_sentinel.py", line 178, in run_with_fault_tolerance',
    "    busy_loop_func(self)",
    '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 1086, '
    "in run_busy_loop",
    "    self._process_engine_step()",
    '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 1120, '
    "in _process_engine_step",
    "    outputs, model_executed = self.step_fn()",
    '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", '
    "line 2514, in execute_model",
    "    model_output = self.model(",
)
"""The fault's traceback in the sentinel's log line (the signature's root cause)."""


class Host(Protocol):
    """What effects act on: the server's config, log and engine, and its process
    (implemented by :class:`~replayer.emulator.runtime.Runtime`)."""

    @property
    def cfg(self) -> EmulatorConfig: ...

    @property
    def log(self) -> ServerLog: ...

    @property
    def engine(self) -> Engine: ...

    def schedule_exit(self, code: int, after: float | None) -> None:
        """Shut the server down ``after`` seconds from now (None: its default delay)."""

    def kill(self) -> None:
        """The API process dies at once."""

    def stall_api(self) -> None:
        """No HTTP request is answered from now on (the event loop is stuck)."""


class Effects:
    """The server's :class:`~replayer.emulator.engine.EffectSink`.

    **Usage**::

        effects = Effects(host)     # host: the Runtime, whose engine calls apply()
    """

    def __init__(self, rt: Host) -> None:
        self.rt = rt
        self._tasks: list[asyncio.Task[None]] = []
        self.fault: str | None = None
        """The exception type of the fault that left the engine UNHEALTHY."""

    def engine_status(self) -> list[dict[str, object]]:
        """``/fault_tolerance/status``'s ``engines``, as vLLM's sentinel pushes them."""
        if self.rt.engine.dead:
            return [{"id": 0, "status": "dead"}]
        if self.fault is not None:
            return [{"id": 0, "status": "unhealthy", "fault_info": self.fault}]
        return [{"id": 0, "status": "healthy"}]

    def apply(self, rule: FaultRule, target: Request | None, dump: BatchDump) -> None:
        rt = self.rt
        if rule.effect == "unhealthy" and rt.cfg.enable_fault_tolerance:
            self.unhealthy(rule.text("gpu"), rule.opt_num("timeout"))
        elif rule.effect == "unhealthy":
            self.crash(rule.text("gpu"), dump, 0, None)  # no fault tolerance: engine death
        elif rule.effect in ("exit", "dead"):
            code = int(rule.num("code")) if rule.effect == "exit" else None
            after = rule.opt_num("after") if rule.effect == "exit" else 0.0
            self.crash(rule.text("gpu"), dump, code, after)
        elif rule.effect == "hang":
            rt.engine.hang()
            if rule.text("api") == "stall":
                rt.stall_api()
            self._tasks.append(spawn(self._hang_warnings(rule.num("warn_every")), name="hang"))
            timeout = rule.opt_num("timeout")
            if timeout is not None:
                code = int(rule.num("code"))
                asyncio.get_running_loop().call_later(timeout, self._hang_timeout, code)
        elif rule.effect == "cut":
            rt.engine.cut(target if rule.text("scope") == "request" else None)
            if rule.num("kill"):
                rt.kill()
        elif rule.effect == "slow":
            rt.engine.slow_down(rule.num("factor"), rule.num("add"), rule.opt_num("duration"))
        elif rule.effect == "error" and target is not None:
            rt.log.request_failed(target.engine_id)
            rt.engine.fail(target)

    def crash(
        self,
        gpu: str | None,
        dump: BatchDump,
        exit_code: int | None,
        after: float | None,
        *,
        timeout: bool = False,
    ) -> None:
        rt = self.rt
        if rt.engine.dead:
            return
        flavour = gpu if gpu else ("hsa" if rt.cfg.platform == "rocm" else "cuda")
        rt.log.crash(flavour, dump, timeout=timeout)
        rt.engine.die()
        if exit_code is not None and not rt.cfg.keep_alive_on_engine_death:
            rt.schedule_exit(exit_code, after)

    def unhealthy(self, gpu: str | None, timeout: float | None) -> None:
        """vLLM's ``EngineCoreSentinel.on_fault``: abort what runs, wait for recovery."""
        rt = self.rt
        if rt.engine.dead or self.fault is not None:
            return
        flavour = gpu if gpu else ("hsa" if rt.cfg.platform == "rocm" else "cuda")
        error = FT_ERRORS.get(flavour, FT_ERRORS["cuda"])
        self.fault = error.split(":", 1)[0]
        rt.log.engine(
            "WARNING",
            "engine_core_sentinel.py:81",
            f"[FT] Busy loop raised {self.fault}. Waiting for recovery.",
        )
        rt.log.engine(
            "INFO",
            "engine_core_sentinel.py:98",
            "[FT] Engine 0 status -> UNHEALTHY:\n" + "\n".join(FT_TRACEBACK) + "\n" + error,
        )
        for r in [*rt.engine.running, *rt.engine.waiting]:
            rt.engine.fail(r)
        rt.engine.hang()
        if timeout is not None:
            asyncio.get_running_loop().call_later(timeout, self._no_recovery, timeout)

    def _no_recovery(self, timeout: float) -> None:
        rt = self.rt
        if rt.engine.dead:
            return
        rt.log.engine(
            "ERROR", "engine_core_sentinel.py:190", f"[FT] No recovery within {timeout:g}s timeout."
        )
        rt.engine.die()
        if not rt.cfg.keep_alive_on_engine_death:
            rt.schedule_exit(0, None)

    def engine_killed(self) -> None:
        """The EngineCore process was killed (SIGKILL): engine death, exit 0."""
        rt = self.rt
        if rt.engine.dead:
            return
        rt.log.engine_killed()
        rt.engine.die()
        if not rt.cfg.keep_alive_on_engine_death:
            rt.schedule_exit(0, None)

    def _hang_timeout(self, code: int) -> None:
        self.crash(None, self.rt.engine.dump(), code, 0.0, timeout=True)

    async def _hang_warnings(self, every: float) -> None:
        engine = self.rt.engine
        while engine.hung and not engine.dead:
            await asyncio.sleep(every)
            if engine.hung and not engine.dead:
                self.rt.log.hang_warning(every)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
