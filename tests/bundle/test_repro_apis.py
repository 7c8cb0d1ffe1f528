"""A bundle's repro.py knows each API's end of stream (chat ``[DONE]``,
Messages ``message_stop``, Responses ``response.completed`` and its failed
and incomplete ends) the way the replay does: it exits 0 against a healthy
server and 1 against the faulty one, for a bundle of each API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayer import api as rapi
from replayer.bundle import repro
from replayer.bundle.export import write_bundle
from replayer.options import Server, WatchConfig
from replayer.options.trace import SynthOptions
from replayer.session import Outcome
from replayer.trace import Trace
from replayer.trace.synth import write_trace
from replayer.wire import SSEDecoder, accumulator, api_for_path
from replayer.wire.apis import ACCUMULATORS, PATHS
from tests.helpers.bundles import run_repro

MODEL = "moonshotai/Kimi-K3"
APIS = ("chat", "messages", "responses")
QUICK = WatchConfig(health_interval=0.2, settle=1.0, grace=0.5)
FAULTY = ["--speed", "instant", "--fault", "dead when request=4"]


def api_bundle(tmp_path: Path, api: str) -> Path:
    """A bundle of two 3-turn sessions recorded over ``api``."""
    p = tmp_path / f"{api}.arrow"
    write_trace(
        p,
        SynthOptions(
            sessions=2, turns=3, context=5_000, max_tokens=4, model=MODEL, seed=9, api=api
        ),
    )
    t = Trace.open(p)
    return write_bundle(
        tmp_path / f"bundle-{api}",
        trace=t,
        trace_sha256="x" * 64,
        rows=t.order,
        manifest={"policy": {"timing": "asap"}, "signature": None, "prefix_length": 6},
        trials=[{"trial": 1}],
    )


@pytest.mark.parametrize("api", APIS)
def test_each_apis_repro_exits_0_on_a_healthy_server_and_1_on_the_faulty_one(
    tmp_path, emulator_factory, api
):
    b = api_bundle(tmp_path, api)
    path = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}.get(api, "/v1/responses")
    rows = [json.loads(line) for line in (b / "requests.jsonl").read_text().splitlines()]
    assert {r["path"] for r in rows} == {path}
    good = emulator_factory(["--speed", "instant"])
    res = run_repro(b, good.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no failure: all 6 requests completed" in res.stdout
    assert res.stdout.count(" ok (") == 6  # every stream read to its end
    bad = emulator_factory(FAULTY)
    res = run_repro(b, bad.url)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SERVER FAILED" in res.stdout
    assert "/health now: 503" in res.stdout
    # the three before the trigger completed: only the dead engine failed the run
    assert res.stdout.count(" ok (") == 3, res.stdout
    # bundle verify reads the same ends (the replay's wire layer): a clean run
    # on the healthy server, the crash on a faulty one
    for emu, outcome in ((good, Outcome.PASS), (emulator_factory(FAULTY), Outcome.MATCH)):
        got = rapi.verify_bundle_sync(
            b,
            Server(url=emu.url),
            runs=1,
            out=tmp_path / f"v{outcome.value}",
            watch=QUICK,
            say=lambda m: None,
        )
        assert [r.outcome for r in got.runs] == [outcome], got
        if outcome is Outcome.PASS:
            (run,) = got.runs
            assert run.run is not None
            assert run.run.summary["targets"]["target"]["status"] == {"ok": 6}


def _events(lines: list[str]) -> bytes:
    return "".join(f"data: {ln}\n\n" for ln in lines).encode()


STREAMS: dict[str, list[tuple[bytes, bool]]] = {
    "/v1/chat/completions": [
        (_events(['{"choices":[{"index":0,"delta":{"content":"a"}}]}', "[DONE]"]), True),
        (_events(['{"choices":[{"index":0,"delta":{"content":"a"}}]}']), False),
    ],
    "/v1/completions": [
        (_events(['{"choices":[{"index":0,"text":"a"}]}', "[DONE]"]), True),
        (_events(['{"choices":[{"index":0,"text":"a"}]}']), False),
    ],
    "/v1/messages": [
        (
            _events(
                [
                    '{"type":"message_start","message":{"usage":{"input_tokens":3}}}',
                    '{"type":"content_block_delta","index":0,'
                    '"delta":{"type":"text_delta","text":"a"}}',
                    '{"type":"message_delta","delta":{"stop_reason":"end_turn"}}',
                    '{"type":"message_stop"}',
                ]
            ),
            True,
        ),
        (_events(['{"type":"message_delta","delta":{"stop_reason":"end_turn"}}']), False),
        (_events(['{"type":"ping"}', "[DONE]"]), True),
    ],
    "/v1/responses": [
        (
            _events(
                [
                    '{"type":"response.output_text.delta","delta":"a"}',
                    f'{{"type":"{end}","response":{{"status":"x"}}}}',
                ]
            ),
            True,
        )
        for end in ("response.completed", "response.incomplete", "response.failed")
    ]
    + [(_events(['{"type":"response.output_text.delta","delta":"a"}']), False)],
}


@pytest.mark.inprocess
def test_repro_reads_each_apis_end_as_the_replay_does():
    """repro.py is standard library only, so it keeps its own table of each
    API's end of stream: the table names the replay's own end markers (the
    wire layer's, which ``bundle verify`` reads through), for every API,
    and the two readings agree on every stream here."""
    assert [end for end, _ in repro.STREAM_ENDS] == [end for end, _ in PATHS]
    for end, api in PATHS:
        wire = {m.decode() for m in ACCUMULATORS[api].end_markers}
        assert repro.stream_ends("/v1" + end) == wire, api
    for path, streams in STREAMS.items():
        api = api_for_path(path)
        assert api is not None
        for raw, ended in streams:
            acc = accumulator(api)
            for ev in SSEDecoder().feed(raw):
                acc.event(ev, 0.0)
            ends = repro.stream_ends(path)
            mine = any(
                repro.stream_end(p, None if p == "[DONE]" else json.loads(p), ends)
                for p in (ln[6:] for ln in raw.decode().split("\n") if ln.startswith("data: "))
            )
            assert (acc.reply.done, mine) == (ended, ended), (path, raw)


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("event", "error"),
    [
        ({"error": {"message": "m", "code": 500}}, {"message": "m", "code": 500}),
        ({"type": "error", "error": {"type": "api_error", "message": "m"}}, None),
        ({"type": "error", "code": "server_error", "message": "m"}, None),
        ({"object": "error", "message": "m", "code": 400}, None),
        ({"type": "response.failed", "response": {"error": {"message": "m"}}}, {"message": "m"}),
        ({"type": "response.completed", "response": {"error": None}}, "none"),
        ({"choices": [], "error": None}, "none"),
    ],
)
def test_repro_finds_the_error_in_every_apis_shape(event, error):
    got = repro.error_of(event)
    if error == "none":
        assert got is None
    elif error is None:
        expected = event.get("error") if isinstance(event.get("error"), dict) else event
        assert got == expected
    else:
        assert got == error
