"""The server under test and its lifecycle: launch, ready, reset, restart, stop.

Replay, ``check`` and minimization all hold the server through
:class:`Target`; :func:`make_target` builds one from ``--launch``,
``--restart-cmd``/``--log-cmd`` or ``--url``. See :mod:`.base` for readiness
and resets, :mod:`.process` for launched process groups, :mod:`.remote` for
servers run by someone else, :mod:`.facts` for what a repro bundle records.
"""

from replayer.target.base import (
    DEFAULT_READY_TIMEOUT,
    ExitInfo,
    ResetMode,
    ResetResult,
    ServerTarget,
    Target,
    reset_mode,
)
from replayer.target.factory import make_target, url_from_command
from replayer.target.facts import ServerFacts, redact_command, relevant_env
from replayer.target.process import DEFAULT_STOP_GRACE, LaunchedTarget, split_command
from replayer.target.remote import ExternalTarget, RestartableTarget

__all__ = [
    "DEFAULT_READY_TIMEOUT",
    "DEFAULT_STOP_GRACE",
    "ExitInfo",
    "ExternalTarget",
    "LaunchedTarget",
    "ResetMode",
    "ResetResult",
    "RestartableTarget",
    "ServerFacts",
    "ServerTarget",
    "Target",
    "make_target",
    "redact_command",
    "relevant_env",
    "reset_mode",
    "split_command",
    "url_from_command",
]
