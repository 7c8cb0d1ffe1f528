"""Run directories made once per session against real emulator subprocesses, and
the headless Chromium the report tests render in."""

from __future__ import annotations

import pytest

from replayer.replay.client import Endpoint
from replayer.testing.browser import find_chromium
from replayer.testing.emulator import EmulatorProcess
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace
from tests.helpers.analysis import MODEL, replay


@pytest.fixture(scope="session")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.fail(
            "the report tests render in a real browser and none was found: "
            "apt-get install -y chromium (make test does this as root), or set REPLAYER_CHROMIUM"
        )
    return path


@pytest.fixture(scope="session")
def trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("trace") / "t.arrow"
    # 25 sessions of 4 turns: 100 requests (10 beyond p90), contexts growing to 3k tokens
    write_trace(p, SynthOptions(model=MODEL, sessions=25, turns=4, context=3_000, max_tokens=16,
                                rate=20, think=0.05, seed=11))  # fmt: skip
    return Trace.open(p)


@pytest.fixture(scope="session")
def runs(tmp_path_factory, trace):
    """base and again: one healthy emulator config, twice (fresh processes);
    slow: the same with every engine step 3x slower; pair: mi355 (crashes at
    its 60th request) and b300 (healthy) side by side in one run."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    emus = []

    def emu(*args):
        # steps of 5 ms, no batch interference: latencies are the engine model's,
        # not the 2-core machine's scheduling noise
        steady = ["--speed", "4", "--batch-slowdown", "0", "--max-num-batched-tokens", "1000000"]
        e = EmulatorProcess([*steady, *args], workdir=root / f"emu{len(emus)}")
        emus.append(e)
        return e.start()

    try:
        for name, args in (("base", ()), ("again", ()),
                           ("slow", ("--fault", "slow factor=3 when request>=1"))):  # fmt: skip
            e = emu(*args)
            replay(trace, [Endpoint("b300", e.url)], root / name)
            out[name] = root / name
        mi, b3 = emu("--fault", "exit when request=60"), emu()
        replay(trace, [Endpoint("mi355", mi.url), Endpoint("b300", b3.url)], root / "pair")
        out["pair"] = root / "pair"
    finally:
        for e in emus:
            e.stop()
    return out
