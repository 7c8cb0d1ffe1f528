"""Live progress: one line per target, redrawn in place on a terminal, plain
``replay:`` lines every few seconds elsewhere (and always at the end)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from replayer.replay.progress import Progress

pytestmark = pytest.mark.inprocess


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


RUN = {"failure": None, "sent": 0, "inflight": 0, "errors": 0, "last_lag_us": 0}


def replay(finished=False, **runs):
    """What Progress reads of a replay: its targets' live counters and its clock."""
    return SimpleNamespace(
        started=True, finished=finished, now=lambda: 12.34,
        runs={name: SimpleNamespace(**(RUN | kw)) for name, kw in runs.items()},
    )  # fmt: skip


def test_one_line_per_target():
    r = replay(mi355={"sent": 1234, "inflight": 3, "errors": 1, "last_lag_us": 2500},
               b300={"failure": "engine_dead", "sent": 61})  # fmt: skip
    assert Progress(io.StringIO(), 50_000).lines(r) == [
        "mi355: sent 1,234/50,000  in flight 3  errors 1  lag 2.5 ms  t=12.3s",
        "FAILED b300: sent 61/50,000  in flight 0  errors 0  lag 0.0 ms  t=12.3s",
    ]
    r.started = False
    assert Progress(io.StringIO(), 1).lines(r)[0].endswith("t=0.0s")


def test_a_terminal_is_redrawn_in_place():
    out = Terminal()
    p = Progress(out, 10)
    p.update(replay(a={"sent": 1}, b={}))
    first = out.getvalue()
    assert first == (
        "\x1b[2Ka: sent 1/10  in flight 0  errors 0  lag 0.0 ms  t=12.3s\n"
        "\x1b[2Kb: sent 0/10  in flight 0  errors 0  lag 0.0 ms  t=12.3s\n"
    )
    p.update(replay(a={"sent": 2}, b={}))
    assert out.getvalue()[len(first) :].startswith("\x1b[2F\x1b[2Ka: sent 2/10")


def test_elsewhere_plain_lines_every_few_seconds_and_at_the_end():
    out = io.StringIO()
    p = Progress(out, 10, plain_every=3600)
    p.update(replay(a={"sent": 1}))
    p.update(replay(a={"sent": 2}))  # within the hour: not printed
    p.update(replay(finished=True, a={"sent": 10}))
    assert [line.split("  ")[0] for line in out.getvalue().splitlines()] == [
        "replay: a: sent 1/10",
        "replay: a: sent 10/10",
    ]
