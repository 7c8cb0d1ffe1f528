"""The library entry points: replay, check and bisect a trace from Python.

Everything here returns typed results and raises only
:class:`~replayer.errors.ReplayerError` subclasses, worded in parameter
names; a crashing server is a *result* (``result.failed``), never an
exception. Each coroutine has a ``*_sync`` twin for scripts without an event
loop. The CLI's ``replay``, ``check`` and ``bisect`` are thin layers over
these functions.

These live in ``replayer.api`` (``from replayer import api``) rather than as
``replayer.replay()``: ``replayer.replay`` is the replay *package*, and a
function of that name would shadow it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer.bisect.oracle import Outcome
from replayer.bisect.pipeline import BisectOptions
from replayer.bisect.runner import FunctionRunner, Observation, Runner, Trial
from replayer.errors import OptionError, UsageError
from replayer.monitor.classify import FailureClass
from replayer.monitor.signature import Signature
from replayer.monitor.watch import WatchConfig
from replayer.options import Selection, reset_mode
from replayer.replay.client import Endpoint
from replayer.replay.policy import ReplayPolicy
from replayer.trace.reader import Trace

if TYPE_CHECKING:
    from replayer.bisect.pipeline import BisectResult
    from replayer.replay.run import RunOutcome
    from replayer.target.base import ServerTarget
    from replayer.telemetry import LiveMetrics

__all__ = [
    "DEFAULT_WATCH",
    "CheckResult",
    "Endpoint",
    "EndpointResult",
    "FailureInfo",
    "OracleFunction",
    "ReplayResult",
    "RunPaths",
    "RunStatus",
    "Server",
    "bisect",
    "bisect_sync",
    "check",
    "check_sync",
    "open_trace",
    "replay",
    "replay_sync",
]

DEFAULT_WATCH = WatchConfig()
"""The monitor's defaults: health every second, 60 s stall watchdog, 10 s settle."""

EndpointLike = Endpoint | str
"""An :class:`Endpoint`, or a URL (``http://host:port``; named ``target``)."""


def open_trace(path: str | os.PathLike[str]) -> Trace:
    """Open a replayer trace (Arrow IPC) for reading; older versions migrate."""
    return Trace.open(path)


# -- results ---------------------------------------------------------------------------


class RunStatus(StrEnum):
    """How a replay ended, as a whole (the CLI's exit codes 0, 1, 3, 4)."""

    SURVIVED = "survived"
    """Every endpoint answered the whole selection."""
    FAILED = "failed"
    """At least one endpoint failed (crashed, hung, died)."""
    UNREACHABLE = "unreachable"
    """An endpoint could not be reached before the first request."""
    NOT_EXERCISED = "not_exercised"
    """Most requests were rejected as client errors: nothing was shown."""


_STATUS_BY_CODE = {0: RunStatus.SURVIVED, 1: RunStatus.FAILED, 3: RunStatus.UNREACHABLE}


@dataclass(frozen=True)
class FailureInfo:
    """Why an endpoint was declared failed, classified."""

    failure_class: FailureClass | None
    """None only when the monitor was off (``watch=None``)."""
    kind: str
    """What the replay client saw first (``stream_error``, ``http_5xx`` ...)."""
    message: str
    at_s: float
    """Seconds after the replay's T0."""
    request_id: str | None
    in_flight: tuple[str, ...]
    signature: Signature | None = None

    @classmethod
    def from_summary(cls, f: Mapping[str, Any], sig: Signature | None) -> FailureInfo:
        klass = f.get("class")
        return cls(
            failure_class=_klass(klass),
            kind=str(f.get("kind")),
            message=str(f.get("message") or ""),
            at_s=float(f.get("at_s") or 0.0),
            request_id=f.get("request_id"),
            in_flight=tuple(f.get("inflight") or ()),
            signature=sig,
        )


def _klass(value: object) -> FailureClass | None:
    try:
        return FailureClass(str(value))
    except ValueError:
        return None


@dataclass(frozen=True)
class EndpointResult:
    """One endpoint's side of a replay."""

    name: str
    url: str
    requests: int
    sent: int
    status_counts: Mapping[str, int]
    """Requests by final status (``ok``, ``error``, ``not_sent`` ...)."""
    client_errors: int
    exercised: bool
    failure: FailureInfo | None
    summary: Mapping[str, Any] = field(repr=False)
    """The whole per-target summary (latencies, cached tokens ...), as in summary.json."""

    @property
    def failed(self) -> bool:
        return self.failure is not None


