"""``bisect``: from a crashing trace to a minimal repro bundle."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer._files import writing
from replayer.api._common import DEFAULT_WATCH, Say, TraceLike, _metrics, _stderr, _watch
from replayer.api._replay import _vary_plan
from replayer.errors import OptionError, UsageError
from replayer.options import (
    BisectOptions,
    MetricsOptions,
    PoolSpec,
    ReplayPolicy,
    Selection,
    Server,
    WatchConfig,
)
from replayer.session import Chase, Outcome, Session, reap_orphan

if TYPE_CHECKING:
    from replayer.bisect.pipeline import BisectResult
    from replayer.bisect.runner import Observation, Runner, Trial
    from replayer.telemetry import LiveMetrics

# -- bisect ----------------------------------------------------------------------------


_STARTED = ("trials", "server.pid", "server.log")
"""What a bisect leaves before its first trial is journaled."""


def _bisect_dir(d: Path, resume: bool) -> Path:
    """A new or empty directory, or one holding the journal to resume (or a
    bisect killed before it journaled a trial: resuming it starts afresh)."""
    if d.exists() and any(d.iterdir()) and not resume:
        raise UsageError(f"{d} exists and is not empty: resume it, or pick another out")
    started = any((d / name).exists() for name in _STARTED)
    if resume and not (d / "journal.jsonl").exists() and not started:
        raise UsageError(f"resume: {d} holds no journal.jsonl")
    with writing(d):
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


_seed = from_run  # ``bisect``'s own parameter of that name hides the function


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
    servers: int = 1,
    gpus: int = 0,
    pool: PoolSpec | str | os.PathLike[str] | None = None,
    control_pool: PoolSpec | str | os.PathLike[str] | None = None,
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
    continues a stopped bisect in ``out`` without repeating a journaled trial
    (with any number of servers).

    Several servers run trials at once: ``servers`` copies of ``server``
    (its launch a template: ``{port}``, ``{slot}``, ``{gpus}`` filled in per
    server, ``gpus`` each), or a ``pool`` (a :class:`PoolSpec` or a pool
    file: Slurm jobs, servers one by one); ``control_pool`` likewise for the
    control."""
    from replayer.bisect.pipeline import Bisect, Control, run_bisect
    from replayer.bisect.runner import FunctionRunner, SessionRunner
    from replayer.bisect.vary import bisect_hook

    w = _watch(watch, "bisect")
    chase = Chase.of(signature)
    if from_run is not None:
        seed = _seed(from_run)
        if server is None and seed.launch:
            server = Server(launch=seed.launch)
        if chase.regex is None:
            chase = seed.chase
    spec = _pool(pool, servers, gpus, server)
    if spec is not None and server is None:
        server = spec.members[0].server
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
    ctl_spec = _pool(control_pool, 1, 0, control if isinstance(control, Server) else None)
    session = Session.open(
        trace,
        selection=selection,
        policy=policy,
        watch=w,
        server=server if isinstance(server, Server) and spec is None else None,
        control=control if isinstance(control, Server) and ctl_spec is None else None,
        control_name=control_name,
        logs=d,
        chase=chase,
        say=say,
        owner=d if is_server else None,
        pool=spec,
        control_pool=ctl_spec,
    )
    runner: Runner
    if isinstance(server, Server):
        runner = SessionRunner(session)
        if resume:
            await _reap(d, spec, say)
    else:
        runner = server if hasattr(server, "run") else FunctionRunner(server)
    ctl = None
    if session.control_pool is not None:
        ctl = Control(control_name, SessionRunner(session, pool=session.control_pool))
    elif session.control is not None:
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
            try:
                await session.gather_facts()
            except BaseException:  # interrupted before run_bisect, which stops them
                await session.aclose()
                raise
        return await run_bisect(b)


async def _reap(d: Path, spec: PoolSpec | None, say: Say) -> None:
    """What a killed bisect in ``d`` left running: its launched servers (by
    their pid files) and, for a Slurm pool, its jobs (by their names)."""
    # each pid file, then every process marked as this bisect's (a kill
    # between a launch and its note): a pool's servers are found either way
    if [p for p in _pidfiles(d) if reap_orphan(p)]:
        say("bisect: stopped the server(s) a killed bisect left running")
    if spec is not None and spec.slurm is not None:
        from replayer.session.slot import owner_token
        from replayer.target.slurm import cancel_owned, owner_hash

        with contextlib.suppress(Exception):  # no squeue here: nothing of ours queued either
            ids = await cancel_owned(owner_hash(owner_token(d)))
            if ids:
                say(f"bisect: cancelled {len(ids)} Slurm job(s) a killed bisect left")


def _pidfiles(d: Path) -> list[Path]:
    """The one server's, and a pool's (``target-server-I.pid``)."""
    return [d / "server.pid", *sorted(d.glob("*-server-*.pid"))]


def _pool(
    given: PoolSpec | str | os.PathLike[str] | None,
    servers: int,
    gpus: int,
    server: Server | Runner | OracleFunction | None,
) -> PoolSpec | None:
    """The pool a bisect runs on: a pool file, or ``servers`` copies of
    ``server`` (None: one server, no pool)."""
    base = server if isinstance(server, Server) else None
    if isinstance(given, PoolSpec):
        return given
    if given is not None:
        return PoolSpec.load(Path(given), base)
    if servers <= 1:
        return None
    if base is None:
        raise OptionError("servers", "need a Server with launch (a template with {port})")
    return PoolSpec.like(base, servers, gpus=gpus)


def bisect_sync(*args: Any, **kwargs: Any) -> BisectResult:
    """:func:`bisect` for code without an event loop (same arguments)."""
    return asyncio.run(bisect(*args, **kwargs))
