"""What replay, check and bisect may ask of the server under test.

A target is reached over HTTP at ``url`` and held in one of three ways: we
launched it (:class:`~replayer.target.process.LaunchedTarget`), someone else
runs it but a command restarts it
(:class:`~replayer.target.remote.RestartableTarget`), or it is only a URL
(:class:`~replayer.target.remote.ExternalTarget`). The seam is
:class:`Target`; :class:`ServerTarget` holds what all three share: waiting
for readiness, resetting state between trials, reading the log segment of
the current launch and gathering facts for repro bundles.

Readiness (VLLM.md §1.1): a loading vLLM binds its port but does not listen,
so ECONNREFUSED for many minutes is normal; it is ready when ``/health``
answers 200 *and* ``/v1/models`` lists the expected model. Probes back off
exponentially (0.1 s doubling to 5 s, tenacity) so a 10-minute load costs a
few hundred probes, and the wait ends at once when a launched process exits.
Every wait reads one :class:`~replayer._clock.Clock` (the real one unless a
test passes a virtual one), so the backoff schedule and the timeout are exact
in tests.

Resets between trials: ``prefix-cache`` asks ``POST /reset_prefix_cache``,
which exists only with ``VLLM_SERVER_DEV_MODE=1``; without it the target
restarts instead when it can, otherwise it warns (once) and resets nothing,
and the returned :class:`ResetResult` says so.

This package never classifies failures or parses logs: :mod:`replayer.monitor` does.
"""

from __future__ import annotations

import asyncio
import logging
import signal as _signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from replayer._clock import REAL, Clock
from replayer.errors import LaunchError, ModelNotServed, OptionError, TargetError
from replayer.monitor.logs import last_launch
from replayer.options.server import ResetMode as ResetMode
from replayer.target.facts import ServerFacts, gather_facts

log = logging.getLogger("replayer.target")

DEFAULT_READY_TIMEOUT = 1800.0
"""30 minutes: a trillion-parameter model can take 10+ minutes to load."""
PROBE_TIMEOUT = 5.0
BACKOFF_MIN, BACKOFF_MAX = 0.1, 5.0
PREFIX_RESET_TRIES = 5


def reset_mode(value: str | ResetMode) -> ResetMode:
    try:
        return ResetMode(value)
    except ValueError:
        have = ", ".join(m.value for m in ResetMode)
        raise OptionError("reset", f"{value!r}: want one of {have}") from None


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """How a launched server process ended."""

    code: int | None
    """Exit status when it exited by itself; None when a signal ended it."""
    signal: int | None
    """The signal that ended it (``subprocess``'s negative return codes)."""
    at: float
    """Wall-clock time (Unix seconds) the exit was observed."""

    @classmethod
    def from_returncode(cls, rc: int, at: float | None = None) -> ExitInfo:
        at = time.time() if at is None else at
        return cls(None, -rc, at) if rc < 0 else cls(rc, None, at)

    @property
    def text(self) -> str:
        """``code 0`` or ``signal SIGKILL``."""
        if self.signal is not None:
            try:
                return f"signal {_signal.Signals(self.signal).name}"
            except ValueError:
                return f"signal {self.signal}"
        return f"code {self.code}"


@dataclass(frozen=True, slots=True)
class ResetResult:
    """What :meth:`Target.reset` did, which is not always what was asked."""

    requested: ResetMode
    performed: ResetMode
    note: str | None = None
    """Why ``performed`` differs from ``requested`` (also logged as a warning)."""


class Target(Protocol):
    """A server under test, whoever runs it.

    Usage::

        target = make_target(launch="vllm serve ...", url=None, log_path=run / "server.log")
        await target.start()
        await target.wait_ready()
        ...                                   # replay; the server crashes
        text = await target.collect_log()     # this launch's log, for the signature
        await target.restart()
        await target.wait_ready()
        await target.stop()
    """

    @property
    def url(self) -> str: ...

    @property
    def can_restart(self) -> bool: ...

    @property
    def log_path(self) -> Path | None: ...

    @property
    def exit_info(self) -> ExitInfo | None:
        """How the launched process ended (None: running, or not ours)."""
        ...

    def alive(self) -> bool | None:
        """Whether the process runs; None when there is no process to watch."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> ExitInfo | None: ...

    async def restart(self) -> None:
        """Stop and start again (TargetError when the target cannot)."""
        ...

    async def wait_ready(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Until ``/health`` is 200 and ``/v1/models`` lists the model; LaunchError otherwise."""
        ...

    async def reset(self, mode: ResetMode | str) -> ResetResult: ...

    async def collect_log(self) -> str:
        """The server log of the current launch (fetched first with ``--log-cmd``)."""
        ...

    async def facts(self) -> ServerFacts: ...


