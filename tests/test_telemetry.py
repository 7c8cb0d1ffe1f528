"""Live metrics (``--metrics-port``): scraped over HTTP while a replay runs
against a real emulator that crashes mid-run, then checked at the end against
``results.arrow`` - every counter, every TTFT bucket. Bisect progress and the
recorder's counters are checked against their own ground truth."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from replayer._async import spawn
from replayer.bisect.pipeline import Bisect, BisectOptions, run_bisect
from replayer.monitor.watch import WatchConfig
from replayer.options import Server
from replayer.record.proxy import RecordConfig, RecordingProxy
from replayer.replay.client import Endpoint
from replayer.replay.plan import select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.results import Result, Status, read_results
from replayer.replay.run import replay_to_dir
from replayer.session import Session
from replayer.telemetry import TTFT_BUCKETS, LiveMetrics
from tests.helpers.bisect import emulator_cmd
from tests.helpers.cli import SAMPLE
from tests.helpers.replay import MODEL, synth

WATCH = WatchConfig(health_interval=0.1, scrape_interval=0.5, settle=1.0, grace=0.2)


def parse(text):
    """{(name, frozenset(labels)): value} of an exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def pick(m, name, **labels):
    """{other labels: value} of the samples of ``name`` matching ``labels``."""
    out = {}
    for (n, labs), v in m.items():
        d = dict(labs)
        if n == name and all(d.get(k) == x for k, x in labels.items()):
            rest = tuple(sorted((k, x) for k, x in d.items() if k not in labels))
            out[rest] = v
    return out


async def scrape(session, url):
    async with session.get(url) as r:
        assert r.status == 200
        return parse(await r.text())


async def test_scraped_during_a_crashing_replay_and_equal_to_results(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=6, turns=6, context=6_000, rate=30, think=0.05, seed=5)
    emu = emulator_factory(["--speed", "4", "--fault", "exit when request=24"])
    rows = select(t)
    live = LiveMetrics()
    server = live.serve(0)
    out = tmp_path / "run"
    out.mkdir()
    try:
        task = spawn(
            replay_to_dir(
                t,
                rows,
                ReplayPolicy(timing=Timing.ASAP),
                [Endpoint("mi355", emu.url)],
                out,
                progress=False,
                watch=WATCH,
                live=live,
            ),
            name="replay",
        )
        async with aiohttp.ClientSession() as s:
            during = None
            for _ in range(2000):  # bounded: until a scrape sees requests on the wire
                m = await scrape(s, server.url)
                if pick(m, "replayer_requests_inflight", target="mi355").get((), 0) > 0:
                    during = m
                    break
                assert not task.done(), "the replay ended before a scrape saw it running"
                await asyncio.sleep(0.005)
            assert during is not None
            states = pick(during, "replayer_target_health", target="mi355")
            assert sorted(v for v in states.values()) == [0, 0, 0, 0, 1]
            assert {dict(k)["state"] for k, v in states.items() if v} <= {"unknown", "healthy"}
            assert 0 < pick(during, "replayer_requests_dispatched_total", target="mi355")[()] < 36
            outcome = await task
            final = await scrape(s, server.url)
    finally:
        server.close()
    assert outcome.exit_code == 1
    results = read_results(out / "results.arrow")
    assert len(results) == len(rows) == 36
    sent = [r for r in results if r["seq"] is not None]
    unsent = [r for r in results if r["seq"] is None]
    ok = [r for r in sent if r["status"] == "ok"]
    assert 0 < len(ok) < len(sent) < len(results)  # it crashed mid-run

    def counts(name, label):
        return {dict(k)[label]: v for k, v in pick(final, name, target="mi355").items()}

    assert pick(final, "replayer_requests_dispatched_total", target="mi355") == {(): len(sent)}
    assert counts("replayer_requests_completed_total", "status") == Counter(
        r["status"] for r in sent
    )
    assert counts("replayer_requests_failed_total", "error_class") == Counter(
        r["error_class"] for r in sent if r["status"] != "ok"
    )
    assert counts("replayer_requests_not_sent_total", "reason") == Counter(
        r["status"] for r in unsent
    )
    assert pick(final, "replayer_requests_inflight", target="mi355") == {(): 0}
    ttft = [(r["first_token_us"] - r["dispatched_us"]) / 1e6 for r in ok]
    assert pick(final, "replayer_ttft_seconds_count", target="mi355") == {(): len(ttft)}
    buckets = counts("replayer_ttft_seconds_bucket", "le")
    for le in TTFT_BUCKETS:
        assert buckets[str(float(le))] == sum(v <= le for v in ttft), le
    assert buckets["+Inf"] == len(ok)
    assert pick(final, "replayer_e2e_seconds_count", target="mi355") == {(): len(ok)}
    assert pick(final, "replayer_itl_seconds_count", target="mi355") == {
        (): sum(r["itl_mean_us"] is not None for r in ok)
    }
    assert pick(final, "replayer_schedule_lag_seconds_count", target="mi355") == {(): len(sent)}
    health = counts("replayer_target_health", "state")
    assert health == {"unknown": 0, "healthy": 0, "unhealthy": 0, "unreachable": 0, "failed": 1}
    cls = outcome.summary["targets"]["mi355"]["failure"]["class"]
    assert cls in ("process_exit", "engine_dead")  # depends on the settle window's luck
    assert counts("replayer_target_failures_total", "class") == {cls: 1}


