"""``replayer replay`` as a user runs it: exit codes 0/1/2/3, outputs, keys."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import orjson
import pytest

from replayer.replay.results import read_results
from tests.helpers.cli import SAMPLE, assert_one_line_error, run
from tests.helpers.net import free_port


def test_survived_is_0_and_json_summary(emulator_factory, tmp_path):
    emu = emulator_factory(["--speed", "instant"])
    res = run(
        "replay",
        SAMPLE,
        "--target",
        f"b300={emu.url}",
        "--timing",
        "asap",
        "--limit",
        "20",
        "--out",
        tmp_path / "r",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    summary = orjson.loads(res.stdout)
    assert summary["exit_code"] == 0
    assert summary["targets"]["b300"]["status"] == {"ok": 20}
    assert len(read_results(tmp_path / "r" / "results.arrow")) == 20
    run_json = orjson.loads((tmp_path / "r" / "run.json").read_bytes())
    assert run_json["selection"]["count"] == 20
    assert run_json["targets"] == [{"name": "b300", "url": emu.url}]
    assert len(run_json["trace"]["sha256"]) == 64


def test_failed_target_is_1(emulator_factory, tmp_path):
    emu = emulator_factory(["--speed", "instant", "--fault", "dead when request=3"])
    res = run(
        "replay",
        SAMPLE,
        "--target",
        emu.url,
        "--timing",
        "asap",
        "--settle",  # a dead engine keeps its process: do not wait the default 10 s
        "1",
        "--out",
        tmp_path / "r",
        "--quiet",
    )
    assert res.returncode == 1, res.stderr
    assert "target: FAILED" in res.stdout
    assert "not_sent_after_crash" in res.stdout


def test_unreachable_is_3(tmp_path):
    res = run(
        "replay",
        SAMPLE,
        "--target",
        f"gone=http://127.0.0.1:{free_port()}",
        "--out",
        tmp_path / "r",
        "--quiet",
    )
    assert res.returncode == 3
    assert "target gone unreachable at http://127.0.0.1:" in res.stderr


def test_usage_errors_are_2(tmp_path):
    assert_one_line_error(run("replay", SAMPLE), "--target is missing")
    assert_one_line_error(
        run("replay", SAMPLE, "--target", "localhost:8000"), "must start with http://"
    )
    assert_one_line_error(
        run("replay", SAMPLE, "--target", "http://x", "--speed", "0"), "speed must be positive"
    )
    assert_one_line_error(
        run("replay", SAMPLE, "--target", "http://x", "--token-range", "5"),
        "--token-range: wants LO:HI",
    )
    assert_one_line_error(
        run("replay", tmp_path / "nope.arrow", "--target", "http://x"), "no such file"
    )
    assert_one_line_error(
        run("replay", SAMPLE, "--target", "http://x", "--sessions", "zz"), "no session 'zz'"
    )
    assert_one_line_error(
        run("replay", SAMPLE, "--target", "http://x", "--api-key-env", "REPLAYER_TEST_UNSET_VAR"),
        "REPLAYER_TEST_UNSET_VAR is not set",
    )
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    assert_one_line_error(
        run("replay", SAMPLE, "--target", "http://x", "--out", tmp_path / "busy"), "not empty"
    )
    assert (tmp_path / "busy" / "x").read_text() == "keep me"


def test_wrong_model_is_a_usage_error_before_sending(emulator_factory, tmp_path):
    emu = emulator_factory(["--speed", "instant", "--served-model-name", "other"])
    res = run("replay", SAMPLE, "--target", emu.url, "--out", tmp_path / "r", "--quiet")
    assert_one_line_error(res, "does not serve model moonshotai/Kimi-K3", "--model other")
    assert emu.read_request_log() == []


def test_api_key_from_env_never_lands_in_the_run(emulator_factory, tmp_path):
    secret = "sk-test-0123456789abcdef"
    emu = emulator_factory(["--speed", "instant", "--api-key", secret])
    res = run(
        "replay",
        SAMPLE,
        "--target",
        emu.url,
        "--limit",
        "3",
        "--timing",
        "asap",
        "--out",
        tmp_path / "r",
        "--quiet",
        env={"REPLAYER_API_KEY": secret},
    )
    assert res.returncode == 0, res.stderr
    for f in (tmp_path / "r").iterdir():
        assert secret.encode() not in f.read_bytes(), f
    bad = run(
        "replay",
        SAMPLE,
        "--target",
        emu.url,
        "--limit",
        "3",
        "--out",
        tmp_path / "r2",
        "--quiet",
        env={"REPLAYER_API_KEY": "wrong"},
    )
    assert bad.returncode == 3  # the models listing is refused: nothing could be sent
    assert "answered 401" in bad.stderr


def test_a_hang_that_takes_health_down_too_is_a_hang(emulator_factory, tmp_path):
    """The API server's loop stuck with the engine (``hang api=stall``): no
    token, no /health answer. Without the rule for it the replay waited out
    --request-timeout; now it is a hang, recorded as one with /health
    stalled, and the run ends."""
    emu = emulator_factory(["--speed", "instant", "--fault", "hang api=stall when request=3"])
    res = run(
        "replay", SAMPLE, "--target", emu.url, "--timing", "asap", "--stall-timeout", "2",
        "--health-interval", "0.5", "--health-timeout", "0.5", "--settle", "2",
        "--out", tmp_path / "r", "--quiet", timeout=120,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    s = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    f = s["targets"]["target"]["failure"]
    assert (f["class"], f["health_stalled"]) == ("hang", True)
    stalls = s["loop_stall_ms"]  # the loop was watched the whole run (seconds of it)
    assert stalls["samples"] > 100 and 0 <= stalls["p50"] <= stalls["p99_9"] <= stalls["max"]
    assert "while /health stopped answering too (probes time out after 0.5 s)" in f["message"]
    assert [p["error"] for p in f["health"] if p["t"] > f["at_s"]] == ["timeout"] * len(
        [p for p in f["health"] if p["t"] > f["at_s"]]
    )
    rows = read_results(tmp_path / "r" / "results.arrow")
    assert {r["error_class"] for r in rows if r["status"] == "timeout"} == {"hang"}


@pytest.mark.parametrize(
    ("sig", "api", "times"),
    [
        (signal.SIGINT, "up", 1),
        (signal.SIGTERM, "up", 1),
        (signal.SIGTERM, "stall", 1),
        (signal.SIGTERM, "up", 50),
    ],
    ids=["SIGINT", "SIGTERM", "SIGTERM-health-stalled", "SIGTERM-repeated"],
)
def test_interrupt_during_a_hang_stops_at_once_and_keeps_every_result(
    emulator_factory, tmp_path, sig, api, times
):
    # a hung engine never answers: Ctrl-C (or SIGTERM) must not wait for it, nor
    # for the generous request timeout, and every request still gets its row;
    # with the API stalled too, a /health probe is waiting when the signal comes.
    # SIGTERM repeated every 20 ms while it stops (PDEATHSIG from each thread of
    # a killed parent; a supervisor that repeats it) is one interrupt: the later ones once cut the
    # clean-up short and left an empty results.arrow

    emu = emulator_factory(["--speed", "instant", "--fault", f"hang api={api} when request=3"])
    cmd = [sys.executable, "-m", "replayer", "replay", str(SAMPLE), "--target", emu.url]
    cmd += ["--timing", "asap", "--out", str(tmp_path / "r"), "--quiet"]
    # started as a shell starts a background job: SIGINT ignored (it once made
    # both signals do nothing, and this test hang, when the suite ran under `&`)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
    )
    try:
        deadline = time.monotonic() + 60
        while len(emu.read_request_log()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the server's log: the condition, not a delay
        assert len(emu.read_request_log()) >= 3, "the hang was never reached"
        proc.send_signal(sig)
        for _ in range(times - 1):  # repeated while it stops, as a parent's threads exit
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.02)
            if proc.poll() is None and not (tmp_path / "r" / "summary.json").exists():
                proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()  # reap it and close its pipes, even when the test failed
    # one that lands during interpreter shutdown meets the default action
    # (Python restores it there): main() had returned 130 by then (the line)
    assert proc.returncode == 130 or (times > 1 and proc.returncode == -sig), err
    assert err.strip().splitlines()[-1] == "replayer replay: interrupted"
    assert "Traceback" not in err and "Unclosed" not in err, err
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    assert summary["interrupted"] is True and summary["exit_code"] == 130
    assert summary["targets"]["target"]["failed"] is False  # the interrupt is not the target's
    rows = read_results(tmp_path / "r" / "results.arrow")
    assert len(rows) == 80
    cut = [r for r in rows if r["error_class"] == "interrupted" and r["seq"] is not None]
    assert cut and all(r["status"] == "timeout" for r in cut)
    unsent = [r for r in rows if r["seq"] is None]
    assert unsent and all(
        (r["status"], r["error_class"]) == ("not_sent_after_crash", "interrupted") for r in unsent
    )


def test_out_of_file_descriptors_is_the_replayers_limit_not_a_crash(emulator_factory, tmp_path):
    # 150 sessions at once, each request held ~1 s by the server, under a hard
    # limit of 96 open files: some connections cannot be opened. That is the
    # replayer's own limit: the target is not declared failed, the requests
    # say why, and one warning names the fix.
    import resource

    from replayer.trace import RequestRecord, TraceMeta, TraceWriter

    p = tmp_path / "wide.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for k in range(150):
            body = {"model": "moonshotai/Kimi-K3", "prompt": f"q{k}", "max_tokens": 20}
            w.add(
                RequestRecord.from_body(
                    body, request_id=f"r{k}", session_id=f"s{k}", turn=0, start_us=0
                )
            )
    emu = emulator_factory(["--decode-time", "0.05", "--max-num-seqs", "1024"])

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))

    res = subprocess.run(
        [sys.executable, "-m", "replayer", "replay", str(p), "--target", emu.url,
         "--timing", "asap", "--order", "session", "--out", str(tmp_path / "r"), "--quiet"],
        capture_output=True, text=True, timeout=120, preexec_fn=limit,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("out of file descriptors") == 1, res.stderr
    rows = read_results(tmp_path / "r" / "results.arrow")
    own = [r for r in rows if r["error_class"] == "client_resources"]
    assert own and all(r["status"] == "transport_error" for r in own)
    assert {r["status"] for r in rows} == {"ok", "transport_error"}
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    assert summary["targets"]["target"]["failed"] is False


def test_cached_tokens_come_from_metrics_when_responses_carry_none(emulator_factory, tmp_path):
    """Without --enable-prompt-tokens-details the server reports no cached
    tokens per request; the summary takes the run's prefix-cache counters.
    One request in flight: the two runs then reach the cache in one order,
    whatever the machine's load (concurrent sessions race for shared blocks)."""
    emu = emulator_factory(["--speed", "instant"])
    res = run(
        "replay",
        SAMPLE,
        *("--target", emu.url, "--timing", "asap", "--limit", "20", "--max-inflight", "1"),
        *("--scrape-interval", "0.2", "--out", tmp_path / "r", "--json"),
    )
    assert res.returncode == 0, res.stderr
    t = orjson.loads(res.stdout)["targets"]["target"]
    rows = read_results(tmp_path / "r" / "results.arrow")
    assert all(r["cached_tokens"] is None for r in rows)
    assert t["cached_tokens_source"] == "metrics"
    assert t["cached_tokens"] > 0 and 0 < t["prefix_cache_hit_ratio"] < 1
    with_details = emulator_factory(["--speed", "instant", "--enable-prompt-tokens-details"])
    res = run(
        "replay",
        SAMPLE,
        *("--target", with_details.url, "--timing", "asap", "--limit", "20"),
        *("--max-inflight", "1", "--out", tmp_path / "r2", "--json"),
    )
    t2 = orjson.loads(res.stdout)["targets"]["target"]
    assert t2["cached_tokens_source"] == "responses"
    # the emulator's counters and its per-request figures tell the same story
    assert t2["cached_tokens"] == t["cached_tokens"]
