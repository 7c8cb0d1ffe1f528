"""What the replay tests share: a synthetic trace, a replay into a run
directory, and the requests an emulator logged."""

from __future__ import annotations

from replayer.replay.plan import select
from replayer.replay.policy import ReplayPolicy
from replayer.replay.results import read_results
from replayer.replay.run import replay_to_dir
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace

MODEL = "moonshotai/Kimi-K3"  # the emulator's default served model


def synth(tmp_path, name="t.arrow", **kw):
    p = tmp_path / name
    write_trace(p, SynthOptions(model=MODEL, **{"max_tokens": 8, **kw}))
    return Trace.open(p)


async def replay(trace, targets, tmp_path, policy=None, name="run", **selection):
    rows = select(trace, **selection)
    out = tmp_path / name
    out.mkdir()
    outcome = await replay_to_dir(
        trace, rows, policy or ReplayPolicy(), targets, out, command=["test"], progress=False
    )
    return outcome, rows, read_results(out / "results.arrow")


def arrivals(emu):
    return [e for e in emu.read_request_log() if e["event"] == "request"]