async def test_bisect_progress(tmp_path):
    t = synth(tmp_path, sessions=3, turns=4, context=4_000, seed=6)
    rows = select(t)
    live = LiveMetrics()
    env = Session.open(
        t,
        rows=rows,
        policy=ReplayPolicy(timing=Timing.ASAP),
        watch=WATCH,
        server=Server(launch=emulator_cmd("exit when request=6")),
        logs=tmp_path / "b",
        live=live,
    )
    (tmp_path / "b").mkdir()
    b = Bisect(
        t,
        rows,
        env,
        tmp_path / "b",
        BisectOptions(stages=("calibrate", "cut"), calibrate_matches=1, confirm=0),
        say=lambda msg: None,
    )
    live.attach_bisect(b)
    res = await run_bisect(b)
    m = {(n, frozenset(labs.items())): v for n, labs, v in live.samples()}
    journal = [json.loads(x) for x in (tmp_path / "b" / "journal.jsonl").read_text().splitlines()]
    trials = [e["record"] for e in journal if e["event"] == "trial"]
    assert [r["stage"] for r in trials] == ["calibrate", "cut"]
    assert trials[1]["size"] < 12
    got = pick(m, "replayer_bisect_trials_total")
    assert {(dict(k)["stage"], dict(k)["outcome"]): v for k, v in got.items()} == Counter(
        (r["stage"], r["outcome"]) for r in trials
    )
    assert pick(m, "replayer_bisect_trial") == {(): 2}
    assert pick(m, "replayer_bisect_candidate_size") == {(): trials[1]["size"]}
    assert pick(m, "replayer_bisect_best_size") == {(): len(res.best.positions)}
    assert pick(m, "replayer_bisect_selection_size") == {(): 12}
    # every trial's replay reported too: dispatches add up over both trials
    sent = sum(
        sum(r["seq"] is not None for r in read_results(tmp_path / "b" / x["run"] / "results.arrow"))
        for x in trials
    )
    assert pick(m, "replayer_requests_dispatched_total", target="target") == {(): sent}
    failures = pick(m, "replayer_target_failures_total", target="target")
    assert {dict(k)["class"]: v for k, v in failures.items()} == Counter(
        r["failure_class"] for r in trials if r["failure_class"]
    )


async def test_recorder_counters(emulator, tmp_path):
    live = LiveMetrics()
    cfg = RecordConfig(upstream=emulator.url, output=tmp_path / "rec.arrow", port=0)
    async with RecordingProxy(cfg) as proxy:
        live.attach_recorder(proxy)
        client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="x")
        for i in range(3):
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=4
            )
        await client.models.list()
        await client.close()
    m = {(n, frozenset(labs.items())): v for n, labs, v in live.samples()}
    assert pick(m, "replayer_record_exchanges_total") == {
        (("outcome", "ok"),): 3,
        (("outcome", "failed"),): 0,
    }
    assert pick(m, "replayer_record_requests_forwarded_total") == {(): 4}
    assert pick(m, "replayer_record_inflight") == {(): 0}
    assert pick(m, "replayer_record_rows_written_total") == {(): 3}
    assert pick(m, "replayer_record_write_errors_total") == {(): 0}
    assert pick(m, "replayer_record_rows_lost_total") == {(): 0}
    assert pick(m, "replayer_record_recording") == {(): 1}
    size = (tmp_path / "rec.arrow").stat().st_size
    assert pick(m, "replayer_record_bytes_written_total") == {(): size} and size > 0


def test_cli_reports_a_taken_metrics_port_in_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "replayer", "replay", str(SAMPLE), "--target",
             "http://127.0.0.1:1", "--out", str(tmp_path / "r"), "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in res.stderr


@pytest.mark.inprocess
def test_replay_bisect_and_record_take_the_flag():
    from replayer.cli import build_parser

    p = build_parser(full=True)
    for argv in (
        ["replay", "t.arrow", "--target", "http://h:1"],
        ["bisect", "t.arrow", "--out", "d", "--launch", "x"],
        ["record", "--upstream", "http://h:1", "-o", "t.arrow"],
    ):
        args = p.parse_args([*argv, "--metrics-port", "9400", "--metrics-host", "0.0.0.0"])
        assert (args.metrics_port, args.metrics_host) == (9400, "0.0.0.0")
        assert p.parse_args(argv).metrics_port is None


@pytest.mark.inprocess
def test_an_aborted_by_design_request_is_its_own_outcome_never_a_failure():
    """A replayed client abort is the trace's: counted as ``aborted``, not
    failed, and kept out of the latency histograms (its end is the abort)."""
    from prometheus_client import generate_latest

    live = LiveMetrics()
    for i, (status, error_class) in enumerate(
        [(Status.OK, None), (Status.ABORTED, None), (Status.HTTP_ERROR, "http_500")]
    ):
        live.observe(
            Result(
                "t", i, f"r{i}", "s", i, status=status, seq=i, error_class=error_class,
                dispatched_us=0, first_token_us=1_000, done_us=2_000,
            )
        )  # fmt: skip
    m = parse(generate_latest(live.registry).decode())
    completed = pick(m, "replayer_requests_completed_total", target="t")
    assert {dict(k)["status"]: v for k, v in completed.items()} == {
        "ok": 1, "aborted": 1, "http_error": 1,
    }  # fmt: skip
    failed = pick(m, "replayer_requests_failed_total", target="t")
    assert {dict(k)["error_class"]: v for k, v in failed.items()} == {"http_500": 1}
    assert pick(m, "replayer_e2e_seconds_count", target="t") == {(): 1}
