"""What one trial shows: an :class:`Outcome` against the chased failure.

A trial ends in one of five outcomes, never a boolean, and the failure it
chases (:class:`Chase`) is pinned by class and crash signature (or a user's
regex), so "the same crash" and "another bug" are told apart wherever a
trial runs: ``check``, ``bundle verify``, ``soak`` and every bisect step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from replayer.monitor.signature import Signature, matches_regex

if TYPE_CHECKING:
    from replayer.replay.run import RunOutcome


NOT_CRASHES = frozenset({"client_error", "network"})
"""Failure classes that are no crash of the server: the client's request,
or the way to a healthy server (:mod:`replayer.monitor.classify`)."""


def infra_class(failure_class: str | None) -> bool:
    """A trial that failed so could not judge the server: ``INFRA``, retried,
    never a crash to chase (a proxy's reset in front of a healthy target)."""
    return failure_class == "network"


class Outcome(StrEnum):
    MATCH = "MATCH"
    """The chased failure: same class, and same signature (or the --signature regex)."""
    OTHER_FAILURE = "OTHER_FAILURE"
    """Another crash: a new bug, recorded with its witness, never accepted."""
    PASS = "PASS"
    INVALID = "INVALID"
    """The reduction broke the workload (e.g. new 4xx answers)."""
    INFRA = "INFRA"
    """The trial could not run (launch failure, unreachable target), or the
    network to a healthy target failed under it (class ``network``)."""


class NotExercised(Exception):
    """A run's requests were mostly rejected as client errors: the server never
    ran the trace, so neither "clean" nor "not reproducible" may come from it."""


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

    @classmethod
    def of(cls, regex: str | None = None, signature: str | None = None) -> Chase:
        """The chase a user names: a regex over signature text, a signature
        hash, or neither (the first crash)."""
        from replayer.monitor.signature import compile_signature_regex

        return cls(regex=compile_signature_regex(regex) if regex else None, signature=signature)

    @classmethod
    def from_signature(
        cls, sig: Mapping[str, Any] | None, failure_class: str | None = None
    ) -> Chase:
        """The chase of a recorded crash: a bundle's or a run's ``signature``
        (a bundle written before signatures covered the exit has no log hash:
        its hash is one, and matches a new run's whatever the exit)."""
        sig = sig or {}
        return cls(
            failure_class=sig.get("class", sig.get("failure_class", failure_class)),
            signature=sig.get("hash"),
            log_hash=sig.get("log_hash"),
            exit=sig.get("exit"),
        )

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
        """Whether a trial's failure is the chased one. A client error or a
        broken network (:data:`NOT_CRASHES`) never is, whatever is chased."""
        if failure_class is None or failure_class in NOT_CRASHES:
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
    """One trial: its outcome against the chase, and the replay behind it."""

    outcome: Outcome
    run: RunOutcome | None
    """None when the server never came up (``INFRA``)."""
    failure_class: str | None = None
    signature: Signature | None = None
    message: str | None = None
    failure: dict[str, Any] | None = None
    client_errors: frozenset[str] = frozenset()
    unexercised: str | None = None
    """Most requests were rejected (4xx): what the run says about it. Such a
    run shows nothing about the crash, so nothing may start from it."""
