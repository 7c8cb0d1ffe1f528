"""The session: what every trial of one job shares, built once from options.

A :class:`Session` holds the trace and its selection, the replay policy,
the monitor's settings, the servers (the one under test, a control) or the
plain endpoints, the failure it chases, the live-metrics observer and the
clock. Every verb of :mod:`replayer.api` is a short function over one:
``replay`` is :meth:`Session.replay` or one :meth:`Session.trial`,
``check`` one trial, ``soak`` and ``bundle verify`` :meth:`Session.runs`,
and a bisect asks it for each of its trials.

**Usage**::

    async with Session.open("prod.arrow", server=Server(launch="vllm serve ..."),
                            out=Path("runs/x")) as s:
        res = await s.trial(out=Path("runs/x/1"))
        print(res.outcome, res.signature)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import orjson

from replayer._clock import REAL, Clock
from replayer._files import writing
from replayer.errors import LaunchError, OptionError, TargetError, UsageError
from replayer.monitor.signature import signature_from_log
from replayer.options.monitor import WatchConfig
from replayer.options.pool import PoolSpec
from replayer.options.replay import ReplayPolicy, Selection
from replayer.options.server import Server
from replayer.replay.client import Endpoint, is_client_error
from replayer.replay.run import EXIT_UNREACHABLE, RunOutcome, replay_to_dir
from replayer.replay.summary import name_failing, rejection_text
from replayer.session.pool import Pool, build_slots
from replayer.session.slot import OWNER_ENV, Slot, owner_token
from replayer.session.verdict import Chase, NotExercised, Outcome, TrialResult
from replayer.trace.reader import Trace

if TYPE_CHECKING:
    from replayer.replay.observer import ReplayObserver

EXIT_WAIT = 15.0
"""Seconds a trial waits for a server that stopped listening to exit."""


class _Alive:
    """A slot's target seen as the monitor's process probe."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def exited(self) -> bool:
        return self.target.alive() is False


def _noted(slot: Slot) -> dict[str, Any]:
    """What run.json records of a slot's server (secrets masked)."""
    from replayer.target.facts import redact_command

    text = getattr(slot.target, "command_text", None)
    launch = redact_command(text()) if callable(text) else None
    return {"name": slot.name, "url": slot.url, "launch": launch}


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def open_trace(trace: Trace | str | os.PathLike[str]) -> Trace:
    return trace if isinstance(trace, Trace) else Trace.open(trace)


def selected(trace: Trace, selection: Selection | None) -> list[int]:
    """The rows ``selection`` names, verified: nothing is sent before they read."""
    from replayer.replay.plan import select

    sel = selection or Selection()
    rows = select(trace, limit=sel.limit, sessions=sel.sessions, requests=sel.requests)
    if not rows:
        raise UsageError("the selection is empty: nothing to replay")
    trace.verify(rows)
    return rows


