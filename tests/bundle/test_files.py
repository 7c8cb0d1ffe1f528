"""A bundle carries the whole policy its bisect found the repro with, and every
reader (``bundle verify``, ``repro.py``) replays under exactly that policy."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from replayer import api
from replayer._runfile import RunFileError
from replayer.bundle.files import MANIFEST, read_manifest
from replayer.options import BisectOptions, Order, ReplayPolicy, Selection, Server, Timing
from replayer.replay.files import read_run
from replayer.session import Outcome
from replayer.testing.emulator import EmulatorProcess

TRACE = Path(__file__).resolve().parents[2] / "traces" / "agents-8x10.arrow"
POLICY = ReplayPolicy(
    order=Order.ADMITTED, timing=Timing.GAPS, speed=7.0, max_inflight=3, request_timeout=90.0
)


def _bundle(tmp_path: Path) -> tuple[Path, list[str]]:
    """A bisect with its own oracle (no server) of a selection, under POLICY."""
    trace = api.open_trace(TRACE)
    selection = Selection(sessions="1..2")
    rows = [
        r for r in trace.order if trace.column("session_id")[r] in ("synth-00001", "synth-00002")
    ]
    ids = trace.column("request_id")
    culprit = ids[rows[3]]

    def oracle(trial):
        return Outcome.MATCH if culprit in trial.request_ids() else Outcome.PASS

    res = api.bisect_sync(
        TRACE,
        oracle,
        tmp_path / "bisect",
        BisectOptions(stages=("calibrate", "cut", "prefix", "sessions", "turns"), confirm=1),
        policy=POLICY,
        selection=selection,
    )
    assert res.status == "complete" and res.bundle is not None
    return res.bundle, list(res.requests)


@pytest.mark.inprocess
def test_the_manifest_holds_the_whole_policy_and_reads_back_equal(tmp_path):
    bundle, _ = _bundle(tmp_path)
    m = read_manifest(bundle)
    assert m.policy == POLICY  # every field, not the handful a reader remembers
    assert m.data["format_version"] == MANIFEST.version


async def test_verify_and_repro_py_replay_under_the_bisects_policy(tmp_path):
    bundle, requests = await asyncio.to_thread(_bundle, tmp_path)
    async with EmulatorProcess(["--speed", "instant"]) as emu:
        got = await api.verify_bundle(
            bundle, Server(url=emu.url), runs=1, out=tmp_path / "verify", say=lambda m: None
        )
        # repro.py, the standard library alone (-I -S), against the same server
        run = await asyncio.to_thread(_repro, bundle, "--url", emu.url)
    assert got.policy == POLICY
    assert [r.outcome for r in got.runs] == [Outcome.PASS]
    # what the run itself recorded having replayed under
    assert ReplayPolicy(**read_run(tmp_path / "verify" / "001").info["policy"]) == POLICY
    shown = await asyncio.to_thread(_repro, bundle, "--show-policy")
    assert ReplayPolicy(**json.loads(shown.stdout)) == POLICY
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"({POLICY.timing}, {POLICY.order} order, speed 7)" in run.stdout
    assert [line.split()[0] for line in run.stdout.splitlines()[1:-2] if line.strip()] == requests


def _repro(bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(bundle / "repro.py"), *args],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip


@pytest.mark.inprocess
def test_repro_py_knows_every_policy_field_and_its_default():
    from replayer.bundle import repro

    assert ReplayPolicy().to_dict() == repro.POLICY_DEFAULTS


def test_repro_py_refuses_a_policy_it_cannot_replay(tmp_path):
    bundle, _ = _bundle(tmp_path)
    m = orjson.loads((bundle / "manifest.json").read_bytes())
    m["policy"]["mode"] = "live"
    (bundle / "manifest.json").write_bytes(orjson.dumps(m))
    res = _repro(bundle, "--url", "http://127.0.0.1:9")
    assert res.returncode == 2
    assert "mode live" in res.stderr and "replayer bundle verify" in res.stderr


@pytest.mark.inprocess
def test_a_manifest_from_a_newer_replayer_is_refused_in_one_line(tmp_path):
    bundle, _ = _bundle(tmp_path)
    m = orjson.loads((bundle / "manifest.json").read_bytes())
    (bundle / "manifest.json").write_bytes(orjson.dumps({**m, "format_version": 99}))
    with pytest.raises(
        RunFileError, match=r"written by a newer replayer \(manifest.json version 99"
    ):
        read_manifest(bundle)
