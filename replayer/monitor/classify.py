"""Crash classification: every target failure ends in exactly one class.

The evidence is what the client saw on the first failing request, the
``/health`` answers after it, whether the process is gone (its exit code when
we launched it), and the hang watchdog. The rules, in order:

0. ``unhealthy``: the server is alive (the process has not exited, the port
   answers) and reports a faulted engine that it keeps (vLLM's fault
   tolerance: ``/fault_tolerance/status`` says ``unhealthy`` after the
   failure, while ``/health`` may still say 200). Its requests were aborted
   and new ones wait for an operator's ``retry``, so the stall that follows
   is this, not a ``hang``. Once the recovery timeout passes vLLM raises and
   the engine dies: a failure watched past that is ``process_exit`` or
   ``engine_dead`` by the rules below.
1. ``hang``: the watchdog saw no token progress on any in-flight request for
   the stall timeout (past every pending prefill's allowance) while the
   server stayed reachable (``/health`` 200, or every recent probe timed out:
   the API stuck too), or a request outlived ``--request-timeout`` with
   ``/health`` still 200.
2. ``process_exit``: the process is gone (it exited, or its port refuses
   connections) within the settle window after the failure, whatever the
   client saw first. vLLM's single API server answers 503 for up to ~5 s
   after engine death and then exits with code 0, so the settle window (10 s
   by default) makes this verdict the same run after run.
3. ``engine_dead``: ``/health`` answers 503, or requests failed with an
   engine-death body (500 or an in-stream error event whose message is
   vLLM's ``EngineDeadError`` text, any version), and the API stays up.
4. ``stream_cut``: a stream ended without ``[DONE]`` (or the connection was
   reset) and the server is still healthy.
5. ``http_5xx_other``: any other 5xx or in-stream error with a healthy server
   (vLLM's per-request internal errors, admission 503s).
6. ``client_error``: a 4xx. Recorded, never a crash.

Before all of them, ``network``: the requests reach the target through a hop
the monitor bypasses (a proxy, a tunnel, a load balancer: ``--monitor-url``
names the target's own address), the first failure is the transport's (a
refused connect, a reset or cut stream; or a timeout or hang while the
target's own metrics show it idle, nothing running or waiting), the process
is alive, and the target's own ``/health`` answered 200 on every probe from
the failure to the end of the settle window. The server was fine; the way to
it was not. Not a crash: a trial that ends so is infrastructure (``INFRA``).
Without a known hop the client's view alone cannot tell a proxy's reset
from the server's, and the rules above apply unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # classify stays a leaf: the replay client imports it
    from replayer.monitor.health import Probe


class FailureClass(StrEnum):
    PROCESS_EXIT = "process_exit"
    ENGINE_DEAD = "engine_dead"
    HANG = "hang"
    STREAM_CUT = "stream_cut"
    HTTP_5XX_OTHER = "http_5xx_other"
    CLIENT_ERROR = "client_error"
    UNHEALTHY = "unhealthy"
    """The server reports a faulted engine it keeps, alive (vLLM fault tolerance)."""
    NETWORK = "network"
    """The way to a healthy target failed (see the module docstring)."""

    @property
    def is_crash(self) -> bool:
        return self not in (FailureClass.CLIENT_ERROR, FailureClass.NETWORK)


# The messages vLLM puts in 500 bodies and in-stream error events when the
# engine is dead (VLLM.md §2.2, every version the detector must accept).
ENGINE_DEATH_MESSAGES = (
    "The server had an error while processing your request.",  # 0.33 CLIENT_MESSAGE
    "EngineCore encountered an issue",  # 0.10.1 - 0.3x
    "EngineDeadError",
    "Engine loop has died",
    "MQLLMEngine is already dead",
    "Background loop has errored already",
    "AsyncEngineDeadError",
)


def is_engine_death_message(message: str | None) -> bool:
    return bool(message) and any(m in message for m in ENGINE_DEATH_MESSAGES)  # type: ignore[operator]


@dataclass(frozen=True)
class Evidence:
    """What is known about a failure when it is classified."""

    error_class: str | None
    """The first failing request's error class (``stream_error``, ``http_500``,
    ``stream_cut``, ``connect``, ``timeout``, ``hang`` …)."""
    http_status: int | None
    message: str | None
    probes_after: Sequence[Probe] = ()
    """``/health`` probes from the failure to the end of the settle window."""
    process_exited: bool = False
    """A launched process was seen to exit (its code is in the signature)."""
    hang: bool = False
    """The progress watchdog fired."""
    death_bodies: int = 0
    """Failed requests whose body carried an engine-death message."""
    direct: bool = False
    """``probes_after`` were answered at the target's own address while the
    requests took another way (through a network hop)."""
    idle: bool | None = None
    """The target's own metrics after the failure: nothing running or
    waiting (None: not known)."""


CUT = frozenset({"connect", "disconnected", "stream_cut"})
"""Transport failures where the connection itself broke."""
WAIT = frozenset({"timeout", "hang"})
"""Transport failures where nothing came back in time."""


def network_failed(ev: Evidence) -> bool:
    """The ``network`` rule of the module docstring."""
    probes = list(ev.probes_after)
    if not ev.direct or ev.process_exited or not probes or not all(p.ok for p in probes):
        return False
    if ev.error_class in CUT:
        return True
    return (ev.hang or ev.error_class in WAIT) and ev.idle is True


def classify(ev: Evidence) -> FailureClass:
    probes = list(ev.probes_after)
    refused = any(p.error == "refused" for p in probes)
    healthy_at_end = bool(probes) and probes[-1].ok
    if network_failed(ev):
        return FailureClass.NETWORK
    dead = ev.process_exited or refused or any(p.engine == "dead" for p in probes)
    if not dead and any(p.unhealthy for p in probes):
        return FailureClass.UNHEALTHY
    if ev.hang or (ev.error_class == "timeout" and healthy_at_end):
        return FailureClass.HANG
    if ev.process_exited or refused or ev.error_class == "connect":
        return FailureClass.PROCESS_EXIT
    if (
        any(p.status == 503 for p in probes)
        or ev.death_bodies
        or is_engine_death_message(ev.message)
    ):
        return FailureClass.ENGINE_DEAD
    if ev.error_class in ("stream_cut", "disconnected"):
        return FailureClass.STREAM_CUT
    if ev.error_class == "timeout":
        return FailureClass.HANG  # no health answer either: it is not progressing
    if (
        ev.http_status is not None
        and 400 <= ev.http_status < 500
        and ev.error_class != ("stream_error")
    ):
        return FailureClass.CLIENT_ERROR
    return FailureClass.HTTP_5XX_OTHER