@dataclass
class Session:
    """What every trial of one job shares (see the module doc). Build it with
    :meth:`open`; close it (``async with``) to stop the servers it launched."""

    trace: Trace
    rows: list[int]
    policy: ReplayPolicy = field(default_factory=ReplayPolicy)
    watch: WatchConfig | None = field(default_factory=WatchConfig)
    selection: Selection = field(default_factory=Selection)
    slot: Slot | None = None
    """The server under test, when the session holds its lifecycle."""
    endpoints: tuple[Endpoint, ...] = ()
    """Plain endpoints (a replay side by side, no lifecycle)."""
    control: Slot | None = None
    """The platform that runs clean, for a bisect's control runs."""
    pool: Pool | None = None
    """Servers under test to run trials on at once (instead of ``slot``)."""
    control_pool: Pool | None = None
    """The control platform's servers, when it is a pool."""
    chase: Chase = field(default_factory=Chase)
    live: ReplayObserver | None = None
    say: Callable[[str], None] = _stderr
    clock: Clock = REAL
    keep_running: bool = False
    """Leave launched servers running when the session closes."""
    facts: dict[str, Any] = field(default_factory=dict)
    """What is known of the server under test (launch, URL, versions): the bundle's."""
    server: Server | None = None
    """What the slot was made from (variants relaunch it with another command)."""

    @classmethod
    def open(
        cls,
        trace: Trace | str | os.PathLike[str],
        *,
        selection: Selection | None = None,
        rows: Sequence[int] | None = None,
        policy: ReplayPolicy | None = None,
        watch: WatchConfig | None = None,
        server: Server | None = None,
        endpoints: Sequence[Endpoint] = (),
        control: Server | None = None,
        name: str = "target",
        control_name: str = "control",
        logs: Path | None = None,
        chase: Chase | None = None,
        live: ReplayObserver | None = None,
        say: Callable[[str], None] | None = None,
        owner: Path | None = None,
        clock: Clock = REAL,
        pool: PoolSpec | None = None,
        control_pool: PoolSpec | None = None,
    ) -> Session:
        """A session over ``trace``'s ``selection`` (or explicit ``rows``).

        ``server`` is the one server under test (its log at ``logs/server.log``),
        ``endpoints`` plain URLs instead; ``control`` a clean platform
        (``logs/control-server.log``). ``pool`` is several servers under test
        (trials run on all at once; logs at ``logs/target-server-I.log``),
        ``control_pool`` the control's. ``owner`` marks launched servers as
        this bisect directory's, so a resume can reap one a kill orphaned."""
        t = open_trace(trace)
        if rows is None:
            got = selected(t, selection)
        else:
            got = list(rows)
            t.verify(got)
        pol = policy or ReplayPolicy()
        if watch is not None and not watch.enabled:
            watch = None
        model = t.model_of(got, pol.model)
        slot = ctl = None
        marks = {OWNER_ENV: owner_token(owner)} if owner is not None else None
        if server is not None:
            slot = Slot.of(
                server,
                log_path=logs / "server.log" if logs is not None else None,
                model=model,
                name=name,
                marks=marks,
                pidfile=owner / "server.pid" if owner is not None else None,
            )
        if control is not None:
            ctl = Slot.of(
                control,
                log_path=logs / "control-server.log" if logs is not None else None,
                model=model,
                name=control_name,
            )
        pools: list[Pool | None] = [None, None]
        for i, (spec, who) in enumerate(((pool, name), (control_pool, control_name))):
            if spec is not None:
                resolved, slots = build_slots(spec, logs=logs, model=model, owner=owner, name=who)
                state = (
                    logs / ("servers.json" if i == 0 else "control-servers.json") if logs else None
                )
                pools[i] = Pool(slots, name=who, spec=resolved, owner=owner, state_file=state)
        facts: dict[str, Any] = {}
        if server is not None:
            facts = {"launch": server.launch, "restart_cmd": server.restart_cmd}
            if slot is not None:
                facts["url"] = slot.url
        if pool is not None:
            facts = {
                "launch": pool.launch_template or pool.members[0].server.launch,
                "servers": len(pool),
                "pool": pool.source,
                "slurm": pool.slurm is not None,
            }
        return cls(
            trace=t,
            rows=got,
            policy=pol,
            watch=watch,
            selection=selection or Selection(),
            slot=slot,
            endpoints=tuple(endpoints),
            control=ctl,
            chase=chase or Chase(),
            live=live,
            say=say or _stderr,
            clock=clock,
            keep_running=server.keep_running if server is not None else False,
            facts=facts,
            server=server,
            pool=pools[0],
            control_pool=pools[1],
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the servers this session launched (unless ``keep_running``)."""
        if self.keep_running:
            return
        for slot in (self.slot, self.control):
            if slot is not None:
                await slot.stop()
        for pool in (self.pool, self.control_pool):
            if pool is not None:
                await pool.aclose()

    @property
    def model(self) -> str | None:
        return self.trace.model_of(self.rows, self.policy.model)

    def variant(self, launch: str, log_path: Path, server: int = 0) -> Slot:
        """A slot like the one under test, launched with another command
        (``--vary``); on a pool, in the place of its server ``server`` (its
        port, GPUs or Slurm job), the launch a template as the pool's."""
        if self.pool is not None and self.pool.spec is not None:
            from replayer.session.pool import build_slot

            return build_slot(
                self.pool.spec,
                server % len(self.pool),
                logs=None,
                model=self.model,
                owner=self.pool.owner,
                name=f"{self.pool.name}-variant",
                launch=launch,
                log=log_path,
            )
        if self.slot is None or self.server is None:
            raise OptionError("vary", "needs a launched server")
        t = self.slot.target
        return Slot.of(
            self.server,
            log_path=log_path,
            model=self.model,
            marks=getattr(t, "marks", None),
            launch=launch,
        )

    @property
    def width(self) -> int:
        """Servers that can run at once (a pool's, else one)."""
        return self.pool.usable if self.pool is not None else 1

    # -- running ------------------------------------------------------------------

    async def replay(
        self,
        out: Path,
        *,
        policy: ReplayPolicy | None = None,
        progress: bool = False,
        command: list[str] | None = None,
    ) -> RunOutcome:
        """The selection against the plain endpoints, side by side (no lifecycle)."""
        if not self.endpoints:
            raise OptionError("endpoints", "is empty: give at least one URL or Endpoint")
        return await replay_to_dir(
            self.trace,
            self.rows,
            policy or self.policy,
            list(self.endpoints),
            out,
            command=command,
            selection=self.selection.to_dict(),
            progress=progress,
            watch=self.watch,
            live=self.live,
        )

    async def trial(
        self,
        out: Path,
        *,
        rows: Sequence[int] | None = None,
        slot: Slot | None = None,
        policy: ReplayPolicy | None = None,
        trace: Trace | None = None,
        chase: Chase | None = None,
        progress: bool = False,
        command: list[str] | None = None,
    ) -> TrialResult:
        """One trial: bring ``slot`` (default: the server under test) up, replay
        ``rows`` of ``trace`` (default: the session's; a shrunk candidate brings
        its own), classify what happened against ``chase``."""
        slot = slot or self.slot
        if slot is None:
            raise OptionError("server", "is required: a trial runs on a server the session holds")
        if self.watch is None:
            raise OptionError("watch", "is required: a trial classifies what happened")
        whole = rows is None and trace is None
        trace = trace or self.trace
        rows = list(self.rows if rows is None else rows)
        chase = chase or self.chase
        try:
            await slot.prepare()
        except (LaunchError, TargetError) as exc:
            slot.needs_restart = True
            return TrialResult(Outcome.INFRA, None, message=str(exc))
        slot.fresh = False  # this trial's requests are in it now
        run = await replay_to_dir(
            trace,
            rows,
            policy or self.policy,
            [Endpoint(slot.name, slot.url, slot.api_key)],
            out,
            command=command or ["trial"],
            selection=self.selection.to_dict() if whole else None,
            progress=progress,
            watch=self.watch,
            processes={slot.name: _Alive(slot.target)},
            live=self.live,
            server=_noted(slot),
        )
        if run.exit_code == EXIT_UNREACHABLE:
            slot.needs_restart = True
            return TrialResult(Outcome.INFRA, run, message=run.summary.get("unreachable"))
        t = run.summary["targets"][slot.name]
        errors = frozenset(
            r.request_id
            for r in (run.replay.runs[slot.name].results if run.replay else [])
            if is_client_error(r)
        )
        f = t["failure"]
        if f is None:
            return TrialResult(
                Outcome.PASS if not errors else Outcome.INVALID,
                run,
                client_errors=errors,
                unexercised=None if t["exercised"] else rejection_text(t),
            )
        cls = f.get("class")
        if cls == "network":
            # the way to the server failed while it stayed healthy: re-run, keep it
            return TrialResult(
                Outcome.INFRA, run, failure_class=cls, message=f.get("message"), failure=f
            )
        slot.needs_restart = True
        exit_info = slot.target.exit_info
        if exit_info is None and cls == "process_exit":
            # the port closed before the process finished exiting: its status
            # belongs in the signature, and comes within seconds
            exit_info = await slot.target.exit_after(EXIT_WAIT)
        lost = getattr(slot.target, "lost", None)  # a Slurm job the scheduler ended
        if lost:
            return TrialResult(Outcome.INFRA, run, message=lost)
        log = await slot.target.collect_log()
        ids = trace.column("request_id")
        sig = None
        if log.strip():
            sig = signature_from_log(
                log,
                failure_class=cls or f["kind"],
                exit_code=exit_info.code if exit_info else None,
                signal=exit_info.signal if exit_info else None,
                request_ids=[ids[r] for r in rows],
            )
            with writing(out / "signature.json"):
                (out / "signature.json").write_bytes(
                    orjson.dumps(sig.to_dict(), option=orjson.OPT_INDENT_2)
                )
            # the request the server was processing, where its log says so
            sent_results = run.replay.runs[slot.name].results if run.replay else []
            name_failing(f, sig, {r.request_id: r.seq for r in sent_results if r.seq is not None})
        outcome = Outcome.MATCH if chase.matches(sig, cls) else Outcome.OTHER_FAILURE
        return TrialResult(
            outcome,
            run,
            failure_class=cls,
            signature=sig,
            message=f.get("message"),
            failure=f,
            client_errors=errors,
        )

    async def runs(
        self,
        n: int,
        out: Path,
        *,
        label: str = "run",
        slot: Slot | None = None,
    ) -> list[TrialResult]:
        """``n`` trials of the selection, one directory each (``out/001`` ...);
        refuses (:class:`NotExercised`) as soon as one exercised nothing, and
        stops the server afterwards."""
        results = []
        target = slot or self.slot
        try:
            for i in range(n):
                res = await self.trial(out / f"{i + 1:03d}", slot=target)
                if res.unexercised:
                    raise NotExercised(res.unexercised)
                results.append(res)
                cls = f" [{res.failure_class}]" if res.failure_class else ""
                self.say(f"{label} {i + 1}/{n}: {res.outcome.value}{cls}")
        finally:
            if target is not None and not self.keep_running:
                await target.stop()
        return results

    async def gather_facts(self) -> Mapping[str, Any]:
        """Start the server under test and read what it says of itself (versions,
        model, engine flags) into :attr:`facts`: a courtesy for the bundle, so
        a failure here is noted, never raised (the trials report real ones)."""
        slot = self.slot or (self.pool.slots[0] if self.pool is not None else None)
        if slot is None:
            return self.facts
        try:
            await slot.prepare()
            got = await slot.target.facts()
            self.facts.update({k: v for k, v in got.to_dict().items() if v})
        except Exception as exc:
            self.facts["facts_error"] = str(exc)[:300]
        return self.facts
