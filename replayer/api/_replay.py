"""Replays and trials: ``replay`` (with or without a launched server),
``check``, ``soak``, ``verify_bundle`` and ``vary``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer._files import writing
from replayer.api._common import (
    DEFAULT_WATCH,
    EndpointLike,
    Say,
    TraceLike,
    _endpoints,
    _metrics,
    _run_dir,
    _stamped,
    _stderr,
    _watch,
)
from replayer.api._results import (
    CheckResult,
    RateResult,
    ReplayResult,
    RunPaths,
    RunStatus,
    _result,
)
from replayer.errors import OptionError
from replayer.options import (
    MetricsOptions,
    ReplayPolicy,
    Selection,
    Server,
    WatchConfig,
)
from replayer.session import Chase, NotExercised, Session, open_trace
from replayer.trace.reader import Trace

if TYPE_CHECKING:
    from replayer.bisect.vary import VaryPlan
    from replayer.telemetry import LiveMetrics

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
    return _noted(_result(outcome), session)


def _noted(result: ReplayResult, session: Session) -> ReplayResult:
    from replayer.trace.stats import trace_notes

    return replace(result, notes=trace_notes(session.trace, list(session.rows)))


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
        from replayer.replay.summary import name_failing

        sent = res.run.replay.runs[name].results if res.run.replay else []
        seqs = {r.request_id: r.seq for r in sent if r.seq is not None}
        name_failing(summary["targets"][name]["failure"], res.signature, seqs)
        with writing(run_dir / "summary.json"):
            (run_dir / "summary.json").write_bytes(
                orjson.dumps(summary, option=orjson.OPT_INDENT_2)
            )
    return _noted(_result(res.run, res.signature), session)


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