@dataclass(frozen=True)
class RunPaths:
    """Where a replay wrote what it measured."""

    out: Path

    @property
    def run_json(self) -> Path:
        return self.out / "run.json"

    @property
    def results(self) -> Path:
        return self.out / "results.arrow"

    @property
    def summary(self) -> Path:
        return self.out / "summary.json"

    @property
    def metrics(self) -> Path:
        return self.out / "metrics.arrow"

    @property
    def server_log(self) -> Path:
        return self.out / "server.log"

    @property
    def signature(self) -> Path:
        return self.out / "signature.json"


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did, per endpoint, and where it is on disk."""

    status: RunStatus
    exit_code: int
    """The CLI's exit code for this result."""
    endpoints: Mapping[str, EndpointResult]
    paths: RunPaths
    unreachable: str | None = None

    @property
    def failed(self) -> bool:
        return self.status is RunStatus.FAILED

    @property
    def failure(self) -> FailureInfo | None:
        """The first failed endpoint's failure (most replays have one endpoint)."""
        return next((e.failure for e in self.endpoints.values() if e.failure), None)


def _result(outcome: RunOutcome, signature: Signature | None = None) -> ReplayResult:
    s = outcome.summary
    runs = outcome.replay.runs if outcome.replay else {}
    urls = {name: run.target.url for name, run in runs.items()}
    eps = {}
    for name, t in s.get("targets", {}).items():
        f = t.get("failure")
        eps[name] = EndpointResult(
            name=name,
            url=urls.get(name, ""),
            requests=t["requests"],
            sent=t["sent"],
            status_counts=dict(t["status"]),
            client_errors=t["client_errors"],
            exercised=t["exercised"],
            failure=FailureInfo.from_summary(f, signature) if f else None,
            summary=t,
        )
    status = _STATUS_BY_CODE.get(outcome.exit_code, RunStatus.NOT_EXERCISED)
    return ReplayResult(status, outcome.exit_code, eps, RunPaths(outcome.out), s.get("unreachable"))


# -- replay ----------------------------------------------------------------------------


def _trace(trace: Trace | str | os.PathLike[str]) -> Trace:
    return trace if isinstance(trace, Trace) else Trace.open(trace)


def _rows(trace: Trace, selection: Selection | None) -> list[int]:
    from replayer.replay.plan import select

    sel = selection or Selection()
    rows = select(trace, limit=sel.limit, sessions=sel.sessions, requests=sel.requests)
    if not rows:
        raise OptionError("selection", "is empty: nothing to replay")
    trace.verify(rows)  # nothing is sent before the selection reads
    return rows


def _endpoints(endpoints: EndpointLike | Sequence[EndpointLike]) -> list[Endpoint]:
    items = [endpoints] if isinstance(endpoints, Endpoint | str) else list(endpoints)
    if not items:
        raise OptionError("endpoints", "is empty: give at least one URL or Endpoint")
    out: list[Endpoint] = []
    for i, e in enumerate(items):
        if isinstance(e, str):
            name = "target" if len(items) == 1 else f"target{i}"
            e = Endpoint(name=name, url=e.rstrip("/"))
        if not e.url.startswith(("http://", "https://")):
            raise OptionError("endpoints", f"{e.url!r}: the URL must start with http(s)://")
        if any(o.name == e.name for o in out):
            raise OptionError("endpoints", f"two are named {e.name!r}")
        out.append(e)
    return out


async def replay(
    trace: Trace | str | os.PathLike[str],
    endpoints: EndpointLike | Sequence[EndpointLike],
    policy: ReplayPolicy | None = None,
    *,
    selection: Selection | None = None,
    out: str | os.PathLike[str] | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    force: bool = False,
    progress: bool = False,
    live: LiveMetrics | None = None,
) -> ReplayResult:
    """Replay ``trace`` against ``endpoints`` side by side, into a run directory.

    ``out`` defaults to ``runs/<timestamp>``; a non-empty one is refused
    unless ``force``. ``watch=None`` turns the monitor off (no health polls,
    no hang watchdog, failures unclassified)."""
    from replayer.replay.run import prepare_out, replay_to_dir

    t = _trace(trace)
    rows = _rows(t, selection)
    eps = _endpoints(endpoints)
    run_dir = prepare_out(Path(out) if out is not None else None, force)
    outcome = await replay_to_dir(
        t,
        rows,
        policy or ReplayPolicy(),
        eps,
        run_dir,
        command=["replayer.api.replay"],
        selection=(selection or Selection()).to_dict(),
        progress=progress,
        watch=watch,
        live=live,
    )
    return _result(outcome)


