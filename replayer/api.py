"""The one front door: every verb of replayer as a function of typed options.

The command line, ``replayer demo`` and the job service only parse, call
one of these, and print; so a job typed in a shell, submitted to the
service or scripted from Python runs the same code with the same defaults.
Each verb builds a :class:`~replayer.session.Session` (the trace, its
selection, the policy, the servers, the chase) once and runs over it.

Everything here returns typed results and raises only
:class:`~replayer.errors.ReplayerError` subclasses, worded in parameter
names; a crashing server is a *result* (``result.failed``), never an
exception. Each coroutine has a ``*_sync`` twin for scripts without an event
loop.

These live in ``replayer.api`` (``from replayer import api``) rather than as
``replayer.replay()``: ``replayer.replay`` is the replay *package*, and a
function of that name would shadow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer.errors import OptionError, UsageError
from replayer.monitor.classify import FailureClass
from replayer.monitor.signature import Signature
from replayer.options import (
    BisectOptions,
    CompareOptions,
    Convention,
    MetricsOptions,
    RecordOptions,
    ReplayPolicy,
    Selection,
    ServeOptions,
    Server,
    SynthOptions,
    WatchConfig,
)
from replayer.options.server import Endpoint
from replayer.session import Chase, NotExercised, Outcome, Session, open_trace, reap_orphan
from replayer.session.verdict import TrialResult
from replayer.trace.reader import Trace

if TYPE_CHECKING:
    from replayer.bisect.pipeline import BisectResult
    from replayer.bisect.runner import Observation, Runner, Trial
    from replayer.bisect.vary import VaryPlan
    from replayer.replay.run import RunOutcome
    from replayer.telemetry import LiveMetrics

__all__ = [
    "DEFAULT_WATCH",
    "CheckResult",
    "Endpoint",
    "EndpointResult",
    "FailureInfo",
    "OracleFunction",
    "RateResult",
    "ReplayResult",
    "RunPaths",
    "RunStatus",
    "Server",
    "bisect",
    "bisect_sync",
    "check",
    "check_sync",
    "compare",
    "convert",
    "emulate",
    "export",
    "import_trace",
    "inspect",
    "merge",
    "open_trace",
    "record",
    "replay",
    "replay_sync",
    "report",
    "serve",
    "soak",
    "soak_sync",
    "sweep",
    "sweep_sync",
    "synth",
    "vary",
    "vary_sync",
    "verify_bundle",
    "verify_bundle_sync",
]

DEFAULT_WATCH = WatchConfig()
"""The monitor's defaults: health every second, 60 s stall watchdog, 10 s settle."""

EndpointLike = Endpoint | str
"""An :class:`Endpoint`, or a URL (``http://host:port``; named ``target``)."""

