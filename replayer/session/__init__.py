"""The session: one job's trace, selection, policy, servers and chase, built
once; every :mod:`replayer.api` verb runs over one (see :mod:`.core`)."""

from replayer.session.core import Session, open_trace, selected
from replayer.session.slot import OWNER_ENV, Slot, owner_token, reap_orphan
from replayer.session.verdict import Chase, NotExercised, Outcome, TrialResult

__all__ = [
    "OWNER_ENV",
    "Chase",
    "NotExercised",
    "Outcome",
    "Session",
    "Slot",
    "TrialResult",
    "open_trace",
    "owner_token",
    "reap_orphan",
    "selected",
]
