"""What may watch a replay while it runs, without the replay knowing who.

Live metrics (:class:`replayer.telemetry.LiveMetrics`), a progress UI or a
user's own script implement this protocol; the replay calls it and never
imports them, so the replay sits below everything that observes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from replayer.replay.engine import Replay
    from replayer.replay.results import Result


class ReplayObserver(Protocol):
    def observe(self, result: Result) -> None:
        """One settled request, as it is written (called on the event loop)."""

    def attach(self, replay: Replay) -> None:
        """The replay starts: its live state (:meth:`Replay.snapshot`) may be read."""

    def detach(self, replay: Replay) -> None:
        """The replay is over; ``replay.runs`` holds its final state."""
