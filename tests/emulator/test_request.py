"""A request's output channel in the simulated engine: the handler takes
everything new since it last looked (tokens merged), the finish with the
last tokens, and an error in place of what was not delivered."""

from __future__ import annotations

import asyncio

import pytest

from replayer.emulator.request import DEAD, Output, Request

pytestmark = pytest.mark.inprocess


def request(**kw) -> Request:
    return Request(
        n=1, engine_id="chatcmpl-x-0", prompt_len=100, hashes=[], max_tokens=8,
        length_reason="length", params_max_tokens=8, arrival=0.0, **kw,
    )  # fmt: skip


def test_take_merges_what_is_new_since_the_last_look():
    r = request()
    assert r.take() == Output(0, 0)
    r.num_output = 3
    assert (r.take(), r.num_tokens) == (Output(0, 3), 103)
    r.num_output, r.finish = 8, "length"
    assert r.take() == Output(3, 5, "length")
    assert r.take() == Output(8, 0, "length")


def test_an_error_replaces_the_tokens_not_yet_delivered():
    r = request()
    r.num_output = 2
    r.take()
    r.num_output, r.error, r.cut = 5, DEAD, True
    assert r.take() == Output(2, 0, error="dead", cut=True)
    assert r.delivered == 2


async def test_next_is_what_take_gives_once_there_is_something_new():
    r = request()
    pending = asyncio.gather(r.next())  # the handler, waiting on the event
    r.num_output, r.finish = 2, "stop"
    r.event.set()
    assert await asyncio.wait_for(pending, 5) == [Output(0, 2, "stop")]
    assert not r.event.is_set()
    assert await asyncio.wait_for(r.next(), 5) == Output(2, 0, "stop")  # finished: no wait
