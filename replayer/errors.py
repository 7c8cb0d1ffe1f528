"""The exception tree. A crashing target is the product, not an error: trial
outcomes and target failures are values, never exceptions.

    ReplayerError            # base; the CLI prints one line and exits 2
      UsageError             # bad arguments or options
        OptionError          # one parameter's value (names the parameter, not a flag)
        ModelNotServed       # the server lists other models than the ones asked for
      TraceError             # unreadable, invalid or mismatched trace input
        SchemaVersionError   # written by a newer replayer; no migration path
        TraceCorruptError    # damaged content: a batch, a body, the footer
      ImportFormatError      # an importer was fed a file of another format
      TargetError            # launching, restarting or talking to the server under test
        LaunchError          # the server exited while loading, or never became ready
      OutputError            # an output file (run directory, journal, bundle) cannot be written
        DiskFullError        # ... because the disk is full, over quota or read-only
"""

from __future__ import annotations

from collections.abc import Sequence


class ReplayerError(Exception):
    """Base of every error replayer raises on purpose."""

    exit_code: int = 2


class UsageError(ReplayerError):
    """Bad command-line arguments or options."""


class OptionError(UsageError, ValueError):
    """A parameter has a value it cannot take. The message names the
    parameter (``max_inflight must be at least 1``); the CLI says its flag.
    It is a ``ValueError`` too: a bad value is one."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param} {problem}")
        self.param = param
        self.problem = problem


class ModelNotServed(UsageError):
    """The server's ``/v1/models`` lists other models than the trace (or
    ``--model``) names: one message whether replay finds it or a launch does
    (as soon as ``/v1/models`` answers: waiting would not change the list)."""

    def __init__(self, target: str, missing: Sequence[str], served: Sequence[str]) -> None:
        super().__init__(
            f"target {target} does not serve model {', '.join(missing)} (it serves "
            f"{', '.join(served)}); pass --model {served[0]}"
        )
        self.missing = list(missing)
        self.served = list(served)


class TraceError(ReplayerError):
    """A trace file is missing, unreadable, truncated or not a replayer trace."""


class SchemaVersionError(TraceError):
    """The trace was written by a newer schema version than this replayer reads."""


class TraceCorruptError(TraceError):
    """The file is a trace, but damaged: a message that does not read, a batch
    whose values no longer match their digests, a body that does not rebuild,
    a footer that contradicts the messages. Never a torn tail (a killed writer),
    which is dropped with a warning. The message names the file and the first
    bad batch or row."""


class ImportFormatError(ReplayerError):
    """An importer was given input that is not in its format."""


class TargetError(ReplayerError):
    """The server under test cannot be launched, restarted, reset or reached as
    asked (for example a restart of a target given by URL alone).

    A target that *crashes* is not an error: that is a trial outcome."""


class LaunchError(TargetError):
    """The server exited while loading, or did not become ready within its
    timeout; the message carries the reason and, when known, the log tail."""


class OutputError(ReplayerError):
    """An output file cannot be written. Raised once, by the first writer
    that fails; the run stops there, and what was already written stays
    whole (complete batches, whole journal lines, the previous file)."""

    def __init__(self, path: object, problem: str, hint: str = "") -> None:
        super().__init__(f"{path}: {problem}" + (f" ({hint})" if hint else ""))
        self.path = str(path)
        self.problem = problem


class DiskFullError(OutputError):
    """The disk is full (ENOSPC), the quota is spent (EDQUOT) or the file
    system is read-only (EROFS): bad luck, not a bug; free space and rerun
    (a bisect: ``--resume``)."""
