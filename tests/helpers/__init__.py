"""What the test files share: helpers (functions, constants, small classes),
one module per topic. A test file imports from here, from ``replayer`` and
from third-party libraries, never from another test file or a conftest.py
(``tests/check_mirror.py`` fails on that); conftest.py files keep only
fixtures and hooks, and their fixtures call what is here.

Modules: :mod:`~tests.helpers.net` (loopback ports), :mod:`~tests.helpers.cli`
(the CLI as a subprocess), :mod:`~tests.helpers.traces` (trace writers and
the committed older-schema fixtures), :mod:`~tests.helpers.importers`,
:mod:`~tests.helpers.bundles`, :mod:`~tests.helpers.agents` (agent-API
requests and a stream reader), :mod:`~tests.helpers.emulator`,
:mod:`~tests.helpers.engine`, :mod:`~tests.helpers.wire`,
:mod:`~tests.helpers.record`, :mod:`~tests.helpers.replay`,
:mod:`~tests.helpers.bisect`, :mod:`~tests.helpers.vllm_logs`,
:mod:`~tests.helpers.analysis`, :mod:`~tests.helpers.service`,
:mod:`~tests.helpers.target`, :mod:`~tests.helpers.conformance`,
:mod:`~tests.helpers.realvllm`, :mod:`~tests.helpers.agent_sessions`, and
:mod:`~tests.helpers.inprocess`, the in-process tier's guard (a pytest
plugin the root conftest.py loads).
"""
