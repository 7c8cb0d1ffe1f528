"""The one front door: every verb of replayer as a function of typed options.

The command line, ``replayer demo`` and the job service only parse, call
one of these, and print; so a job typed in a shell, submitted to the
service or scripted from Python runs the same code with the same defaults.
Each verb builds a :class:`~replayer.session.Session` (the trace, its
selection, the policy, the servers, the chase) once and runs over it.

Everything here returns typed results and raises only
:class:`~replayer.errors.ReplayerError` subclasses, worded in parameter
names; a crashing server is a *result* (``result.failed``), never an
exception. Each coroutine has a ``*_sync`` twin for scripts without an event
loop.

These live in ``replayer.api`` (``from replayer import api``) rather than as
``replayer.replay()``: ``replayer.replay`` is the replay *package*, and a
function of that name would shadow it.
"""

from __future__ import annotations

from replayer.api._analysis import compare, report, sweep, sweep_sync
from replayer.api._bisect import FromRun, OracleFunction, bisect, bisect_sync, from_run
from replayer.api._common import DEFAULT_WATCH
from replayer.api._diagnose import DiagnoseResult, diagnose_bundle, diagnose_bundle_sync
from replayer.api._replay import (
    check,
    check_sync,
    replay,
    replay_sync,
    soak,
    soak_sync,
    vary,
    vary_sync,
    verify_bundle,
    verify_bundle_sync,
)
from replayer.api._results import (
    CheckResult,
    EndpointResult,
    FailureInfo,
    RateResult,
    ReplayResult,
    RunPaths,
    RunStatus,
    Written,
)
from replayer.api._servers import emulate, record, serve
from replayer.api._traces import convert, export, import_trace, inspect, merge, synth
from replayer.options.server import Endpoint, Server
from replayer.session import open_trace

__all__ = [
    "DEFAULT_WATCH",
    "CheckResult",
    "DiagnoseResult",
    "Endpoint",
    "FromRun",
    "EndpointResult",
    "FailureInfo",
    "OracleFunction",
    "RateResult",
    "ReplayResult",
    "Written",
    "RunPaths",
    "RunStatus",
    "Server",
    "bisect",
    "bisect_sync",
    "check",
    "check_sync",
    "compare",
    "convert",
    "diagnose_bundle",
    "diagnose_bundle_sync",
    "emulate",
    "export",
    "from_run",
    "import_trace",
    "inspect",
    "merge",
    "open_trace",
    "record",
    "replay",
    "replay_sync",
    "report",
    "serve",
    "soak",
    "soak_sync",
    "sweep",
    "sweep_sync",
    "synth",
    "vary",
    "vary_sync",
    "verify_bundle",
    "verify_bundle_sync",
]
