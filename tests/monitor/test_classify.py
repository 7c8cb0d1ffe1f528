"""The classification rules, case by case (the evidence is built by hand)."""

from __future__ import annotations

import pytest

from replayer.monitor.classify import Evidence, FailureClass, classify, is_engine_death_message
from replayer.monitor.health import Probe

pytestmark = pytest.mark.inprocess

OK = Probe(t=1.0, status=200, latency=0.001)
DEAD = Probe(t=1.0, status=503, latency=0.001)
GONE = Probe(t=2.0, status=None, latency=0.001, error="refused")
MSG_033 = "The server had an error while processing your request."
MSG_OLD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


@pytest.mark.parametrize(
    "ev,expected",
    [
        # engine died, the API answered 503 and then exited: process_exit
        (Evidence("stream_error", 200, MSG_033, (DEAD, GONE)), FailureClass.PROCESS_EXIT),
        (
            Evidence("stream_error", 200, MSG_033, (DEAD,), process_exited=True),
            FailureClass.PROCESS_EXIT,
        ),
        (Evidence("connect", None, "refused", ()), FailureClass.PROCESS_EXIT),
        # engine dead, API stays up
        (Evidence("stream_error", 200, MSG_033, (DEAD, DEAD)), FailureClass.ENGINE_DEAD),
        (Evidence("http_500", 500, MSG_OLD, (OK,)), FailureClass.ENGINE_DEAD),
        (Evidence("http_500", 500, "x", (OK,), death_bodies=2), FailureClass.ENGINE_DEAD),
        # hangs
        (Evidence("hang", None, "", (OK,), hang=True), FailureClass.HANG),
        (Evidence("timeout", None, "no complete response", (OK,)), FailureClass.HANG),
        (Evidence("timeout", None, "no complete response", ()), FailureClass.HANG),
        # a cut stream on a healthy server
        (Evidence("stream_cut", 200, "ended without [DONE]", (OK,)), FailureClass.STREAM_CUT),
        (Evidence("disconnected", None, "reset", (OK,)), FailureClass.STREAM_CUT),
        # other server errors, the server healthy
        (
            Evidence("stream_error", 200, "Internal server error", (OK,)),
            FailureClass.HTTP_5XX_OTHER,
        ),
        (
            Evidence("http_503", 503, "The engine is currently busy", (OK,)),
            FailureClass.HTTP_5XX_OTHER,
        ),
        # the client's fault
        (Evidence("http_400", 400, "maximum context length", (OK,)), FailureClass.CLIENT_ERROR),
    ],
)
def test_rules(ev, expected):
    assert classify(ev) is expected


@pytest.mark.parametrize(
    "ev,expected",
    [
        # through a hop, the target's own /health 200 throughout: the way broke
        (Evidence("disconnected", None, "reset", (OK, OK), direct=True), FailureClass.NETWORK),
        (Evidence("stream_cut", 200, "no [DONE]", (OK,), direct=True), FailureClass.NETWORK),
        (Evidence("connect", None, "refused", (OK,), direct=True), FailureClass.NETWORK),
        (
            Evidence("hang", None, "", (OK,), hang=True, direct=True, idle=True),
            FailureClass.NETWORK,
        ),
        (Evidence("timeout", None, "", (OK,), direct=True, idle=True), FailureClass.NETWORK),
        # ... unless the server's own word says otherwise
        (Evidence("hang", None, "", (OK,), hang=True, direct=True, idle=False), FailureClass.HANG),
        (Evidence("hang", None, "", (OK,), hang=True, direct=True), FailureClass.HANG),
        (Evidence("timeout", None, "", (OK,), direct=True), FailureClass.HANG),
        (Evidence("disconnected", None, "", (OK, DEAD), direct=True), FailureClass.ENGINE_DEAD),
        (Evidence("disconnected", None, "", (OK, GONE), direct=True), FailureClass.PROCESS_EXIT),
        (
            Evidence("connect", None, "", (OK,), direct=True, process_exited=True),
            FailureClass.PROCESS_EXIT,
        ),
        (Evidence("disconnected", None, "", (), direct=True), FailureClass.STREAM_CUT),
        # the server answered: not the network's doing
        (Evidence("http_500", 500, "boom", (OK,), direct=True), FailureClass.HTTP_5XX_OTHER),
        # no hop known: the client's view alone cannot tell, the old classes stand
        (Evidence("disconnected", None, "reset", (OK,)), FailureClass.STREAM_CUT),
        (Evidence("connect", None, "refused", (OK,)), FailureClass.PROCESS_EXIT),
    ],
)
def test_network_rule(ev, expected):
    assert classify(ev) is expected


def test_network_is_no_crash():
    assert not FailureClass.NETWORK.is_crash and FailureClass.STREAM_CUT.is_crash


def test_engine_death_messages_of_every_version():
    assert is_engine_death_message(MSG_033)
    assert is_engine_death_message(MSG_OLD)
    assert is_engine_death_message("MQLLMEngine is already dead, terminating server process")
    assert not is_engine_death_message("Internal server error")
    assert not is_engine_death_message("")
    assert not is_engine_death_message(None)
    assert not FailureClass.CLIENT_ERROR.is_crash and FailureClass.HANG.is_crash