def replay_sync(*args: Any, **kwargs: Any) -> ReplayResult:
    """:func:`replay` for code without an event loop (same arguments)."""
    return asyncio.run(replay(*args, **kwargs))


# -- one server, restarted: check and bisect -------------------------------------------


@dataclass(frozen=True)
class Server:
    """A server replayer may start, restart and read the log of.

    Give ``launch`` (a command; replayer starts it in its own process group
    and keeps its log), or ``restart_cmd`` with ``url`` (someone else runs
    it), or ``url`` alone (it cannot be restarted: one trial only)."""

    launch: str | Sequence[str] | None = None
    url: str | None = None
    restart_cmd: str | None = None
    log_cmd: str | None = None
    ready_timeout: float = 1800.0
    reset: str = "restart"
    """Between passing trials: ``restart``, ``prefix-cache`` (vLLM dev mode) or ``none``."""
    api_key: str | None = field(default=None, repr=False)
    env: Mapping[str, str] | None = field(default=None, repr=False)
    """Extra environment for a launched server."""

    def __post_init__(self) -> None:
        if self.launch is None and self.url is None:
            raise OptionError("server", "needs launch or url")
        if self.launch is not None and self.restart_cmd is not None:
            raise OptionError("launch", "and restart_cmd are exclusive: give one")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise OptionError("url", f"{self.url!r}: must start with http:// or https://")
        if not self.ready_timeout > 0:
            raise OptionError("ready_timeout", "must be positive")
        reset_mode(self.reset)

    def target(
        self, log_path: Path, model: str | None, marks: Mapping[str, str] | None = None
    ) -> ServerTarget:
        from replayer.target.factory import make_target

        return make_target(
            launch=self.launch,
            restart_cmd=self.restart_cmd,
            url=self.url,
            log_cmd=self.log_cmd,
            log_path=log_path,
            env=self.env,
            marks=marks,
            model=model,
            api_key=self.api_key,
            ready_timeout=self.ready_timeout,
        )


@dataclass(frozen=True)
class CheckResult:
    """One trial: did the trace show the chased failure?"""

    outcome: Outcome
    """``PASS``, ``MATCH`` (the chased failure), ``OTHER_FAILURE``, ``INVALID``
    (client errors the full trace did not have) or ``INFRA`` (no server)."""
    failure_class: FailureClass | None
    signature: Signature | None
    message: str | None
    run: ReplayResult | None
    """None when the server never came up (``INFRA``)."""
    unexercised: str | None = None
    """Most requests were rejected: this run shows nothing either way."""


async def check(
    trace: Trace | str | os.PathLike[str],
    server: Server,
    policy: ReplayPolicy | None = None,
    *,
    selection: Selection | None = None,
    out: str | os.PathLike[str] | None = None,
    watch: WatchConfig = DEFAULT_WATCH,
    signature: str | None = None,
    expect_signature: str | None = None,
    keep_running: bool = False,
    force: bool = False,
    progress: bool = False,
) -> CheckResult:
    """Start (or reuse) the server, replay, classify: one bisect trial.

    The chased failure is any crash, or the crashes whose signature text
    matches the regex ``signature``, or the one with hash ``expect_signature``."""
    from replayer.bisect.trial import Chase, TrialEnv
    from replayer.monitor.signature import compile_signature_regex
    from replayer.replay.run import prepare_out

    if watch is None:
        raise OptionError("watch", "is required: check classifies failures")
    t = _trace(trace)
    rows = _rows(t, selection)
    pol = policy or ReplayPolicy()
    run_dir = prepare_out(Path(out) if out is not None else None, force)
    target = server.target(run_dir / "server.log", t.model_of(rows, pol.model))
    env = TrialEnv(
        trace=t,
        policy=pol,
        target=target,
        watch=watch,
        reset=reset_mode(server.reset),
        api_key=server.api_key,
        chase=Chase(
            regex=compile_signature_regex(signature) if signature else None,
            signature=expect_signature,
        ),
    )
    try:
        res = await env.run(rows, run_dir, progress=progress, command=["replayer.api.check"])
    finally:
        if not keep_running:
            await target.stop()
    klass = res.failure_class
    return CheckResult(
        outcome=res.outcome,
        failure_class=_klass(klass),
        signature=res.signature,
        message=res.message,
        run=_result(res.run, res.signature) if res.run is not None else None,
        unexercised=res.unexercised,
    )