TraceLike = Trace | str | os.PathLike[str]

Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
        return cls(
            failure_class=_klass(f.get("class")),
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
    summary: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """The whole ``summary.json``."""

    @property
    def failed(self) -> bool:
        return self.status is RunStatus.FAILED

    @property
    def failure(self) -> FailureInfo | None:
        """The first failed endpoint's failure (most replays have one endpoint)."""
        return next((e.failure for e in self.endpoints.values() if e.failure), None)

    def results(self) -> list[dict[str, Any]]:
        """Every request's result (``results.arrow``), one dict each, in row order."""
        from replayer.replay.results import read_results

        return read_results(self.paths.results)

    @property
    def unexercised(self) -> str | None:
        """Why the run exercised nothing (most requests rejected), or None."""
        from replayer.replay.summary import unexercised_text

        return unexercised_text(dict(self.summary)) or None


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
    return ReplayResult(
        status, outcome.exit_code, eps, RunPaths(outcome.out), s.get("unreachable"), s
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
    out: Path | None = None

    @classmethod
    def of(cls, res: TrialResult, out: Path | None = None) -> CheckResult:
        return cls(
            outcome=res.outcome,
            failure_class=_klass(res.failure_class),
            signature=res.signature,
            message=res.message,
            run=_result(res.run, res.signature) if res.run is not None else None,
            unexercised=res.unexercised,
            out=out,
        )

    def exit_code(self, convention: Convention = Convention.BISECT, also: int | None = None) -> int:
        """``check``'s exit code under ``convention`` (see :mod:`replayer.cli.check`)."""
        if self.unexercised:
            # not "no failure": git bisect must not call this commit good, nor a
            # reducer keep going on a trace the server never ran
            return 128 if convention is Convention.BISECT else 1
        o = self.outcome
        if convention is Convention.BISECT:
            return {Outcome.PASS: 0, Outcome.MATCH: 1}.get(o, 125)
        if o is Outcome.MATCH:
            return 0
        if o is Outcome.OTHER_FAILURE and also is not None:
            return also
        return 1


@dataclass(frozen=True)
class RateResult:
    """N runs of one selection (``soak``, ``bundle verify``): how often it crashed."""

    runs: tuple[CheckResult, ...]
    out: Path
    policy: ReplayPolicy
    """The policy every run replayed under (a bundle's: the one its bisect found)."""
    unexercised: str | None = None
    """A run exercised nothing: the rest were not run, nothing is counted."""
    variants: Mapping[str, Any] | None = None
    """``--vary``'s report (``bundle verify``), the runs above its control row."""

    @property
    def counted(self) -> list[CheckResult]:
        """The runs that reached a verdict (the server came up)."""
        return [r for r in self.runs if r.outcome is not Outcome.INFRA]

    @property
    def matched(self) -> int:
        return sum(r.outcome is Outcome.MATCH for r in self.counted)

    @property
    def crashed(self) -> list[CheckResult]:
        return [r for r in self.counted if r.outcome in (Outcome.MATCH, Outcome.OTHER_FAILURE)]

    @property
    def other(self) -> int:
        return sum(r.outcome is Outcome.OTHER_FAILURE for r in self.counted)

    @property
    def infra(self) -> int:
        return len(self.runs) - len(self.counted)


# -- shared pieces ----------------------------------------------------------------------


def _endpoints(endpoints: EndpointLike | Sequence[EndpointLike]) -> list[Endpoint]:
    items = [endpoints] if isinstance(endpoints, Endpoint | str) else list(endpoints)
    if not items:
        raise OptionError("endpoints", "is empty: give at least one URL or Endpoint")
    out: list[Endpoint] = []
    for i, e in enumerate(items):
        if isinstance(e, str):
            name = "target" if len(items) == 1 else f"target{i}"
            e = Endpoint(name=name, url=e)
        if any(o.name == e.name for o in out):
            raise OptionError("endpoints", f"two are named {e.name!r}")
        out.append(e)
    return out


def _watch(watch: WatchConfig | None, verb: str) -> WatchConfig:
    if watch is None or not watch.enabled:
        raise UsageError(
            f"{verb} classifies every run: it needs the monitor (watch=None and --no-monitor "
            "turn it off)"
        )
    return watch


def _run_dir(out: str | os.PathLike[str] | None, force: bool) -> Path:
    from replayer.replay.run import prepare_out

    return prepare_out(Path(out) if out is not None else None, force)


def _new_dir(d: Path) -> Path:
    """``d``, made, new or empty."""
    if d.exists() and any(d.iterdir()):
        raise UsageError(f"{d} exists and is not empty: pick another out")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _stamped(base: Path, prefix: str) -> Path:
    return base / f"{prefix}-{_dt.datetime.now():%Y%m%d-%H%M%S}"


@contextlib.contextmanager
def _metrics(
    metrics: MetricsOptions | None, live: LiveMetrics | None, say: Say
) -> Iterator[LiveMetrics | None]:
    """``live``, or the live metrics ``metrics`` asks to serve (stopped after)."""
    if metrics is None or metrics.metrics_port is None or live is not None:
        yield live
        return
    from replayer.telemetry import LiveMetrics

    mine = LiveMetrics()
    try:
        server = mine.serve(metrics.metrics_port, metrics.metrics_host)
    except OSError as exc:
        raise OptionError(
            "metrics_port",
            f"cannot serve metrics on {metrics.metrics_host}:{metrics.metrics_port}: "
            f"{exc.strerror}",
        ) from None
    say(f"replayer: metrics on {server.url}")
    try:
        yield mine
    finally:
        server.close()


# -- replay ----------------------------------------------------------------------------


async def replay(
    trace: TraceLike,
    endpoints: EndpointLike | Sequence[EndpointLike] | None = None,
    policy: ReplayPolicy | None = None,
    *,
    server: Server | None = None,
    selection: Selection | None = None,
    out: str | os.PathLike[str] | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    force: bool = False,
    progress: bool = False,
    live: LiveMetrics | None = None,
    metrics: MetricsOptions | None = None,
    command: Sequence[str] | None = None,
    say: Say = _stderr,
) -> ReplayResult:
    """Replay ``trace`` against ``endpoints`` side by side, into a run directory,
    or against a ``server`` replayer launches, watches, signs and stops.

    ``out`` defaults to ``runs/<timestamp>``; a non-empty one is refused
    unless ``force``. ``watch=None`` turns the monitor off (no health polls,
    no hang watchdog, failures unclassified)."""
    if server is None and endpoints is None:
        raise OptionError("endpoints", "or server: give one (a server replayer launches)")
    t = open_trace(trace)
    cmd = list(command) if command is not None else ["replayer.api.replay"]
    if server is not None:
        eps = _endpoints(endpoints) if endpoints is not None else []
        if len(eps) > 1:
            raise OptionError("server", "is one launched server: name it with one endpoint at most")
        name = eps[0].name if eps else "target"
        if eps:
            server = replace(server, url=eps[0].url, api_key=server.api_key or eps[0].api_key)
        return await _replay_launched(
            t, server, name, policy, selection, out, watch, force, progress, live, metrics, cmd,
            say,
        )  # fmt: skip
    assert endpoints is not None
    eps = _endpoints(endpoints)
    session = Session.open(t, selection=selection, policy=policy, watch=watch, endpoints=eps)
    run_dir = _run_dir(out, force)
    with _metrics(metrics, live, say) as lm:
        session.live = lm
        outcome = await session.replay(run_dir, progress=progress, command=cmd)
    return _result(outcome)


async def _replay_launched(
    t: Trace,
    server: Server,
    name: str,
    policy: ReplayPolicy | None,
    selection: Selection | None,
    out: str | os.PathLike[str] | None,
    watch: WatchConfig | None,
    force: bool,
    progress: bool,
    live: LiveMetrics | None,
    metrics: MetricsOptions | None,
    command: list[str],
    say: Say,
) -> ReplayResult:
    """``--launch``: the one target is a server we start, watch and stop."""
    import orjson

    if server.launch is None:
        raise OptionError("server", "of a replay is one replayer launches (give launch)")
    w = _watch(watch, "a launched replay")
    run_dir = _run_dir(out, force)
    session = Session.open(
        t, selection=selection, policy=policy, watch=w, server=server, logs=run_dir, name=name
    )
    with _metrics(metrics, live, say) as lm:
        session.live = lm
        async with session:
            res = await session.trial(run_dir, progress=progress, command=command)
    if res.run is None:
        return ReplayResult(
            RunStatus.UNREACHABLE, 3, {}, RunPaths(run_dir), f"the server did not come up: "
            f"{res.message}"
        )  # fmt: skip
    summary = res.run.summary
    if res.signature is not None:
        summary["targets"][name]["failure"]["signature"] = res.signature.to_dict()
        (run_dir / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return _result(res.run, res.signature)


def replay_sync(*args: Any, **kwargs: Any) -> ReplayResult:
    """:func:`replay` for code without an event loop (same arguments)."""
    return asyncio.run(replay(*args, **kwargs))


# -- one server, restarted: check, soak, verify ----------------------------------------


async def check(
    trace: TraceLike,
    server: Server,
    policy: ReplayPolicy | None = None,
    *,
    selection: Selection | None = None,
    out: str | os.PathLike[str] | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    signature: str | None = None,
    expect_signature: str | None = None,
    keep_running: bool = False,
    force: bool = False,
    progress: bool = False,
    command: Sequence[str] | None = None,
) -> CheckResult:
    """Start (or reuse) the server, replay, classify: one bisect trial.

    The chased failure is any crash, or the crashes whose signature text
    matches the regex ``signature``, or the one with hash ``expect_signature``."""
    w = _watch(watch, "check")
    run_dir = _run_dir(out, force)
    if keep_running:
        server = replace(server, keep_running=True)
    session = Session.open(
        trace,
        selection=selection,
        policy=policy,
        watch=w,
        server=server,
        logs=run_dir,
        chase=Chase.of(signature, expect_signature),
    )
    async with session:
        res = await session.trial(
            run_dir, progress=progress, command=list(command or ["replayer.api.check"])
        )
    return CheckResult.of(res, run_dir)


def check_sync(*args: Any, **kwargs: Any) -> CheckResult:
    """:func:`check` for code without an event loop (same arguments)."""
    return asyncio.run(check(*args, **kwargs))


async def _rate(session: Session, n: int, out: Path, label: str) -> RateResult:
    try:
        results = await session.runs(n, out, label=label)
    except NotExercised as exc:
        return RateResult((), out, session.policy, unexercised=str(exc))
    return RateResult(tuple(CheckResult.of(r, out) for r in results), out, session.policy)


async def soak(
    trace: TraceLike,
    server: Server,
    policy: ReplayPolicy | None = None,
    *,
    runs: int = 20,
    selection: Selection | None = None,
    out: str | os.PathLike[str] | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    say: Say = _stderr,
) -> RateResult:
    """Verify a fix: ``runs`` runs of a trace, none of which should crash (the
    95% upper bound on the crash rate of ``runs`` clean runs is 1 - 0.05^(1/N))."""
    if runs < 1:
        raise OptionError("runs", "must be at least 1")
    w = _watch(watch, "soak")
    d = _run_dir(out if out is not None else _stamped(Path("runs"), "soak"), False)
    session = Session.open(
        trace, selection=selection, policy=policy, watch=w, server=server, logs=d, say=say
    )
    return await _rate(session, runs, d, "soak")


def soak_sync(*args: Any, **kwargs: Any) -> RateResult:
    """:func:`soak` for code without an event loop (same arguments)."""
    return asyncio.run(soak(*args, **kwargs))


async def verify_bundle(
    bundle: str | os.PathLike[str],
    server: Server,
    *,
    runs: int = 10,
    out: str | os.PathLike[str] | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    vary: Sequence[str] = (),
    vary_runs: int | None = None,
    say: Say = _stderr,
) -> RateResult:
    """Replay a repro bundle ``runs`` times, under exactly the policy its bisect
    found it with, and count how often its crash (its signature) came back.

    ``vary``: then relaunch the server with each variant (``--vary``) and
    replay the bundle ``vary_runs`` times on each; the runs above are the
    control row (written to ``OUT/variants.json``)."""
    if runs < 1:
        raise OptionError("runs", "must be at least 1")
    w = _watch(watch, "bundle verify")
    plan = _vary_plan(vary, vary_runs, server)
    session, o = _bundle_session(Path(bundle), server, out, "verify", w, say)
    got = await _rate(session, runs, o, "run")
    if plan is None or got.unexercised or not got.counted:
        return got
    from replayer.bisect.vary import run_plan, write_report

    report = await run_plan(
        plan,
        session.rows,
        o / "variants",
        session,
        policy=session.policy,
        chase=session.chase,
        key="bundle",
        control=(got.matched, len(got.counted), "verify"),
        say=say,
    )
    write_report(o, report)
    return replace(got, variants=report)


def verify_bundle_sync(*args: Any, **kwargs: Any) -> RateResult:
    """:func:`verify_bundle` for code without an event loop (same arguments)."""
    return asyncio.run(verify_bundle(*args, **kwargs))


def _bundle_session(
    d: Path,
    server: Server,
    out: str | os.PathLike[str] | None,
    prefix: str,
    watch: WatchConfig,
    say: Say,
) -> tuple[Session, Path]:
    """A session over a bundle's trace, under exactly the policy its bisect
    found it with, chasing its crash; and the new directory for its runs."""
    from replayer.bundle.files import read_manifest

    manifest = read_manifest(d)
    o = _run_dir(out if out is not None else _stamped(d, prefix), False)
    session = Session.open(
        d / "trace.arrow",
        policy=manifest.policy,
        watch=watch,
        server=server,
        logs=o,
        chase=manifest.chase(),
        say=say,
    )
    return session, o


def _vary_plan(sources: Sequence[str], runs: int | None, server: Server) -> VaryPlan | None:
    """The variants ``sources`` ask for, applied to the server's launch (None
    without any): bad files and launches fail here, before any run."""
    if not sources:
        if runs is not None:
            raise OptionError("vary_runs", "needs vary")
        return None
    if server.launch is None:
        raise OptionError(
            "vary",
            "relaunches the server with each variant: give launch (a server given by "
            "url or restart_cmd cannot be changed)",
        )
    from replayer.bisect.vary import DEFAULT_RUNS, make_plan

    return make_plan(sources, server.launch, DEFAULT_RUNS if runs is None else runs)


async def vary(
    bundle: str | os.PathLike[str],
    server: Server,
    sources: Sequence[str] = ("default",),
    *,
    runs: int | None = None,
    out: str | os.PathLike[str] | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    say: Say = _stderr,
) -> Mapping[str, Any]:
    """What makes a bundle's crash go away: relaunch ``server`` with each
    variant of ``sources`` (files, ``default`` or ``default:NAME,...``) and
    replay the bundle ``runs`` times (5) on each, the unmodified launch as
    the control row. The report is also written to ``OUT/variants.json``."""
    from replayer.bisect.vary import run_plan, write_report

    w = _watch(watch, "vary")
    plan = _vary_plan(sources, runs, server)
    assert plan is not None
    session, o = _bundle_session(Path(bundle), server, out, "vary", w, say)
    report = await run_plan(
        plan, session.rows, o, session, policy=session.policy, chase=session.chase,
        key="bundle", say=say,
    )  # fmt: skip
    write_report(o, report)
    return report


def vary_sync(*args: Any, **kwargs: Any) -> Mapping[str, Any]:
    """:func:`vary` for code without an event loop (same arguments)."""
    return asyncio.run(vary(*args, **kwargs))


# -- bisect ----------------------------------------------------------------------------


def _bisect_dir(d: Path, resume: bool) -> Path:
    """A new or empty directory, or one holding the journal to resume."""
    if d.exists() and any(d.iterdir()) and not resume:
        raise UsageError(f"{d} exists and is not empty: resume it, or pick another out")
    if resume and not (d / "journal.jsonl").exists():
        raise UsageError(f"resume: {d} holds no journal.jsonl")
    d.mkdir(parents=True, exist_ok=True)
    return d


OracleFunction = Callable[["Trial"], "Outcome | Observation | Awaitable[Outcome | Observation]"]
"""A plain function (or coroutine function) of one trial: your own oracle."""


@dataclass(frozen=True)
class FromRun:
    """What a failed run says to chase: its launch and its crash."""

    launch: str | None
    chase: Chase


def from_run(run: str | os.PathLike[str]) -> FromRun:
    """The launch command and crash signature of a failed run directory."""
    from replayer.replay.files import read_run

    info = read_run(Path(run))
    failed = info.failure
    if failed is None:
        raise OptionError("from_run", f"{run}: that run did not fail; nothing to chase")
    if info.signature is not None:
        chase = Chase.from_signature(info.signature)
    else:
        chase = Chase(failure_class=failed.get("class"))
    return FromRun(info.launch, chase)


async def bisect(
    trace: TraceLike,
    server: Server | Runner | OracleFunction | None,
    out: str | os.PathLike[str],
    options: BisectOptions | None = None,
    *,
    policy: ReplayPolicy | None = None,
    selection: Selection | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    signature: str | None = None,
    control: Server | Runner | None = None,
    control_name: str = "control",
    resume: bool = False,
    live: LiveMetrics | None = None,
    metrics: MetricsOptions | None = None,
    say: Say | None = None,
    vary: Sequence[str] = (),
    vary_runs: int | None = None,
    from_run: str | os.PathLike[str] | None = None,
) -> BisectResult:
    """Minimize ``trace`` to the smallest set of requests that still crashes.

    ``server`` is a :class:`Server` (launched, restarted after every crash
    and replayed against), or your own oracle: a
    :class:`~replayer.bisect.runner.Runner` or a plain function of a
    :class:`Trial` returning an :class:`Outcome` or :class:`Observation`
    (a kernel unit test on the trial's bodies, a simulator; no server).
    The chased failure is the first crash, or the ones whose signature text
    matches the regex ``signature``. ``control`` runs clean (the other
    platform): the final repro is replayed there too. ``vary`` relaunches the
    server with each variant once the repro is confirmed. ``from_run`` starts
    from a failed run directory: its launch command (when ``server`` is None)
    and its crash signature. The bundle goes to ``out/bundle``; ``resume``
    continues a stopped bisect in ``out`` without repeating a journaled trial."""
    from replayer.bisect.pipeline import Bisect, Control, run_bisect
    from replayer.bisect.runner import FunctionRunner, SessionRunner
    from replayer.bisect.vary import bisect_hook

    w = _watch(watch, "bisect")
    chase = Chase.of(signature)
    if from_run is not None:
        seed = globals()["from_run"](from_run)
        if server is None and seed.launch:
            server = Server(launch=seed.launch)
        if chase.regex is None:
            chase = seed.chase
    if server is None or (isinstance(server, Server) and not server.restartable):
        raise OptionError(
            "launch",
            "or restart_cmd with url is required: bisect restarts the server after every "
            "crash" + (" (or from_run a run made with launch)" if server is None else ""),
        )
    plan = _vary_plan(vary, vary_runs, server) if isinstance(server, Server) else None
    if plan is None and vary:
        raise OptionError("vary", "relaunches a server: give a Server with launch")
    d = _bisect_dir(Path(out), resume)
    say = say or _stderr
    is_server = isinstance(server, Server)
    session = Session.open(
        trace,
        selection=selection,
        policy=policy,
        watch=w,
        server=server if isinstance(server, Server) else None,
        control=control if isinstance(control, Server) else None,
        control_name=control_name,
        logs=d,
        chase=chase,
        say=say,
        owner=d if is_server else None,
    )
    runner: Runner
    if isinstance(server, Server):
        runner = SessionRunner(session)
        if resume and reap_orphan(d / "server.pid"):
            say("bisect: stopped the server a killed bisect left running")
    else:
        runner = server if hasattr(server, "run") else FunctionRunner(server)
    ctl = None
    if session.control is not None:
        ctl = Control(control_name, SessionRunner(session, session.control))
    elif control is not None and not isinstance(control, Server):
        ctl = Control(control_name, control)
    with _metrics(metrics, live, say) as lm:
        session.live = lm
        b = Bisect(
            session.trace,
            session.rows,
            runner,
            d,
            options,
            control=ctl,
            policy=session.policy,
            chase=chase,
            facts=session.facts,
            say=say,
            vary=bisect_hook(plan, session) if plan is not None else None,
        )
        if lm is not None:
            lm.attach_bisect(b)
        if is_server:
            await session.gather_facts()
        return await run_bisect(b)


def bisect_sync(*args: Any, **kwargs: Any) -> BisectResult:
    """:func:`bisect` for code without an event loop (same arguments)."""
    return asyncio.run(bisect(*args, **kwargs))


# -- several runs compared -------------------------------------------------------------


async def sweep(
    trace: TraceLike,
    endpoints: EndpointLike | Sequence[EndpointLike],
    limits: Sequence[int],
    out: str | os.PathLike[str],
    policy: ReplayPolicy | None = None,
    *,
    selection: Selection | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    options: CompareOptions | None = None,
    progress: bool = False,
    command: Sequence[str] | None = None,
    say: Say = _stderr,
) -> dict[str, Any]:
    """One replay per ``max_inflight`` limit (``OUT/inflight-N``), compared
    against the first (``OUT/compare.json``)."""
    from replayer.analysis.sweep import sweep as run_sweep
    from replayer.options import SweepOptions

    values = SweepOptions(limits=tuple(limits)).limits
    assert values is not None
    session = Session.open(
        trace, selection=selection, policy=policy, watch=watch, endpoints=_endpoints(endpoints)
    )
    d = _new_dir(Path(out))
    return await run_sweep(
        session, values, d, progress=progress, command=list(command or ["replayer.api.sweep"]),
        opts=options, say=say,
    )  # fmt: skip


def sweep_sync(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`sweep` for code without an event loop (same arguments)."""
    return asyncio.run(sweep(*args, **kwargs))


def compare(
    runs: Sequence[str | os.PathLike[str]],
    *,
    baseline: str | None = None,
    options: CompareOptions | None = None,
) -> dict[str, Any]:
    """Targets of a run, or runs (A/B), side by side with bootstrap confidence
    intervals on the latency percentiles and output divergence."""
    from replayer.analysis.compare import compare_runs

    paths = [Path(r) for r in runs]
    for r in paths:
        if not r.is_dir():
            raise UsageError(f"{r}: no such directory")
    return compare_runs(paths, baseline=baseline, opts=options)


def report(
    run: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    force: bool = False,
) -> Path:
    """One self-contained HTML report (offline) of a run, bisect or bundle
    directory; ``output`` defaults to ``RUN/report.html`` (rewritten)."""
    from replayer.analysis.report import write_report

    d = Path(run)
    if not d.is_dir():
        raise UsageError(f"{d}: no such directory")
    path = Path(output) if output is not None else d / "report.html"
    return write_report(d, path, force=force or output is None)


# -- traces ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """A trace (or export) written: where, and how many requests."""

    path: Path
    requests: int
    details: Mapping[str, Any] = field(default_factory=dict)


def inspect(
    trace: TraceLike,
    *,
    selection: Selection | None = None,
    verify: bool = False,
    prefix_cache: int | None = None,
) -> dict[str, Any]:
    """Sessions, turns, context lengths, duration and sizes of a trace (every
    batch checked against its digests first; ``verify`` also rebuilds every
    body). ``prefix_cache``: the ideal hit ratio for that KV block size."""
    from replayer.replay.plan import select
    from replayer.trace.stats import inspect_trace, prefix_cache_figures

    if prefix_cache is not None and prefix_cache < 1:
        raise OptionError("prefix_cache", "wants a block size >= 1")
    t = open_trace(trace)
    checked = t.verify(bodies=verify)
    rows = None
    sel = selection or Selection()
    if not sel.everything:
        rows = select(t, limit=sel.limit, sessions=sel.sessions, requests=sel.requests)
    info = inspect_trace(t, rows)
    if prefix_cache is not None:
        info["prefix_cache"] = prefix_cache_figures(t, prefix_cache, rows)
    if verify:
        info["verify"] = checked.lines()
    return info


def export(
    trace: TraceLike,
    output: str | os.PathLike[str],
    *,
    format: str = "jsonl",
    selection: Selection | None = None,
    force: bool = False,
) -> Written:
    """Every request (or the selection), full body, in trace order, as
    ``jsonl`` (replayer rows), ``aiperf`` (mooncake_trace rows) or
    ``aiperf-inputs`` (an AIPerf inputs.json)."""
    from replayer._files import atomic_output
    from replayer.replay.plan import select
    from replayer.trace.export import export_path

    t = open_trace(trace)
    sel = selection or Selection()
    rows = select(t, limit=sel.limit, sessions=sel.sessions, requests=sel.requests)
    if not rows and not sel.everything:
        raise UsageError("the selection is empty: nothing to export")
    with atomic_output(Path(output), force=force) as tmp:
        n, skipped = export_path(t, tmp, format, rows)
    return Written(Path(output), n, {"skipped": list(skipped)})


def synth(
    output: str | os.PathLike[str], options: SynthOptions | None = None, *, force: bool = False
) -> Written:
    """Synthesize agent sessions into a trace (a pure function of the options' seed)."""
    from replayer._files import atomic_output
    from replayer.trace import synth as _synth

    o = options or SynthOptions()
    with atomic_output(Path(output), force=force) as tmp:
        n = _synth.write_trace(tmp, o)
    return Written(Path(output), n, {"roomy": o.roomy()})


def import_trace(
    format: str,
    sources: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    options: Any = None,
    force: bool = False,
    say: Say | None = None,
) -> Written:
    """Convert source files of a public trace format into one replayer trace.
    ``options`` are the importer's own (an ``argparse.Namespace`` or mapping
    of its flags' values)."""
    import argparse
    import time

    from replayer._files import atomic_output
    from replayer.trace.importers import IMPORTERS, details, load
    from replayer.trace.model import TraceMeta
    from replayer.trace.writer import TraceWriter

    if format not in IMPORTERS:
        raise OptionError("format", f"{format!r}: want one of {', '.join(IMPORTERS)}")
    mod = load(format)
    srcs = [Path(s) for s in sources]
    for src in srcs:
        if not src.exists():
            raise UsageError(f"{src}: no such file or directory")
    opts = options if isinstance(options, argparse.Namespace) else argparse.Namespace(
        **(options or {})
    )  # fmt: skip
    meta = TraceMeta(
        source=f"import:{format}",
        details={"sources": [str(s) for s in srcs], **details(mod, srcs, opts)},
    )
    last = time.monotonic()
    with atomic_output(Path(output), force=force) as tmp, TraceWriter(tmp, meta, form="file") as w:
        for rec in mod.records(srcs, opts):
            w.add(rec)
            now = time.monotonic()
            if say is not None and now - last >= 2.0:
                say(f"import {format}: {w.rows:,} requests ...")
                last = now
        rows = w.rows
    return Written(Path(output), rows)


def merge(
    segments: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    force: bool = False,
) -> Any:
    """Join recording segments into one trace: rows in trace order on one
    clock, sessions re-linked across restarts, request-id collisions renamed."""
    from replayer._files import atomic_output
    from replayer.record.segments import merge as _merge

    with atomic_output(Path(output), force=force) as tmp:
        return _merge([Path(s) for s in segments], tmp)


def convert(
    trace: TraceLike,
    output: str | os.PathLike[str],
    *,
    form: str | None = None,
    force: bool = False,
) -> Written:
    """Rewrite a trace of an older schema version at the current one (verified
    in full first): same rows in the same order, same bodies, fresh digests."""
    from replayer._files import atomic_output
    from replayer.trace.convert import convert as _convert

    t = open_trace(trace)
    t.verify()
    with atomic_output(Path(output), force=force) as tmp:
        rows, batches = _convert(t, tmp, form=form)
    return Written(Path(output), rows, {"batches": batches, "from": t.schema_version})


# -- servers --------------------------------------------------------------------------


def record(
    options: RecordOptions,
    output: str | os.PathLike[str],
    *,
    metrics: MetricsOptions | None = None,
    live: LiveMetrics | None = None,
    say: Say = _stderr,
) -> int:
    """Run the recording proxy until it is stopped (Ctrl-C, SIGTERM): every
    exchange through it goes into ``output`` (a new segment if it exists)."""
    from replayer.record.run import record as _record

    with _metrics(metrics, live, say) as lm:
        return _record(options, Path(output), live=lm)


def serve(options: ServeOptions) -> int:
    """Run the job service until it is stopped."""
    from replayer.service.server import run

    return run(options)


def emulate(config: Any) -> int:
    """Run the vLLM emulator (an :class:`~replayer.emulator.config.EmulatorConfig`)
    until it is stopped."""
    from replayer.emulator.server import run

    return int(run(config))
