"""Every option a job takes, declared once (see :mod:`replayer._declare`).

Each value object here is a frozen dataclass whose fields are the options
themselves: type, default, bounds, help and the verbs that take them. The
CLI renders them into flags (``replayer.cli.args``), the job service checks
a request's ``options`` against them and builds the same objects, and the
library takes the objects directly; so a default, a choice list or a bound
lives in exactly one place, and a bad value is refused when the object is
built, with an :class:`~replayer.errors.OptionError` naming the field.

Options are named by their **parameter** (``max_inflight``); the CLI spells
them ``--max-inflight`` (or the declared spelling where it differs), and
rewrites an error's parameter name to its flag, so a library user never
reads about flags. Output locations and terminal niceties (``--out``,
``--force``, ``--json``, ``--quiet``) are the command line's own, not a
job's, and are not declared here.

This package imports nothing but the standard library, so the CLI's
``--help`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replayer._declare import Declared, Spec, exposed, from_values, specs
from replayer.options.analysis import CompareOptions, Slo, SweepOptions
from replayer.options.monitor import WatchConfig
from replayer.options.pool import PoolSpec
from replayer.options.record import DEFAULT_SESSION_HEADERS, RecordOptions
from replayer.options.replay import (
    Mode,
    OnFailure,
    Order,
    ReplayPolicy,
    ResponsesState,
    Selection,
    Timing,
)
from replayer.options.search import (
    STAGES,
    BisectOptions,
    ChaseOptions,
    CheckOptions,
    Convention,
    SoakOptions,
    VaryOptions,
    VerifyOptions,
    duration,
)
from replayer.options.server import (
    ControlOptions,
    MetricsOptions,
    PoolOptions,
    ResetMode,
    Server,
    Targets,
)
from replayer.options.service import ServeOptions
from replayer.options.trace import Payload, SynthApi, SynthOptions

__all__ = [
    "DEFAULT_SESSION_HEADERS",
    "STAGES",
    "VERBS",
    "BisectOptions",
    "ChaseOptions",
    "CheckOptions",
    "CompareOptions",
    "ControlOptions",
    "Convention",
    "Declared",
    "MetricsOptions",
    "Mode",
    "OnFailure",
    "Order",
    "Payload",
    "PoolOptions",
    "PoolSpec",
    "RecordOptions",
    "ReplayPolicy",
    "ResetMode",
    "ResponsesState",
    "Selection",
    "ServeOptions",
    "Server",
    "Slo",
    "SoakOptions",
    "Spec",
    "SweepOptions",
    "SynthApi",
    "SynthOptions",
    "Targets",
    "Timing",
    "VaryOptions",
    "VerifyOptions",
    "WatchConfig",
    "duration",
    "exposed",
    "from_values",
    "options_of",
    "specs",
    "spelling",
]

VERBS: dict[str, tuple[type[Declared], ...]] = {
    "replay": (Targets, Server, ReplayPolicy, WatchConfig, Selection, MetricsOptions),
    "check": (Server, Targets, ChaseOptions, CheckOptions, ReplayPolicy, WatchConfig, Selection),
    "bisect": (
        Server,
        Targets,
        BisectOptions,
        ChaseOptions,
        ControlOptions,
        PoolOptions,
        ReplayPolicy,
        WatchConfig,
        Selection,
        MetricsOptions,
        VaryOptions,
    ),
    "verify": (Server, Targets, VerifyOptions, WatchConfig, VaryOptions),
    "soak": (Server, Targets, SoakOptions, ReplayPolicy, WatchConfig, Selection),
    "sweep": (Targets, SweepOptions, ReplayPolicy, WatchConfig, Selection, CompareOptions),
    "compare": (CompareOptions,),
    "inspect": (Selection,),
    "export": (Selection,),
    "synth": (SynthOptions,),
    "record": (RecordOptions, MetricsOptions),
    "serve": (ServeOptions,),
}
"""The declared options each verb takes, in the order ``--help`` shows them
(a class's fields are filtered by the verbs each declares)."""


def options_of(verb: str) -> dict[str, Spec]:
    """Every option ``verb`` takes from the CLI or a job, by parameter name."""
    out: dict[str, Spec] = {}
    for cls in VERBS[verb]:
        for s in exposed(cls, verb):
            out.setdefault(s.name, s)
    return out


def build(cls: type[Declared], values: Mapping[str, Any], verb: str) -> Any:
    """``cls`` from the parameter values ``verb`` was given (a parsed command
    line, a job's options); the rest at their defaults."""
    return from_values(cls, values, verb=verb)


def spelling(param: str) -> str:
    """The CLI flag of a parameter (for error messages)."""
    for classes in VERBS.values():
        for cls in classes:
            for s in specs(cls):
                if s.name == param and s.exposed:
                    return s.spelling
    return "--" + param.replace("_", "-")
