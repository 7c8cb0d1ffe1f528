"""One trial: bring the target up, replay a selection, classify what happened.

This is the unit of cost of the whole tool (a trial may include a ten-minute
model load), shared by ``replayer check``, ``replayer replay --launch`` and
every bisect step. The target is (re)started only when it has to be: at the
first trial, after a failure, or when ``--reset restart`` asks; after a
passing trial ``--reset prefix-cache`` clears the cache instead (falling back
to a restart, or to nothing, where the server has no dev mode).

A failed trial gets its crash signature from the launch's log
(:mod:`replayer.monitor.signature`), written to ``RUN/signature.json``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from replayer.bisect.oracle import Outcome
from replayer.errors import LaunchError, TargetError
from replayer.monitor.signature import Signature, matches_regex, signature_from_log
from replayer.monitor.watch import WatchConfig
from replayer.replay.client import Endpoint, is_client_error
from replayer.replay.policy import ReplayPolicy
from replayer.replay.run import EXIT_UNREACHABLE, RunOutcome, replay_to_dir
from replayer.replay.summary import rejection_text
from replayer.target.base import ResetMode, ServerTarget
from replayer.trace.reader import Trace

if TYPE_CHECKING:
    from replayer.replay.observer import ReplayObserver


EXIT_WAIT = 15.0
"""Seconds a trial waits for a server that stopped listening to exit."""


class NotExercised(Exception):
    """A run's requests were mostly rejected as client errors: the server never
    ran the trace, so neither "clean" nor "not reproducible" may come from it."""


class _Alive:
    """A lifecycle target seen as the monitor's process probe."""

    def __init__(self, target: ServerTarget) -> None:
        self.target = target

    def exited(self) -> bool:
        return self.target.alive() is False


@dataclass
class Chase:
    """The failure a bisect chases: its class and signature hash, or a
    user's regex over the signature text (``--signature REGEX``).

    Pinned from a :class:`Signature` (:meth:`pin`), it is as exit-aware as
    :func:`~replayer.monitor.signature.matches`: another known exit is another
    crash, an unknown one is not. Pinned on a bare hash (``--expect-signature``,
    a bundle's manifest, a journal) it cannot know the log hash behind it, so
    the hash is taken as either: a version-1 hash or a log hash then matches
    whatever the exit, a version-2 hash only its own exit."""

    failure_class: str | None = None
    signature: str | None = None
    """The chased :attr:`Signature.hash` (or a runner's label)."""
    regex: re.Pattern[str] | None = None
    log_hash: str | None = None
    """The chased :attr:`Signature.log_hash`; None when only a hash is known."""
    exit: str | None = None
    """The chased crash's exit status, when pinned from a signature that knew it."""

    @property
    def pinned(self) -> bool:
        return self.regex is not None or self.signature is not None

    def pin(self, failure_class: str | None, sig: Signature | str | None) -> None:
        """Chase ``sig``: a trial's signature (hash, log hash and exit) or a label."""
        self.failure_class = failure_class
        if isinstance(sig, Signature):
            self.signature, self.log_hash, self.exit = sig.hash, sig.log_hash, sig.exit
        else:
            self.signature, self.log_hash, self.exit = sig, None, None

    def same(self, sig: Signature | str) -> bool:
        """Whether ``sig`` (a signature or a runner's label) is the pinned
        crash, class aside (rules in the class docstring)."""
        log = self.log_hash or self.signature
        if isinstance(sig, str):
            return sig in (self.signature, log)
        if sig.hash == self.signature:
            return True
        both_exits = log != self.signature and sig.exit_hashed
        return sig.log_hash == log and not both_exits

    def is_other(self, sig: Signature | str | None) -> bool:
        """A failure labelled as another crash than the pinned hash (a
        runner's MATCH is not trusted then); False when either is unknown."""
        if self.regex is not None or self.signature is None or sig is None:
            return False
        return not self.same(sig)

    def matches(self, sig: Signature | None, failure_class: str | None) -> bool:
        if failure_class is None or failure_class == "client_error":
            return False
        if self.regex is not None:
            return sig is not None and matches_regex(sig, self.regex)
        if self.signature is None:  # not pinned yet: any crash of the class (or any)
            return self.failure_class is None or failure_class == self.failure_class
        if sig is None:  # no server log: the class is all there is to compare
            return self.failure_class is not None and failure_class == self.failure_class
        return self.same(sig) and (
            self.failure_class is None or sig.failure_class == self.failure_class
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.failure_class,
            "signature": self.signature,
            "log_hash": self.log_hash,
            "exit": self.exit,
            "regex": self.regex.pattern if self.regex else None,
        }


@dataclass
class TrialResult:
    outcome: Outcome
    run: RunOutcome | None
    failure_class: str | None = None
    signature: Signature | None = None
    message: str | None = None
    failure: dict[str, Any] | None = None
    client_errors: frozenset[str] = frozenset()
    unexercised: str | None = None
    """Most requests were rejected (4xx): what the run says about it. Such a
    run shows nothing about the crash, so nothing may start from it."""


