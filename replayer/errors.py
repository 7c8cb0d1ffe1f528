"""The exception tree. A crashing target is the product, not an error: trial
outcomes and target failures are values, never exceptions.

    ReplayerError            # base; the CLI prints one line and exits 2
      UsageError             # bad arguments or options
      TraceError             # unreadable, invalid or mismatched trace input
        SchemaVersionError   # written by a newer replayer; no migration path
      ImportFormatError      # an importer was fed a file of another format
"""

from __future__ import annotations


class ReplayerError(Exception):
    """Base of every error replayer raises on purpose."""

    exit_code: int = 2


class UsageError(ReplayerError):
    """Bad command-line arguments or options."""


class TraceError(ReplayerError):
    """A trace file is missing, unreadable, truncated or not a replayer trace."""


class SchemaVersionError(TraceError):
    """The trace was written by a newer schema version than this replayer reads."""


class ImportFormatError(ReplayerError):
    """An importer was given input that is not in its format."""
