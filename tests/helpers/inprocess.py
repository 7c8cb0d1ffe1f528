"""The in-process tier's guard (a pytest plugin; tests/conftest.py loads it).

A test module marked ``pytestmark = pytest.mark.inprocess`` promises to run
in this process: no subprocess, no fork, and no socket beyond loopback (an
in-process fake on 127.0.0.1 is fine; so are the event loop's own Unix
socket pairs). While such a test runs - its setup, call and teardown - the
guard holds that promise: starting a process (``subprocess.Popen``,
``asyncio.create_subprocess_exec``/``_shell``, ``os.fork``, ``os.posix_spawn``,
``os.system``, multiprocessing's spawn), connecting or binding a socket to
an address that is not loopback, or resolving a name other than
``localhost`` fails the test with a line that says what was attempted. The
attempt raises :class:`InProcessViolation`, which no ``except Exception``
in the code under test swallows, and the test fails even if something
caught it anyway.

``make test-fast`` runs ``pytest -m inprocess`` with
``REPLAYER_TEST_INPROCESS=1``: with that variable the guard holds for every
test that runs, marked or not, which is also how to try a module before
marking it (``REPLAYER_TEST_INPROCESS=1 pytest tests/x/test_y.py``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import platform
import re
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

MARKER = "inprocess"
ENV = "REPLAYER_TEST_INPROCESS"
SELECTS_ONLY_THE_TIER = re.compile(rf"\s*{MARKER}(\s+and\s+.*)?")
"""A ``-m`` expression that selects marked tests only (``inprocess and not slow``)."""
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class InProcessViolation(BaseException):
    """An in-process test started a process or reached past loopback.

    A BaseException, so that the code under test's ``except Exception``
    (a replay records a failed connect as a result) does not hide it."""


def is_loopback(host: object) -> bool:
    """Whether ``host`` (an address's host part) is loopback, never the
    wildcard: ``""``/``0.0.0.0``/``::`` bind every interface."""
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str) or not host:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def address_allowed(family: int, address: Any) -> bool:
    """A Unix socket's path, or an IP address on loopback."""
    if family == getattr(socket, "AF_UNIX", None):
        return True
    if isinstance(address, tuple) and address:
        return is_loopback(address[0])
    return False


class Guard:
    """The patches, installed for one test; ``violations`` is what it refused."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.violations: list[str] = []

    def refuse(self, what: str) -> InProcessViolation:
        line = (
            f"{self.nodeid} is in-process (marker {MARKER!r} or {ENV}=1) but {what}: "
            "move it out of the in-process tier or fake that part"
        )
        self.violations.append(line)
        return InProcessViolation(line)

    @contextmanager
    def installed(self) -> Iterator[Guard]:
        with pytest.MonkeyPatch.context() as mp:
            self._processes(mp)
            self._sockets(mp)
            yield self

    def _processes(self, mp: pytest.MonkeyPatch) -> None:
        def refusing(name: str, skip: int = 0) -> Callable[..., Any]:
            def refuse(*args: Any, **kw: Any) -> Any:
                shown = f" {args[skip]!r}" if len(args) > skip else ""
                raise self.refuse(f"started a process ({name}{shown})")

            return refuse

        # the child's start, not Popen.__init__: a Popen that failed there
        # closes its pipes and is collected without a warning
        mp.setattr(subprocess.Popen, "_execute_child", refusing("subprocess.Popen", skip=1))
        mp.setattr(asyncio, "create_subprocess_exec", refusing("asyncio.create_subprocess_exec"))
        mp.setattr(asyncio, "create_subprocess_shell", refusing("asyncio.create_subprocess_shell"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                mp.setattr(os, name, refusing(f"os.{name}"))
        try:
            import _posixsubprocess  # multiprocessing's spawn and forkserver
        except ImportError:  # pragma: no cover - not POSIX
            return
        mp.setattr(_posixsubprocess, "fork_exec", refusing("_posixsubprocess.fork_exec"))

    def _sockets(self, mp: pytest.MonkeyPatch) -> None:
        guard = self

        def checked(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
            def method(sock: socket.socket, address: Any, *args: Any) -> Any:
                if not address_allowed(sock.family, address):
                    raise guard.refuse(f"called socket.{name}({address!r}) past loopback")
                return real(sock, address, *args)

            return method

        for name in ("connect", "connect_ex", "bind"):
            mp.setattr(socket.socket, name, checked(name, getattr(socket.socket, name)))
        real_getaddrinfo = socket.getaddrinfo

        def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
            if host is not None and not is_loopback(host):
                raise guard.refuse(f"resolved {host!r} (only loopback names and addresses)")
            return real_getaddrinfo(host, *args, **kw)

        mp.setattr(socket, "getaddrinfo", getaddrinfo)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m`` selecting marked tests only (``make test-fast``), a test file whose
    source never says ``inprocess`` holds no test of the tier: it is not
    even imported (collection is most of a fast run's start-up)."""
    if not SELECTS_ONLY_THE_TIER.fullmatch(config.option.markexpr or ""):
        return None
    if not collection_path.is_file():
        return None
    if not (collection_path.name.startswith("test_") and collection_path.suffix == ".py"):
        return None
    return MARKER.encode() not in collection_path.read_bytes() or None


def guarded(item: pytest.Item) -> bool:
    return os.environ.get(ENV) == "1" or item.get_closest_marker(MARKER) is not None


_GUARDS = pytest.StashKey[dict[str, Guard]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_GUARDS] = {}
    # The standard library learns the processor by running ``uname -p``, once
    # a process, the first time anything asks (the openai SDK does, for its
    # headers): asked here, before any test, so no test starts that process.
    platform.uname().processor  # noqa: B018


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if not guarded(item):
        return (yield)
    guard = Guard(item.nodeid)
    item.config.stash[_GUARDS][item.nodeid] = guard
    try:
        with guard.installed():
            return (yield)
    finally:
        item.config.stash[_GUARDS].pop(item.nodeid, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A phase that passed although the guard refused something (the code
    under test caught the violation) fails with the guard's first line."""
    report: pytest.TestReport = yield
    guard = item.config.stash[_GUARDS].get(item.nodeid)
    if guard is not None and guard.violations and report.passed:
        report.outcome = "failed"
        report.longrepr = guard.violations[0]
        guard.violations.clear()
    elif guard is not None and report.failed:
        guard.violations.clear()
    return report
