"""A bundle's repro.py needs nothing but a bare Python: it exits 1 against the
faulty server and 0 against a healthy one."""

from __future__ import annotations

import orjson
import pytest

from replayer.trace import Trace
from tests.helpers.bundles import make_bundle, run_repro

MODEL = "moonshotai/Kimi-K3"


@pytest.mark.inprocess
def test_bundle_layout(tmp_path):
    b = make_bundle(tmp_path)
    assert sorted(p.name for p in b.iterdir()) == [
        "README.md",
        "manifest.json",
        "repro.py",
        "requests.jsonl",
        "trace.arrow",
        "trials.jsonl",
    ]
    m = orjson.loads((b / "manifest.json").read_bytes())
    t = Trace.open(b / "trace.arrow")
    assert m["requests"] == [t.column("request_id")[r] for r in t.order]
    assert len((b / "requests.jsonl").read_text().splitlines()) == 6
    assert (tmp_path / "bundle.tar.gz").stat().st_size > 0
    assert "python3 repro.py --url" in (b / "README.md").read_text()


def test_repro_exits_1_on_the_faulty_server_and_0_on_a_healthy_one(tmp_path, emulator_factory):
    b = make_bundle(tmp_path)
    bad = emulator_factory(["--speed", "instant", "--fault", "dead when request=4"])
    res = run_repro(b, bad.url)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SERVER FAILED: failure " in res.stdout
    assert "/health now: 503" in res.stdout
    good = emulator_factory(["--speed", "instant"])
    res = run_repro(b, good.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no failure: all 6 requests completed" in res.stdout
    # every request went out with its trace id, in trace order
    t = Trace.open(b / "trace.arrow")
    sent = [e["request_id"] for e in good.read_request_log() if e["event"] == "request"]
    assert sent == [t.column("request_id")[r] for r in t.order]


def test_repro_bad_usage(tmp_path):
    b = make_bundle(tmp_path)
    res = run_repro(b, "localhost:8000")
    assert res.returncode == 2
    assert res.stderr.strip().startswith("repro.py: error: --url must be")


@pytest.mark.inprocess
def test_repro_knows_every_engine_death_message():
    """repro.py is standard library only, so it keeps its own copy of vLLM's
    engine-death texts: the copy must cover the monitor's list."""
    from replayer.bundle import repro
    from replayer.monitor.classify import ENGINE_DEATH_MESSAGES

    missing = [
        m for m in ENGINE_DEATH_MESSAGES if not any(m in d or d in m for d in repro.ENGINE_DEATH)
    ]
    assert missing == []


def test_repro_sends_the_bundles_model_and_an_all_rejected_run_is_not_exercised(
    tmp_path, emulator_factory
):
    """The bisect replayed with ``--model served``: the bundle does too. A
    server that rejects every request (another model name) ran nothing:
    exit 4, never "no failure"."""
    b = make_bundle(tmp_path, {"timing": "asap", "speed": 1.0, "model": "served"})
    good = emulator_factory(["--speed", "instant", "--served-model-name", "served"])
    res = run_repro(b, good.url)
    assert res.returncode == 0, res.stdout + res.stderr
    other = emulator_factory(["--speed", "instant", "--served-model-name", "other"])
    res = run_repro(b, other.url)
    assert res.returncode == 4, res.stdout + res.stderr
    assert "NOT EXERCISED: 6 of 6 requests were rejected" in res.stdout
    assert "HTTP 404" in res.stdout
