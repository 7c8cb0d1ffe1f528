"""What a trial chases and how hard a bisect searches: :class:`BisectOptions`,
the chased failure (:class:`ChaseOptions`), ``check``'s verdict conventions,
the run counts of ``bundle verify`` and ``soak``, and ``--vary``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from replayer._declare import Declared, option
from replayer.errors import OptionError

STAGES = ("calibrate", "cut", "prefix", "sessions", "turns", "shrink", "timing")
"""A bisect's passes, in the order they run (see :mod:`replayer.bisect.pipeline`)."""


def duration(text: str) -> float:
    """Seconds, or ``30m``/``2h``/``1d``: bisect budgets are human-sized."""
    mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in mult:
            return float(text[:-1]) * mult[text[-1]]
        return float(text)
    except ValueError:
        raise ValueError(f"want seconds or 30m/2h/1d, not {text!r}") from None


def stages_value(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _stages_problem(stages: tuple[str, ...]) -> str | None:
    bad = [s for s in stages if s not in STAGES]
    if bad:
        return f"names unknown stage(s) {', '.join(bad)}; the stages are {', '.join(STAGES)}"
    return None


def _regex_problem(text: str) -> str | None:
    try:
        re.compile(text)
    except re.error as exc:
        return f"{text!r} is not a valid regex: {exc}"
    return None


@dataclass(frozen=True)
class BisectOptions(Declared):
    """How hard a bisect searches and how it confirms (see :mod:`replayer.bisect.pipeline`)."""

    __group__ = "search"
    __verbs__ = frozenset({"bisect"})

    stages: tuple[str, ...] = option(
        STAGES,
        "stages to run",
        metavar="LIST",
        parse=stages_value,
        check=_stages_problem,
    )
    calibrate_matches: int = option(
        5,
        "calibration stops after N matching crashes (default 5)",
        metavar="N",
        cli="--calibrate",
        ge=1,
    )
    calibrate_runs: int = option(10, "... or after N runs (default 10)", metavar="N", ge=1)
    prefix_recheck: int = option(
        2,
        "after a binary prefix search, N more runs of the longest quiet prefix: each costs a "
        "steady crash a trial, and catches one flaky at shorter lengths (default 2)",
        metavar="N",
        ge=0,
    )
    """After a binary prefix search (a crash that looked deterministic), runs
    of the longest prefix it found quiet: each costs a deterministic crash
    one trial and catches a crash that is flaky at shorter lengths with
    probability p."""
    shrink_steps: int = option(
        256,
        "the shrink stage cuts a text in at most N steps: each halving of N saves a trial per "
        "text and doubles the threshold's uncertainty (default 256)",
        metavar="N",
        ge=2,
    )
    """The shrink stage cuts a text prompt, or the prose of a conversation
    item, in at most this many steps (log2 of it probes per text)."""
    shrink_rate_runs: int = option(
        3,
        "a shrink cut of a crash that struck on every run must crash N runs in a row to be "
        "kept (default 3: a cut that makes it a 30% crash passes 3% of the time; each run "
        "costs a restart; 1 takes the search's own crash)",
        metavar="N",
        ge=1,
    )
    alpha: float = option(
        0.05, "risk of dismissing a crashing candidate (default 0.05)", metavar="P", gt=0, lt=1
    )
    confirm: int = option(
        10, "runs of the final repro to measure its rate (default 10)", metavar="N", ge=0
    )
    min_rate: float = option(
        0.15,
        "the floor: a result whose confirm runs crash less often than this is not called a "
        "reproducer, and the bisect exits 5 (default 0.15)",
        metavar="P",
        ge=0,
        le=1,
    )
    """syzkaller's floor: a reproducer that crashes in fewer than 15 % of its
    validation runs wastes the time of whoever runs it."""
    reliable_rate: float = option(
        0.5,
        "where the result crashes less often than this, the bundle also keeps the smallest "
        "candidate seen crashing at least this often, both measured (default 0.5)",
        metavar="P",
        gt=0,
        le=1,
    )
    max_trials: int | None = option(
        None, "stop after N trials (the best bundle so far is kept)", metavar="N", ge=1
    )
    max_time: float | None = option(
        None, "wall-clock budget: seconds, or 30m, 2h, 1d", metavar="T", parse=duration, gt=0
    )
    speedups: tuple[float, ...] = option(
        (2.0, 4.0, 8.0, 16.0), "speed multipliers the timing stage tries", cli=False
    )
    try_asap: bool = option(True, "the timing stage also tries asap", cli=False)
    bundle: bool = option(
        True, "write the repro bundle (after every improvement and at the end)", cli=False
    )
    """Write the repro bundle (after every improvement and at the end)."""


@dataclass(frozen=True)
class ChaseOptions(Declared):
    """The failure a trial counts as the one chased (default: any crash)."""

    __group__ = "the chased failure"
    __verbs__ = frozenset({"check", "bisect"})

    signature: str | None = option(
        None,
        "chase crashes whose signature text matches (default: the first crash)",
        metavar="REGEX",
        check=_regex_problem,
    )
    expect_signature: str | None = option(
        None,
        "the chased failure: crashes with this signature hash",
        metavar="HASH",
        verbs=frozenset({"check"}),
    )


class Convention(StrEnum):
    """Whose exit codes ``check`` speaks (see :mod:`replayer.cli.check`)."""

    BISECT = "bisect"
    """``git bisect run``: 0 good, 1 the chased failure, 125 skip."""
    REDUCE = "reduce"
    """C-Reduce, shrinkray: 0 interesting (the chased failure), 1 not."""


@dataclass(frozen=True)
class CheckOptions(Declared):
    """``check``'s exit-code convention."""

    __group__ = "verdict"
    __verbs__ = frozenset({"check"})

    convention: Convention = option(Convention.BISECT, "whose exit codes (default bisect)")
    also_interesting: int | None = option(
        None, "reduce convention: exit N for another failure", metavar="N", ge=3, le=124
    )


@dataclass(frozen=True)
class VerifyOptions(Declared):
    """``bundle verify``: how many runs measure a bundle's rate."""

    __group__ = "runs"
    __verbs__ = frozenset({"verify"})

    runs: int = option(10, "runs (default 10)", metavar="N", ge=1)
    min_rate: float = option(
        0.15,
        "the floor: a bundle crashing in fewer of its runs is not a reproducer, exit 5 "
        "(default 0.15)",
        metavar="P",
        ge=0,
        le=1,
    )


@dataclass(frozen=True)
class SoakOptions(Declared):
    """``soak``: how many clean runs bound a fixed server's crash rate."""

    __group__ = "runs"
    __verbs__ = frozenset({"soak"})

    runs: int = option(20, "runs (default 20)", metavar="N", ge=1)


@dataclass(frozen=True)
class VaryOptions(Declared):
    """``--vary``: relaunch the server with each variant and replay the repro."""

    __group__ = "what makes it go away"
    __verbs__ = frozenset({"bisect", "verify"})

    vary: tuple[str, ...] = option(
        (),
        "server variants to replay the repro under (repeatable): a TOML ([[variant]] name, "
        "add, remove, env, unset_env) or JSON file, 'default' for the shipped vLLM list, or "
        "'default:NAME,NAME' for some of it; needs --launch",
        metavar="FILE|default",
    )
    vary_runs: int | None = option(None, "runs of each variant (default 5)", metavar="N", ge=1)

    def validate(self) -> None:
        if self.vary_runs is not None and not self.vary:
            raise OptionError("vary_runs", "needs vary")
