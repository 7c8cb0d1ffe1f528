"""``replayer bisect`` as a process: killed with SIGKILL mid-run, it resumes
from its journal, reaps the server it left behind, repeats no finished trial
and ends with the same answer; ``bundle verify`` reports the bundle's rate."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import orjson
import pytest

from replayer.replay.results import read_results
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace
from tests.helpers.bundles import make_bundle
from tests.helpers.cli import assert_one_line_error, run
from tests.helpers.net import free_port

MODEL = "moonshotai/Kimi-K3"
FAST = [
    "--timing",
    "asap",
    "--settle",
    "3",
    "--grace",
    "0.5",
    "--health-interval",
    "0.1",
    "--calibrate",
    "2",
    "--calibrate-runs",
    "4",
]


def emulator(port, *faults):
    args = [sys.executable, "-m", "replayer.emulator", "--port", str(port), "--speed", "instant"]
    for f in faults:
        args += ["--fault", f]
    return shlex.join(args)


def journal(path):
    out = []
    if path.exists():
        for line in path.read_bytes().splitlines():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                break
    return out


@pytest.mark.slow
def test_killed_bisect_resumes_without_repeating_trials(tmp_path):
    trace = tmp_path / "t.arrow"
    write_trace(
        trace,
        SynthOptions(
            sessions=5,
            turns=6,
            context=8_000,
            rate=50,
            think=0.0,
            max_tokens=4,
            model=MODEL,
            seed=3,
        ),
    )
    out = tmp_path / "b"
    port = free_port()
    # the control platform runs clean and wants its own key
    ctl = emulator(free_port()) + " --api-key sk-control-7"
    control = ["--control-launch", ctl, "--control-key", "env:CTL_KEY"]
    cmd = [
        sys.executable,
        "-m",
        "replayer",
        "bisect",
        str(trace),
        "--out",
        str(out),
        "--launch",
        emulator(port, "exit after=0.2 when request=17"),
        *control,
        "--confirm",
        "1",
        "--stages",
        "calibrate,cut,prefix,sessions",
        *FAST,
    ]
    env = {**os.environ, "CTL_KEY": "sk-control-7"}
    with subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    ) as proc:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if sum(e["event"] == "trial" for e in journal(out / "journal.jsonl")) >= 6:
                break
            time.sleep(0.05)  # polling the journal file (bounded above)
        assert proc.poll() is None, "bisect ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    before = journal(out / "journal.jsonl")
    decided = {e["key"] for e in before if e["event"] == "verdict"}
    trials_before = sum(e["event"] == "trial" for e in before)
    res = run(
        "bisect",
        trace,
        "--out",
        out,
        "--resume",
        "--launch",
        emulator(port, "exit after=0.2 when request=17"),
        *control,
        "--confirm",
        "1",
        "--stages",
        "calibrate,cut,prefix,sessions",
        *FAST,
        env={"CTL_KEY": "sk-control-7"},
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    after = journal(out / "journal.jsonl")[len(before) :]
    new_trials = [e for e in after if e["event"] == "trial"]
    assert new_trials, "the resumed bisect had work left"
    # trial numbers continue; no candidate decided before the kill runs again
    # (confirmation re-runs the final candidate on purpose, decided or not)
    assert new_trials[0]["record"]["trial"] == trials_before + 1
    searched = [e for e in new_trials if e["record"]["stage"] != "confirm"]
    assert not [e for e in searched if e["record"]["key"] in decided]
    assert [e["record"]["stage"] for e in new_trials][-1] == "confirm"
    m = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    assert m["prefix_length"] == 17
    assert (m["control"]["runs"], m["control"]["crashes"]) == (1, 0)
    ctl_rows = read_results(out / "control" / "001" / "results.arrow")
    assert len(ctl_rows) == 17 and {r["status"] for r in ctl_rows} == {"ok"}  # the key worked
    t = Trace.open(trace)
    assert m["requests"] == [t.column("request_id")[r] for r in t.order[:17]]
    # neither the orphan of the killed run nor the resumed run's server is left
    import socket

    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_a_killed_pool_bisect_resumes_and_stops_the_servers_it_left(tmp_path):
    trace = tmp_path / "t.arrow"
    write_trace(
        trace,
        SynthOptions(sessions=5, turns=6, context=8_000, rate=50, think=0.0, max_tokens=4,
                     model=MODEL, seed=3),
    )  # fmt: skip
    out = tmp_path / "b"
    ports = [free_port(), free_port()]
    pool = tmp_path / "pool.toml"
    # [[server]] tables: each on a port the test knows, to check it is closed
    pool.write_text(
        "".join(
            f"[[server]]\nlaunch = {json.dumps(emulator(p, 'exit after=0.2 when request=17'))}\n"
            for p in ports
        )
    )
    args = ["--pool", str(pool), "--confirm", "2", "--stages", "calibrate,cut,prefix", *FAST]
    cmd = [sys.executable, "-m", "replayer", "bisect", str(trace), "--out", str(out), *args]
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if sum(e["event"] == "trial" for e in journal(out / "journal.jsonl")) >= 4:
                break
            time.sleep(0.05)  # polling the journal file (bounded above)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert sorted(p.name for p in out.glob("*.pid")) == [
        "target-server-0.pid",
        "target-server-1.pid",
    ]
    res = run("bisect", trace, "--out", out, "--resume", *args)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "stopped the server(s) a killed bisect left running" in res.stderr
    m = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    assert m["prefix_length"] == 17
    import socket

    for port in ports:  # neither the orphans nor the resumed run's servers are left
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_bisect_usage_errors(tmp_path):
    trace = tmp_path / "t.arrow"
    write_trace(trace, SynthOptions(sessions=1, turns=2, context=5_000, model=MODEL))

    assert_one_line_error(
        run("bisect", trace, "--out", tmp_path / "b", "--url", "http://127.0.0.1:1"),
        "restarts the server after every crash",
    )
    assert_one_line_error(
        run("bisect", trace, "--out", tmp_path / "b", "--launch", "x", "--stages", "prefix,nope"),
        "unknown stage(s) nope",
    )
    assert_one_line_error(
        run("bisect", trace, "--out", tmp_path / "c", "--launch", "x", "--resume"),
        "holds no journal.jsonl",
    )
    assert_one_line_error(
        run("bisect", trace, "--out", tmp_path / "b", "--launch", "x", "--signature", "("),
        "--signature",
    )


def test_bundle_verify_reports_the_rate(tmp_path):
    b = make_bundle(tmp_path)
    # a dead engine keeps its process up: settle only as long as the 503s take to show
    common = ["--runs", "2", "--settle", "1", "--grace", "0.5", "--health-interval", "0.1"]
    res = run(
        "bundle",
        "verify",
        b,
        "--launch",
        emulator(free_port(), "dead when request=3"),
        "--out",
        tmp_path / "v1",
        *common,
    )
    assert res.returncode == 0, res.stderr
    assert "crashed 2/2 (100%, 95% CI 34%-100%)" in res.stdout
    res = run(
        "bundle", "verify", b, "--launch", emulator(free_port()), "--out", tmp_path / "v2", *common
    )
    assert res.returncode == 1
    assert "crashed 0/2 (95% upper bound 78%)" in res.stdout
