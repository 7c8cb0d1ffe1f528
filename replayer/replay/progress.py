"""Live progress on stderr: one line per target (sent/total, in flight,
errors, lag), redrawn in place on a terminal and printed every few seconds
as plain lines otherwise (CI logs, files)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from replayer.replay.engine import Replay


class Progress:
    def __init__(self, stream: TextIO, total: int, *, plain_every: float = 5.0) -> None:
        self.stream = stream
        self.total = total
        self.tty = stream.isatty()
        self.plain_every = plain_every
        self._last_plain = 0.0
        self._drawn = 0

    def lines(self, replay: Replay) -> list[str]:
        now = replay.now() if replay.started else 0.0
        out = []
        for name, run in replay.runs.items():
            state = "FAILED " if run.failure else ""
            out.append(
                f"{state}{name}: sent {run.sent:,}/{self.total:,}  in flight {run.inflight}  "
                f"errors {run.errors}  lag {run.last_lag_us / 1000:.1f} ms  t={now:.1f}s"
            )
        return out

    def update(self, replay: Replay) -> None:
        lines = self.lines(replay)
        if self.tty:
            if self._drawn:
                self.stream.write(f"\x1b[{self._drawn}F")
            for line in lines:
                self.stream.write("\x1b[2K" + line + "\n")
            self._drawn = len(lines)
            self.stream.flush()
            return
        mono = time.monotonic()
        if replay.finished or mono - self._last_plain >= self.plain_every:
            self._last_plain = mono
            for line in lines:
                self.stream.write("replay: " + line + "\n")
            self.stream.flush()
