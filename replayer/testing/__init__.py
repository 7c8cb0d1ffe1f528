"""Helpers shared by replayer's tests and by users' tests.

* :mod:`replayer.testing.emulator` - the vLLM emulator as a real subprocess
  (:class:`~replayer.testing.emulator.EmulatorProcess`);
* :mod:`replayer.testing.pytest_plugin` - the ``emulator_factory`` and
  ``emulator`` fixtures built on it (enable with
  ``pytest_plugins = ["replayer.testing.pytest_plugin"]``).

Importing this package imports nothing heavy.
"""
