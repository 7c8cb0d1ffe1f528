"""The in-process tier's guard (tests/helpers/inprocess.py) refuses what the
tier promises not to do - a process, a socket past loopback, a name
resolved - lets loopback through, and fails a test whose code under test
swallowed the refusal."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers.inprocess import Guard, InProcessViolation, address_allowed, is_loopback

pytestmark = pytest.mark.inprocess

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        (b"127.0.0.1", True),
        ("", False),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("example.com", False),
        (None, False),
    ],
)
def test_loopback_is_loopback_and_nothing_else(host, ok):
    assert is_loopback(host) is ok
    assert address_allowed(socket.AF_INET, (host, 80)) is ok


def test_unix_sockets_are_allowed():
    assert address_allowed(socket.AF_UNIX, "/tmp/x.sock")


def refused(fn) -> str:
    guard = Guard("t::x")
    with guard.installed(), pytest.raises(InProcessViolation) as info:
        fn()
    assert guard.violations == [str(info.value)]
    return str(info.value)


def test_processes_are_refused():
    msg = refused(lambda: subprocess.run(["true"], check=False))
    assert msg == (
        "t::x is in-process (marker 'inprocess' or REPLAYER_TEST_INPROCESS=1) but started a "
        "process (subprocess.Popen ['true']): move it out of the in-process tier or fake that part"
    )
    assert "(os.fork)" in refused(lambda: os.fork())
    assert "(os.system 'true')" in refused(lambda: os.system("true"))

    async def child():
        await asyncio.create_subprocess_exec(sys.executable, "-c", "1")

    assert "(asyncio.create_subprocess_exec " in refused(lambda: asyncio.run(child()))


def test_sockets_past_loopback_are_refused_and_loopback_is_not():
    with socket.socket() as s:
        assert "called socket.bind(('0.0.0.0', 0)) past loopback" in refused(
            lambda: s.bind(("0.0.0.0", 0))
        )
    with socket.socket() as s:
        assert "socket.connect(('192.0.2.1', 9)) past loopback" in refused(
            lambda: s.connect(("192.0.2.1", 9))
        )
    assert "resolved 'example.com'" in refused(lambda: socket.getaddrinfo("example.com", 80))
    guard = Guard("t::x")
    with guard.installed(), socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
        assert socket.getaddrinfo("localhost", 80)
    assert guard.violations == []


def test_the_guard_is_gone_after_the_test():
    before = (subprocess.Popen._execute_child, socket.socket.connect, socket.getaddrinfo)
    with Guard("t::x").installed():
        assert socket.getaddrinfo is not before[2]
    assert (subprocess.Popen._execute_child, socket.socket.connect, socket.getaddrinfo) == before


def test_a_swallowed_refusal_still_fails_the_test(pytester):
    pytester.makeconftest('pytest_plugins = ["tests.helpers.inprocess"]')
    pytester.makepyfile(
        test_swallow="""
        import subprocess
        import pytest

        pytestmark = pytest.mark.inprocess

        def test_swallows():
            try:
                subprocess.run(["true"])
            except BaseException:
                pass

        def test_unmarked_is_free_to_fail_otherwise():
            pass
        """
    )
    pytester.makeini("[pytest]\nmarkers =\n    inprocess: in-process\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_swallows is in-process*started a process*"])
