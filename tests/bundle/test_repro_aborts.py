"""A bundle's repro.py replays client aborts as the replay does: a request
the recorded client left after N streamed events is left after N events
(the emulator's request log says where), or after its recorded time; it is
``aborted``, by design, neither a failure nor a cut stream; a fault that
needs the abort fires; the manifest policy's ``aborts: complete`` reads the
answer to its end. The abort point travels in ``requests.jsonl`` as each
line's ``abort`` (``replayer.trace.export``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from replayer.bundle import repro
from replayer.bundle.export import write_bundle
from replayer.options.trace import SynthOptions
from replayer.replay.aborts import abort_point
from replayer.testing.emulator import EmulatorProcess
from replayer.trace import Trace
from replayer.trace.export import abort_mark
from replayer.trace.model import RequestRecord
from replayer.trace.synth import write_trace
from tests.helpers.bundles import run_repro

MODEL = "moonshotai/Kimi-K3"
N = 4
"""Events the recorded client read before it left: the role event and 3 tokens."""
# a decode step of 0.2 s: the disconnect reaches the server long before its next token
EMU = ["--decode-time", "0.2", "--seed", "3"]
FAULT = "exit code=1 when abort>=1"
MIDDLE = "synth-00000-t001"
"""The request the recorded client left (the session's middle turn)."""


@pytest.mark.inprocess
@pytest.mark.parametrize(
    "meta",
    [
        None,
        {"session": "new"},
        {"abort": {"after_chunks": 3, "after_us": 900}},
        {"abort": {"after_chunks": 0, "after_us": 900}},
        {"abort": {"after_us": 1500}},
        {"abort": {"after_chunks": True}},
        {"abort": {"after_chunks": -2, "after_us": -1}},
        {"abandoned": "client", "events": 5, "timing_us": {"done": 70}},
        {"abandoned": "client", "events": 0},
        {"abandoned": "shutdown", "events": 5, "timing_us": {"done": 70}},
    ],
)
def test_repro_reads_the_exported_abort_as_the_replay_reads_meta(meta):
    """repro.py is standard library only: it reads the line's ``abort`` with
    its own code, which must agree with the replay's reading of ``meta``
    (old recordings' ``abandoned`` mark included) for every shape."""
    mark = abort_mark(meta)
    line: dict[str, Any] = {} if mark is None else {"abort": mark}
    want = abort_point(meta)
    got = repro.abort_of(line)
    assert got == (None if want is None else (want.after_chunks, want.after_us))


def _bundle(tmp_path: Path, abort: dict[str, int], **policy: Any) -> Path:
    """A bundle of one 3-turn chat session whose middle turn the recorded
    client left at ``abort``."""
    p = tmp_path / "t.arrow"
    write_trace(
        p,
        SynthOptions(sessions=1, turns=3, context=2_000, max_tokens=8, model=MODEL, seed=9),
    )
    t = Trace.open(p)

    def mark(rec: RequestRecord) -> RequestRecord:
        if rec.turn != 1:
            return rec
        return dataclasses.replace(rec, finish_reason=None, meta={"abort": abort})

    return write_bundle(
        tmp_path / "bundle",
        trace=t,
        trace_sha256="x" * 64,
        rows=t.order,
        manifest={"policy": {"timing": "asap", **policy}, "signature": None},
        edit=mark,
    )


def _statuses(stdout: str) -> list[str]:
    """Each request's status word, in trace order."""
    return [ln.split()[1].rstrip(":") for ln in stdout.splitlines() if ln.startswith("  ")]


def _aborts(emu: EmulatorProcess) -> list[tuple[str, int, int]]:
    """(X-Request-Id, delivered, aborts) of each abort the emulator saw."""
    log = emu.read_request_log()
    ids = {e["n"]: e["request_id"] for e in log if e["event"] == "request"}
    return [(ids[e["n"]], e["delivered"], e["aborts"]) for e in log if e["event"] == "abort"]


def test_an_abort_after_n_events_is_replayed_and_is_no_failure(tmp_path, emulator_factory):
    b = _bundle(tmp_path, {"after_chunks": N, "after_us": 5_000_000})
    lines = [json.loads(ln) for ln in (b / "requests.jsonl").read_text().splitlines()]
    assert [ln.get("abort") for ln in lines] == [
        None, {"after_chunks": N, "after_us": 5_000_000}, None,
    ]  # fmt: skip
    emu = emulator_factory(EMU)
    res = run_repro(b, emu.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 client abort(s): replay" in res.stdout
    assert _statuses(res.stdout) == ["ok", "aborted", "ok"], res.stdout
    assert f"disconnected on purpose after {N} streamed event(s)" in res.stdout
    assert "no failure: all 3 requests completed or left as recorded (1 aborted" in res.stdout
    # server-side: the client left after the role event and 3 tokens
    assert _aborts(emu) == [(MIDDLE, N - 1, 1)]


def test_a_crash_that_needs_the_abort_fails_the_repro(tmp_path, emulator_factory):
    b = _bundle(tmp_path, {"after_chunks": N})
    emu = emulator_factory([*EMU, "--fault", FAULT])
    res = run_repro(b, emu.url)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SERVER FAILED" in res.stdout
    statuses = _statuses(res.stdout)
    assert statuses[:2] == ["ok", "aborted"], res.stdout
    assert statuses[2] in ("transport", "HTTP", "cut"), res.stdout  # the engine died on the abort
    fired = [e for e in emu.read_request_log() if e["event"] == "trigger" and e["fired"]]
    assert [e["on"] for e in fired] == ["abort"]
    assert emu.wait_exit() == 1


def test_aborts_complete_in_the_manifest_reads_the_answer_to_its_end(tmp_path, emulator_factory):
    b = _bundle(tmp_path, {"after_chunks": N}, aborts="complete")
    emu = emulator_factory([*EMU, "--fault", FAULT])
    res = run_repro(b, emu.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 client abort(s): complete" in res.stdout
    assert _statuses(res.stdout) == ["ok", "ok", "ok"], res.stdout
    assert "no failure: all 3 requests completed;" in res.stdout
    assert _aborts(emu) == [] and emu.returncode is None


def test_an_abort_before_the_first_event_is_replayed_after_its_time(tmp_path, emulator_factory):
    # 0.5 s: past the first events, long before the 8th token (1.6 s of decode)
    b = _bundle(tmp_path, {"after_us": 500_000})
    emu = emulator_factory(EMU)
    res = run_repro(b, emu.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _statuses(res.stdout) == ["ok", "aborted", "ok"], res.stdout
    assert "disconnected on purpose after 0.5 s" in res.stdout
    ((rid, delivered, aborts),) = _aborts(emu)
    assert (rid, aborts) == (MIDDLE, 1) and delivered < 8
