"""Fakes for the bisect's tests and users' tests: a runner whose crashes
are planted (``culprits`` crash with probability ``p``, seeded), so search
properties can be checked in milliseconds and compared with ground truth."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from replayer.bisect.oracle import Candidate, Outcome, TrialRecord


@dataclass
class FakeRunner:
    """A target whose chased crash needs every position in ``culprits``.

    ``other`` plants a second, different bug (it shows as OTHER_FAILURE when
    its positions are present and the chased crash does not fire); ``infra``
    makes the first ``infra`` trials fail to launch."""

    culprits: frozenset[int]
    p: float = 1.0
    seed: int = 0
    triggers: frozenset[int] | None = None
    """Per-trigger flakiness instead: the crash fires when any of these
    positions is present and draws below ``p`` (each its own draw; the
    ``culprits`` are ignored): fewer triggers, a lower crash rate. Its
    record's ``reached`` (the failure point) is ``lag`` positions past the
    trigger that fired, as a server that dies a moment after its trigger."""
    lag: int = 0
    other: frozenset[int] | None = None
    infra: int = 0
    restart: float = 0.0
    """Seconds a trial after a failure takes (the server restarts first); a
    trial after a pass takes 1 s. 0: no durations (every trial reads 0 s)."""
    calls: list[Candidate] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._failed = False

    async def run(self, candidate: Candidate, trial: int, stage: str) -> TrialRecord:
        self.calls.append(candidate)
        pos = set(candidate.positions)
        outcome = Outcome.PASS
        sig = None
        reached: int | None = None
        if len(self.calls) <= self.infra:
            outcome = Outcome.INFRA
        elif self.triggers is not None:
            fired = [t for t in sorted(self.triggers) if t in pos and self.rng.random() < self.p]
            if fired:
                outcome, sig = Outcome.MATCH, "chased"
                later = [q for q in sorted(pos) if q > fired[0]][: self.lag]
                reached = (later[-1] if later else fired[0]) + 1
        elif self.culprits <= pos and self.rng.random() < self.p:
            outcome, sig = Outcome.MATCH, "chased"
        elif self.other is not None and self.other <= pos:
            outcome, sig = Outcome.OTHER_FAILURE, "other"
        took = (self.restart if self._failed else 1.0) if self.restart else 0.0
        self._failed = outcome in (Outcome.MATCH, Outcome.OTHER_FAILURE)
        return TrialRecord(
            trial=trial,
            key=candidate.key(),
            size=len(pos),
            stage=stage,
            outcome=outcome,
            signature=sig,
            reached=reached,
            duration_s=took,
        )