class NotReady(Exception):
    """One readiness probe failed (retried until the timeout)."""


class ServerTarget:
    """The HTTP side every target shares; subclasses add process control.

    ``model``: the served model name ``/v1/models`` must list as an ``id``
    (what requests name; vLLM rejects the ``root`` path) for the server to
    count as ready; None accepts any non-empty list."""

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        log_path: Path | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        probe_timeout: float = PROBE_TIMEOUT,
        clock: Clock = REAL,
    ) -> None:
        self.url = url.rstrip("/")
        self.clock = clock
        self.model = model
        self.api_key = api_key
        self.log_path = log_path
        self.ready_timeout = ready_timeout
        self.probe_timeout = probe_timeout
        self._segment = 0  # byte offset of the current launch's marker in log_path
        self._prefix_reset_missing: str | None = None
        self._warned_no_reset = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- overridden by subclasses ---------------------------------------------------------

    @property
    def can_restart(self) -> bool:
        return False

    @property
    def exit_info(self) -> ExitInfo | None:
        return None

    def alive(self) -> bool | None:
        return None

    async def exit_after(self, within: float) -> ExitInfo | None:
        """How the process ended, waiting up to ``within`` seconds for it to
        go; None when it is not ours or still runs (vLLM's API server exits
        seconds after its engine died, and the signature wants its status)."""
        if self.alive() is not True:
            return self.exit_info
        event = self._exit_event()
        if event is not None:
            await self.clock.sleep(within, event)
        return self.exit_info

    async def start(self) -> None:
        """Nothing to start: the server is someone else's."""

    async def stop(self) -> ExitInfo | None:
        """Nothing to stop: the server is someone else's."""
        return None

    async def restart(self) -> None:
        self._require_restart("restart")

    def _check_loading(self) -> None:
        """Raise LaunchError when waiting for readiness is pointless."""

    def _exit_event(self) -> asyncio.Event | None:
        """Set when the server process ends (interrupts backoff sleeps)."""
        return None

    def _command_facts(self) -> dict[str, object]:
        return {}

    # -- shared --------------------------------------------------------------------------

    def _require_restart(self, what: str) -> None:
        if not self.can_restart:
            raise TargetError(
                f"cannot {what} the target at {self.url}: it was given by URL alone; "
                "pass --launch CMD or --restart-cmd CMD to allow restarts"
            )

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _client(self, timeout: float | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers=self._headers(),
            timeout=self.probe_timeout if timeout is None else timeout,
            trust_env=False,
        )

    async def _probe(self, client: httpx.AsyncClient, within: float) -> None:
        try:
            health = await client.get("/health", timeout=within)
            if health.status_code != 200:
                raise NotReady(f"/health answered {health.status_code}")
            models = await client.get("/v1/models", timeout=within)
        except httpx.ConnectError as exc:
            raise NotReady(f"connection refused or failed ({exc})") from None
        except httpx.TimeoutException:
            raise NotReady(f"no answer within {within:g}s") from None
        except httpx.TransportError as exc:
            raise NotReady(f"{type(exc).__name__}: {exc}") from None
        if models.status_code == 401:
            raise TargetError(f"{self.url}/v1/models answered 401: wrong or missing API key")
        if models.status_code != 200:
            raise NotReady(f"/v1/models answered {models.status_code}")
        try:
            data = models.json()["data"]
            listed = [str(m.get("id")) for m in data]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise NotReady("/v1/models did not return a model list") from None
        if not data:
            raise NotReady("/v1/models lists no model")
        if self.model is not None and self.model not in listed:
            # a live server's model list does not change: fail now, not at the timeout
            raise ModelNotServed(self.url, [self.model], listed)

    async def wait_ready(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Until ``/health`` is 200 and ``/v1/models`` lists the model.

        ``timeout`` (default ``ready_timeout``) is part of the verdict, not a
        cancellation: running out raises LaunchError naming the last probe's
        failure, and a launched process that exits meanwhile raises at once."""
        timeout = self.ready_timeout if timeout is None else timeout
        clock = self.clock
        started = clock.now()
        deadline = started + timeout
        event = self._exit_event()

        async def pause(seconds: float) -> None:
            await clock.sleep_until(min(clock.now() + seconds, deadline), event)

        def out_of_time(_: RetryCallState) -> bool:
            return clock.now() >= deadline

        async with self._client() as client:
            try:
                async for attempt in AsyncRetrying(
                    stop=out_of_time,
                    wait=wait_exponential(multiplier=BACKOFF_MIN, min=BACKOFF_MIN, max=BACKOFF_MAX),
                    retry=retry_if_exception_type(NotReady),
                    sleep=pause,
                    reraise=True,
                ):
                    with attempt:
                        self._check_loading()
                        left = max(deadline - clock.now(), 0.05)
                        await self._probe(client, min(self.probe_timeout, left))
            except NotReady as exc:
                self._check_loading()
                raise LaunchError(f"{self.url} not ready after {timeout:g}s: {exc}") from None
        log.info("%s ready after %.1fs", self.url, clock.now() - started)

    async def reset(self, mode: ResetMode | str) -> ResetResult:
        mode = reset_mode(mode)
        if mode is ResetMode.NONE:
            return ResetResult(mode, mode)
        if mode is ResetMode.RESTART:
            self._require_restart("reset by restart")
            await self.restart()
            await self.wait_ready()
            return ResetResult(mode, mode)
        note = self._prefix_reset_missing or await self._reset_prefix_cache()
        if note is None:
            return ResetResult(mode, mode)
        if self.can_restart:
            log.warning("%s; restarting instead", note)
            await self.restart()
            await self.wait_ready()
            return ResetResult(mode, ResetMode.RESTART, note)
        if not self._warned_no_reset:
            log.warning("%s; the prefix cache is NOT reset between trials", note)
            self._warned_no_reset = True
        return ResetResult(mode, ResetMode.NONE, note)

    async def _reset_prefix_cache(self) -> str | None:
        """None on success, else why the prefix cache could not be reset."""
        why = "no attempt"
        async with self._client() as client:
            for i in range(PREFIX_RESET_TRIES):
                try:
                    resp = await client.post("/reset_prefix_cache")
                except httpx.TransportError as exc:
                    if not self.can_restart:
                        raise TargetError(
                            f"cannot reset the prefix cache of {self.url}: "
                            f"{type(exc).__name__}: {exc}"
                        ) from None
                    return f"POST /reset_prefix_cache failed ({type(exc).__name__})"
                if resp.status_code in (404, 405):
                    self._prefix_reset_missing = (
                        f"POST {self.url}/reset_prefix_cache answered {resp.status_code}: the "
                        "server is not in dev mode (start it with VLLM_SERVER_DEV_MODE=1)"
                    )
                    return self._prefix_reset_missing
                if resp.status_code == 200 and _success(resp):
                    return None
                why = f"answered {resp.status_code} {resp.text[:200]!r}"
                # {"success": false}: blocks still held by requests that are finishing.
                await self.clock.sleep(0.1 * 2**i)
        return f"POST /reset_prefix_cache {why} {PREFIX_RESET_TRIES} times"

    # -- the log ------------------------------------------------------------------------

    def _begin_segment(self, marker: str) -> None:
        """Append the launch marker; what follows belongs to the new launch."""
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as f:
            self._segment = f.seek(0, 2)
            f.write(marker.encode())

    def read_log(self) -> str:
        """The current launch's part of the log file, as it is now."""
        if self.log_path is None:
            return ""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._segment)
                data = f.read()
        except FileNotFoundError:
            return ""
        return last_launch(data.decode(errors="replace"))

    async def collect_log(self) -> str:
        return self.read_log()

    async def facts(self) -> ServerFacts:
        async with self._client(timeout=max(self.probe_timeout, 10.0)) as client:
            return await gather_facts(client, self.url, self._command_facts(), log=self.read_log())


def _success(resp: httpx.Response) -> bool:
    try:
        return bool(resp.json().get("success", True))
    except (ValueError, AttributeError):
        return True  # 200 with no JSON body: older servers
