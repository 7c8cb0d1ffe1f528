"""Helpers shared by replayer's tests and by users' tests.

* :mod:`replayer.testing.virtual` - a replay on virtual time:
  :class:`VirtualClock`, :class:`FakeServer` (a transport that answers as
  scripted, per request: :class:`Script`; what it took: :class:`Arrival`)
  and :class:`FakeHealth` (a scripted ``/health`` prober), importable from
  here;
* :mod:`replayer.testing.faultproxy` - :class:`FaultProxy`, a TCP relay
  on loopback that breaks the network in front of a server on cue (a reset,
  a half-open connection, a stall, refused connects: :class:`Fault`),
  importable from here;
* :mod:`replayer.testing.fakes` - :class:`~replayer.testing.fakes.FakeRunner`,
  a bisect target whose crashes are planted;
* :mod:`replayer.testing.emulator` - the vLLM emulator as a real subprocess
  (:class:`~replayer.testing.emulator.EmulatorProcess`);
* :mod:`replayer.testing.pytest_plugin` - the ``emulator_factory`` and
  ``emulator`` fixtures built on it (enable with
  ``pytest_plugins = ["replayer.testing.pytest_plugin"]``).

Importing this package imports nothing heavy: the names above load on
first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replayer.testing.faultproxy import Fault, FaultKind, FaultProxy
    from replayer.testing.virtual import Arrival, FakeHealth, FakeServer, Script, VirtualClock

_HOME = {
    **dict.fromkeys(("Arrival", "FakeHealth", "FakeServer", "Script", "VirtualClock"), "virtual"),
    **dict.fromkeys(("Fault", "FaultKind", "FaultProxy"), "faultproxy"),
}
__all__ = [
    "Arrival",
    "FakeHealth",
    "FakeServer",
    "Fault",
    "FaultKind",
    "FaultProxy",
    "Script",
    "VirtualClock",
]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(f"replayer.testing.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
