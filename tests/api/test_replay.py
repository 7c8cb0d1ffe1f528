"""``api.replay`` and ``api.check`` as a user scripts them: typed results,
errors worded in parameters (the CLI says them in flags)."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from pathlib import Path

import pytest

import replayer
from replayer import (
    OptionError,
    ReplayerError,
    ReplayPolicy,
    RunStatus,
    Selection,
    Timing,
    api,
)
from replayer.testing.emulator import EmulatorProcess

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "agents-8x10.arrow"
MODEL = "moonshotai/Kimi-K3"  # what the emulator serves by default


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- api-example -->\n```python\n(.*?)```", text, re.S)
    assert m, "the README lost its API example"
    return m.group(1)


async def test_replay_returns_typed_results_per_endpoint(tmp_path):
    async with EmulatorProcess(["--speed", "instant"]) as emu:
        res = await api.replay(
            TRACE,
            [api.Endpoint("a", emu.url), emu.url],
            ReplayPolicy(timing=Timing.ASAP, max_inflight=4),
            selection=Selection(sessions="0..1"),
            out=tmp_path / "run",
        )
    assert res.status is RunStatus.SURVIVED and res.exit_code == 0 and res.failure is None
    assert list(res.endpoints) == ["a", "target1"]
    for ep in res.endpoints.values():
        assert (ep.requests, ep.sent, dict(ep.status_counts)) == (20, 20, {"ok": 20})
        assert ep.exercised and not ep.failed and ep.url == emu.url
    assert res.paths.results.exists() and res.paths.summary.exists()
    assert res.notes == ()  # text prompts: nothing to say


async def test_a_replay_of_synthetic_token_ids_says_so_and_the_cli_prints_it(tmp_path, capsys):
    from replayer.cli import main
    from replayer.trace.stats import synthetic_note
    from replayer.trace.synth import SynthOptions, write_trace

    trace = tmp_path / "b.arrow"
    opts = SynthOptions(
        sessions=2, turns=2, context=1_000, max_tokens=4, payload="blocks", seed=1, model=MODEL
    )
    write_trace(trace, opts)
    async with EmulatorProcess(["--speed", "instant"]) as emu:
        res = await api.replay(trace, emu.url, out=tmp_path / "run", selection=Selection(limit=3))
        assert res.status is RunStatus.SURVIVED
        assert res.notes == (synthetic_note({"blocks": 3}),)  # the replay's selection
        code = await asyncio.to_thread(
            main, ["replay", str(trace), "--target", emu.url, "--out", str(tmp_path / "cli")]
        )
    assert code == 0
    err = capsys.readouterr().err
    assert err.endswith("replayer replay: " + synthetic_note({"blocks": 4}) + "\n"), err


@pytest.mark.inprocess
def test_errors_name_parameters_not_flags(tmp_path):
    with pytest.raises(OptionError, match=r"^max_inflight must be at least 1$") as e:
        replayer.ReplayPolicy(max_inflight=0)
    assert e.value.param == "max_inflight"
    with pytest.raises(OptionError, match=r"^endpoints 'ftp://x': the URL must start"):
        api.replay_sync(TRACE, "ftp://x", out=tmp_path / "r")
    with pytest.raises(OptionError, match=r"^limit must not be negative$"):
        Selection(limit=-1)
    with pytest.raises(OptionError, match=r"^stages names unknown stage\(s\) nope"):
        replayer.BisectOptions(stages=("prefix", "nope"))
    with pytest.raises(OptionError, match=r"^launch and restart_cmd are exclusive"):
        api.Server(launch="x", restart_cmd="y")
    with pytest.raises(ReplayerError, match="no such file"):
        api.open_trace(tmp_path / "missing.arrow")
    assert not (tmp_path / "r").exists()  # refused before anything was created


@pytest.mark.inprocess
def test_the_cli_says_the_same_errors_in_flags(capsys):
    from replayer.cli import main

    rc = main(["replay", str(TRACE), "--target", "http://127.0.0.1:9", "--max-inflight", "0"])
    err = capsys.readouterr().err
    assert (rc, err) == (2, "replayer replay: error: --max-inflight must be at least 1\n")


def test_check_is_one_classified_trial(tmp_path):
    port = _free_port()
    server = api.Server(
        launch=f"{sys.executable} -m replayer.emulator --port {port} --speed instant "
        "--fault 'exit gpu=hip when request=6'"
    )
    policy = ReplayPolicy(timing=Timing.ASAP, order=replayer.Order.ADMITTED)
    got = api.check_sync(
        TRACE, server, policy, selection=Selection(sessions="0..1"), out=tmp_path / "crash"
    )
    assert got.outcome is replayer.Outcome.MATCH
    assert got.failure_class is replayer.FailureClass.PROCESS_EXIT
    assert got.signature is not None and "HIP" in got.signature.text
    assert got.run is not None and got.run.status is RunStatus.FAILED
    assert got.run.failure is not None and got.run.failure.signature == got.signature
    # the 6th request the server admitted is the 6th of the selection, in trace order
    t = api.open_trace(TRACE)
    rows = [r for r in t.order if t.column("session_id")[r] in ("synth-00000", "synth-00001")]
    assert got.run.failure.request_id == t.column("request_id")[rows[5]]
    clean = api.check_sync(
        TRACE,
        api.Server(launch=f"{sys.executable} -m replayer.emulator --port {port} --speed instant"),
        policy,
        selection=Selection(sessions="0..1"),
        out=tmp_path / "clean",
    )
    assert (clean.outcome, clean.failure_class, clean.run.status) == (
        replayer.Outcome.PASS,
        None,
        RunStatus.SURVIVED,
    )