def check_sync(*args: Any, **kwargs: Any) -> CheckResult:
    """:func:`check` for code without an event loop (same arguments)."""
    return asyncio.run(check(*args, **kwargs))


def _bisect_dir(d: Path, resume: bool) -> Path:
    """A new or empty directory, or one holding the journal to resume."""
    if d.exists() and any(d.iterdir()) and not resume:
        raise UsageError(f"{d} exists and is not empty: resume it, or pick another out")
    if resume and not (d / "journal.jsonl").exists():
        raise UsageError(f"resume: {d} holds no journal.jsonl")
    d.mkdir(parents=True, exist_ok=True)
    return d


OracleFunction = Callable[[Trial], Outcome | Observation | Awaitable[Outcome | Observation]]
"""A plain function (or coroutine function) of one trial: your own oracle."""


async def bisect(
    trace: Trace | str | os.PathLike[str],
    server: Server | Runner | OracleFunction,
    out: str | os.PathLike[str],
    options: BisectOptions | None = None,
    *,
    policy: ReplayPolicy | None = None,
    selection: Selection | None = None,
    watch: WatchConfig = DEFAULT_WATCH,
    signature: str | None = None,
    control: Server | Runner | None = None,
    resume: bool = False,
    live: LiveMetrics | None = None,
    say: Callable[[str], None] | None = None,
) -> BisectResult:
    """Minimize ``trace`` to the smallest set of requests that still crashes.

    ``server`` is a :class:`Server` (launched, restarted after every crash
    and replayed against), or your own oracle: a
    :class:`~replayer.bisect.runner.Runner` or a plain function of a
    :class:`Trial` returning an :class:`Outcome` or :class:`Observation`
    (a kernel unit test on the trial's bodies, a simulator; no server).
    The chased failure is the first crash, or the ones whose signature text
    matches the regex ``signature``. ``control`` runs clean
    (the other platform): the final repro is replayed there too. The bundle
    goes to ``out/bundle``; ``resume`` continues a stopped bisect in ``out``
    without repeating a journaled trial."""
    from replayer.bisect.pipeline import Bisect, Control, run_bisect
    from replayer.bisect.trial import OWNER_ENV, Chase, TrialEnv, owner_token, reap_orphan
    from replayer.monitor.signature import compile_signature_regex

    if watch is None:
        raise OptionError("watch", "is required: bisect classifies every trial")
    t = _trace(trace)
    rows = _rows(t, selection)
    pol = policy or ReplayPolicy()
    d = _bisect_dir(Path(out), resume)
    model = t.model_of(rows, pol.model)
    chase = Chase(regex=compile_signature_regex(signature) if signature else None)

    def env_for(s: Server, name: str, log: str, marks: Mapping[str, str] | None) -> TrialEnv:
        return TrialEnv(
            trace=t,
            policy=pol,
            target=s.target(d / log, model, marks=marks),
            watch=watch,
            reset=reset_mode(s.reset),
            api_key=s.api_key,
            name=name,
            chase=chase if name == "target" else Chase(),
            pidfile=d / "server.pid" if name == "target" else None,
            live=live,
        )

    runner: Runner | TrialEnv
    facts: dict[str, Any] = {}
    env = None
    if not isinstance(server, Server):
        runner = server if hasattr(server, "run") else FunctionRunner(server)
    else:
        # launched servers carry this bisect's mark so a resume can reap one a kill orphaned
        env = runner = env_for(server, "target", "server.log", {OWNER_ENV: owner_token(d)})
        if resume and reap_orphan(d / "server.pid") and say is not None:
            say("bisect: stopped the server a killed bisect left running")
        facts = {"launch": server.launch, "restart_cmd": server.restart_cmd, "url": env.target.url}
    ctl = None
    if control is not None:
        ctl = Control(
            "control",
            env_for(control, "control", "control-server.log", None)
            if isinstance(control, Server)
            else control,
        )
    b = Bisect(
        t, rows, runner, d, options, control=ctl, policy=pol, chase=chase, facts=facts, say=say
    )
    if live is not None:
        live.attach_bisect(b)
    if env is not None:
        try:
            await env.prepare()
            got = await env.target.facts()
            facts.update({k: v for k, v in got.to_dict().items() if v})
        except Exception as exc:  # facts are a courtesy; the trials report real failures
            facts["facts_error"] = str(exc)[:300]
    return await run_bisect(b)


def bisect_sync(*args: Any, **kwargs: Any) -> BisectResult:
    """:func:`bisect` for code without an event loop (same arguments)."""
    return asyncio.run(bisect(*args, **kwargs))
