"""One request through the replay client against the emulator: the API the
path names picks the accumulator, and what the result records."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from replayer.replay.client import HTTPTransport, stream_error_class
from replayer.replay.results import Result, Status
from replayer.replay.transport import Request
from replayer.wire import Reply

MODEL = "moonshotai/Kimi-K3"


async def one(url: str, body: dict[str, Any], **kw: Any) -> tuple[Result, Reply]:
    r = Result(target="t", row=0, request_id="r", session_id="s", turn=0)
    transport = HTTPTransport()
    try:
        loop = asyncio.get_running_loop()
        request = Request(
            url,
            orjson.dumps({"model": MODEL, **body}),
            {"Content-Type": "application/json"},
            r,
            t0=loop.time(),
            timeout=30,
            **kw,
        )
        await transport.handle(request)
    finally:
        transport.close()
    return r, request.stats


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
)
async def test_streams_of_both_apis(emulator, path, body):
    stream = {"stream": True, "max_tokens": 5, "stream_options": {"include_usage": True}}
    r, stats = await one(emulator.url + path, {**body, **stream}, keep_text=True)
    assert (r.status, r.http_status, r.chunks, r.completion_tokens) == (Status.OK, 200, 5, 5)
    assert r.first_token_us is not None and r.first_byte_us is not None
    assert r.first_byte_us <= r.first_token_us <= (r.done_us or 0)
    assert r.output_text and r.output_text == stats.text and r.output_hash == stats.output_hash
    assert r.finish_reason == "length" and stats.done


async def test_whole_body_and_an_error_status(emulator):
    url = emulator.url + "/v1/chat/completions"
    r, stats = await one(url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert (r.status, r.chunks, r.completion_tokens, r.output_text) == (Status.OK, 0, 3, None)
    assert stats.text is None and r.output_hash == stats.output_hash
    r, _ = await one(url, {"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert (r.status, r.http_status, r.error_class) == (Status.HTTP_ERROR, 404, "http_404")
    assert r.error is not None and "nope" in r.error


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("code", "message", "cls"),
    [
        (500, "The server had an error while processing your request.", "stream_error"),
        (400, "token id 999999 out of vocabulary", "stream_400"),
        ("422", "bad", "stream_422"),
        (400, "EngineCore encountered an issue. See stack trace", "stream_error"),
        (None, "x", "stream_error"),
    ],
)
def test_stream_error_class(code, message, cls):
    assert stream_error_class(code, message) == cls


async def test_a_request_refused_its_turn_is_never_written(emulator):
    # strict order's turn (``go``) comes after the connection is open; refused
    # (the run stopped meanwhile), nothing of the request reaches the server
    # and its result stays unsent; granted, it goes as usual
    url = emulator.url + "/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    asked: list[str] = []

    def turn(rid: str, granted: bool) -> Any:
        async def go() -> bool:
            asked.append(rid)
            await asyncio.sleep(0)  # the turn is awaited: the request waits in between
            return granted

        return go

    sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    r, _ = await one(url, body, go=turn("refused", False), sent=sent)
    assert sent.done()  # whatever happened: the next request is not held
    assert (r.status, r.seq, r.http_status, r.error_class, r.error, r.done_us) == (
        Status.SKIPPED,
        None,
        None,
        None,
        None,
        None,
    )
    r, _ = await one(url, body, go=turn("granted", True))
    assert (r.status, r.http_status) == (Status.OK, 200)
    assert asked == ["refused", "granted"]
    assert len([e for e in emulator.read_request_log() if e["event"] == "request"]) == 1
