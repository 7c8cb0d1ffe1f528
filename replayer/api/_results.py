"""What the verbs return: typed results, never a crash as an exception."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer.monitor.classify import FailureClass
from replayer.monitor.signature import Signature
from replayer.options import (
    Convention,
    ReplayPolicy,
)
from replayer.session import Outcome
from replayer.session.verdict import TrialResult

if TYPE_CHECKING:
    from replayer.replay.run import RunOutcome


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
    notes: tuple[str, ...] = ()
    """Plain lines to read beside the summary: requests that send synthetic
    token ids, not text (a crash that depends on content may not have had
    its chance)."""

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


@dataclass(frozen=True)
class Written:
    """A trace (or export) written: where, and how many requests."""

    path: Path
    requests: int
    details: Mapping[str, Any] = field(default_factory=dict)