@dataclass
class TrialEnv:
    """What every trial of a session shares."""

    trace: Trace
    policy: ReplayPolicy
    target: ServerTarget
    watch: WatchConfig
    reset: ResetMode = ResetMode.RESTART
    name: str = "target"
    api_key: str | None = None
    chase: Chase = field(default_factory=Chase)
    expected_4xx: frozenset[str] = frozenset()
    """Requests that fail with a 4xx even in the full trace: not INVALID."""
    needs_restart: bool = True
    started: bool = False
    pidfile: Path | None = None
    """Where a launched server's process group is noted, so a bisect killed
    with SIGKILL can reap its orphaned server when it resumes."""
    live: ReplayObserver | None = None
    """Live metrics (``--metrics-port``) every trial's replay reports to."""

    async def prepare(self) -> None:
        """Make the target fresh enough for the next trial."""
        try:
            await self._prepare()
        except BaseException:
            self.needs_restart = True  # whatever state it is in, start over next time
            raise

    async def _prepare(self) -> None:
        t = self.target
        if not self.started:
            await t.start()
            self._note_pid()
            self.started = True
            self.needs_restart = False
            await t.wait_ready()
            return
        if self.needs_restart:
            if not t.can_restart:
                raise TargetError(
                    f"the target at {t.url} failed and cannot be restarted: give --launch or "
                    "--restart-cmd"
                )
            await t.restart()
            self._note_pid()
            self.needs_restart = False
            await t.wait_ready()
            return
        if self.reset is not ResetMode.NONE:
            res = await t.reset(self.reset)
            if res.performed is ResetMode.RESTART:
                self._note_pid()
                await t.wait_ready()

    def _note_pid(self) -> None:
        pid = getattr(self.target, "pid", None)
        if self.pidfile is not None and pid is not None:
            self.pidfile.write_text(f"{pid}\n{_cmdline(pid)}\n")

    async def run(
        self,
        rows: list[int],
        out: Path,
        *,
        policy: ReplayPolicy | None = None,
        progress: bool = False,
        command: list[str] | None = None,
        trace: Trace | None = None,
    ) -> TrialResult:
        """One trial of ``rows`` of ``trace`` (default: the env's; a shrunk
        candidate brings its own)."""
        trace = trace or self.trace
        try:
            await self.prepare()
        except (LaunchError, TargetError) as exc:
            self.needs_restart = True
            return TrialResult(Outcome.INFRA, None, message=str(exc))
        run = await replay_to_dir(
            trace,
            rows,
            policy or self.policy,
            [Endpoint(self.name, self.target.url, self.api_key)],
            out,
            command=command or ["trial"],
            progress=progress,
            watch=self.watch,
            processes={self.name: _Alive(self.target)},
            live=self.live,
        )
        if run.exit_code == EXIT_UNREACHABLE:
            self.needs_restart = True
            return TrialResult(Outcome.INFRA, run, message=run.summary.get("unreachable"))
        t = run.summary["targets"][self.name]
        errors = frozenset(
            r.request_id
            for r in (run.replay.runs[self.name].results if run.replay else [])
            if is_client_error(r)
        )
        f = t["failure"]
        if f is None:
            outcome = Outcome.PASS if errors <= self.expected_4xx else Outcome.INVALID
            return TrialResult(
                outcome,
                run,
                client_errors=errors,
                unexercised=None if t["exercised"] else rejection_text(t),
            )
        self.needs_restart = True
        cls = f.get("class")
        exit_info = self.target.exit_info
        if exit_info is None and cls == "process_exit":
            # the port closed before the process finished exiting: its status
            # belongs in the signature, and comes within seconds
            exit_info = await self.target.exit_after(EXIT_WAIT)
        log = await self.target.collect_log()
        ids = [trace.column("request_id")[r] for r in rows]
        sig = None
        if log.strip():
            sig = signature_from_log(
                log,
                failure_class=cls or f["kind"],
                exit_code=exit_info.code if exit_info else None,
                signal=exit_info.signal if exit_info else None,
                request_ids=ids,
            )
            (out / "signature.json").write_bytes(
                orjson.dumps(sig.to_dict(), option=orjson.OPT_INDENT_2)
            )
        outcome = Outcome.MATCH if self.chase.matches(sig, cls) else Outcome.OTHER_FAILURE
        return TrialResult(
            outcome,
            run,
            failure_class=cls,
            signature=sig,
            message=f.get("message"),
            failure=f,
            client_errors=errors,
        )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def reap_orphan(pidfile: Path) -> bool:
    """Kill the process group a killed bisect left behind, if it is still the
    same program (pid reuse is checked against the noted command line)."""
    import os
    import signal

    reaped = False
    try:
        pid_text, cmd = [*pidfile.read_text().splitlines(), "", ""][:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        pid, cmd = 0, ""
    if cmd and _cmdline(pid) == cmd:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
            reaped = True
    # A kill between a launch and its pidfile note leaves a server nobody
    # noted: launched servers carry OWNER_ENV naming this bisect, so find them.
    mark = f"{OWNER_ENV}={owner_token(pidfile.parent)}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if mark not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            pgid = os.getpgid(int(proc.name))
            if pgid in (os.getpgid(0), 0):
                continue
            os.killpg(pgid, signal.SIGKILL)
            reaped = True
        except (OSError, ValueError):
            continue
    return reaped


OWNER_ENV = "REPLAYER_BISECT_OWNER"
"""Set in the environment of every server a bisect launches (see :func:`reap_orphan`)."""


def owner_token(out: Path) -> str:
    return str(out.resolve())
