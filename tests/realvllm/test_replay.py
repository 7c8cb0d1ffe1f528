"""Replay against the shared real vLLM, end to end through the CLI.

Every test here leaves the shared server as it found it: running and
healthy (the SIGSTOP test resumes EngineCore before it ends).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replayer.replay.results import read_results
from replayer.testing.vllm import admission_sequence, in_order_fraction, ordered_chat_trace
from replayer.trace.reader import Trace
from replayer.trace.stats import ideal_prefix_hits
from replayer.trace.tokens import TokenSpace
from tests.helpers.realvllm import TOKEN_RANGE, cli, summary


def replay(trace: Path, shared, out: Path, *args, timeout: float = 300):
    return cli(
        "replay",
        trace,
        "--target",
        f"vllm={shared.url}",
        "--model",
        shared.model,
        "--out",
        out,
        "--quiet",
        *args,
        timeout=timeout,
    )


def test_chat_trace_replays_clean_with_cached_tokens(vllm_shared, traces, tmp_path):
    res = replay(traces["chat"], vllm_shared, tmp_path / "run", "--timing", "asap")
    assert res.returncode == 0, res.stdout + res.stderr
    t = summary(tmp_path / "run")["targets"]["vllm"]
    assert t["status"] == {"ok": 16}
    assert t["exercised"] is True and t["client_errors"] == 0
    # --enable-prompt-tokens-details: per request; the shared system prompt hits
    assert t["cached_tokens_source"] == "responses"
    assert t["cached_tokens"] > 0
    rows = read_results(tmp_path / "run" / "results.arrow")
    assert all(r["prompt_tokens"] and r["completion_tokens"] for r in rows)
    assert all(r["first_token_us"] is not None for r in rows)


@pytest.mark.parametrize("workers", [1, 2])
def test_blocks_prefix_cache_hits_equal_the_traces_ideal(vllm_shared, traces, tmp_path, workers):
    """vLLM's CPU build caches 128-token blocks: every request's cached tokens
    equal what the trace's block ids promise a never-evicting 128-token cache
    (one request in flight, so each one's blocks are cached before the next).
    With ``--workers 2`` the bodies come from two processes: the server's
    count of every prompt and of every cache hit says they are the same ids."""
    vllm_shared.reset_prefix_cache()
    res = replay(
        traces["blocks"],
        vllm_shared,
        tmp_path / "run",
        *("--timing", "asap", "--max-inflight", 1, "--token-range", TOKEN_RANGE),
        *("--workers", workers),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = sorted(read_results(tmp_path / "run" / "results.arrow"), key=lambda r: r["seq"])
    trace = Trace.open(traces["blocks"])
    lo, hi = (int(x) for x in TOKEN_RANGE.split(":"))
    trace = trace.configured(tokens=TokenSpace(lo, hi, trace.tokens.salt))
    ideal = ideal_prefix_hits(trace, [r["row"] for r in rows], 128)
    assert [r["cached_tokens"] for r in rows] == ideal
    assert [r["prompt_tokens"] for r in rows] == [
        trace.column("input_tokens")[r["row"]] for r in rows
    ]
    t = summary(tmp_path / "run")["targets"]["vllm"]
    assert t["cached_tokens"] == sum(ideal) > 0
    assert summary(tmp_path / "run").get("body_workers") == (
        None if workers == 1 else {"workers": 2, "died": []}
    )


def test_tau2_slice_replays(vllm_shared, traces, tmp_path):
    res = replay(
        traces["tau2"], vllm_shared, tmp_path / "run", "--sessions", "0..1", "--timing", "asap"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    t = summary(tmp_path / "run")["targets"]["vllm"]
    assert t["sent"] == t["requests"] > 10
    assert t["status"] == {"ok": t["requests"]}


def test_in_stream_400_is_a_client_error_and_the_replay_goes_on(vllm_shared, traces, tmp_path):
    """Ids up to 8,193 leave a few requests with id 8,192, one past the
    vocabulary: vLLM streams 200, then an error event with code 400. Those
    requests are client errors; the others are sent and answered."""
    res = replay(
        traces["blocks"],
        vllm_shared,
        tmp_path / "run",
        *("--timing", "asap", "--token-range", "100:8193"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = read_results(tmp_path / "run" / "results.arrow")
    bad = [r for r in rows if r["status"] != "ok"]
    assert bad and len(bad) < len(rows) / 2
    assert {(r["status"], r["http_status"], r["error_class"]) for r in bad} == {
        ("http_error", 200, "stream_400")
    }
    assert all("out of vocabulary" in r["error"] for r in bad)
    t = summary(tmp_path / "run")["targets"]["vllm"]
    assert t["failed"] is False and t["sent"] == len(rows)
    assert t["client_errors"] == len(bad)
    assert "--token-range 100:8193" in t["first_rejection"]["hint"]


def test_all_rejected_run_is_not_exercised_and_bisect_refuses(vllm_shared, traces, tmp_path):
    """The trace's default token range [10000, 32000) lies outside the tiny
    vocabulary: every request is rejected. That run exercised nothing."""
    res = replay(traces["blocks"], vllm_shared, tmp_path / "run", "--timing", "asap")
    assert res.returncode == 4, res.stdout + res.stderr
    assert "NOT EXERCISED" in res.stderr
    assert "20 of 20 requests were rejected" in res.stderr
    assert "--token-range 10000:32000" in res.stderr
    s = summary(tmp_path / "run")
    assert s["exercised"] is False and s["exit_code"] == 4
    assert s["targets"]["vllm"]["first_rejection"]["error_class"] == "stream_400"

    # the restart command never runs: nothing crashes
    common = ("--url", vllm_shared.url, "--model", vllm_shared.model, "--timing", "asap")
    bis = cli(
        "bisect",
        traces["blocks"],
        *common,
        *("--restart-cmd", "true", "--out", tmp_path / "bisect", "--calibrate", 1),
        timeout=300,
    )
    assert bis.returncode == 4, bis.stdout + bis.stderr
    assert "NOT EXERCISED, refusing to bisect" in bis.stderr
    assert "not reproducible" not in bis.stderr + bis.stdout
    assert not (tmp_path / "bisect" / "bundle").exists()

    chk = cli("check", traces["blocks"], *common, "--out", tmp_path / "check", timeout=300)
    assert chk.returncode == 128, chk.stdout + chk.stderr  # git bisect run aborts
    assert "NOT EXERCISED" in chk.stderr


def _metric(shared, name: str) -> float:
    status, body = shared.server.get("/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(cond, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)  # a bounded poll of an observable condition
    raise AssertionError(f"timed out after {within:g} s waiting for {what}")


@pytest.mark.parametrize("stopped", ["engine_core", "api_server"])
def test_sigstop_is_a_hang(vllm_shared, traces, tmp_path, stopped):
    """SIGSTOP of EngineCore: /health stays 200 and no token comes; of the
    API server: its event loop is frozen, /health probes time out too. The
    watchdog calls both a hang after --stall-timeout (the second with
    /health stalled, which used to wait out --request-timeout); SIGCONT
    recovers."""
    srv = vllm_shared.server
    core = srv.engine_core() if stopped == "engine_core" else srv.pid
    done0 = _metric(vllm_shared, "vllm:request_success_total")
    proc = subprocess.Popen(
        [sys.executable, "-m", "replayer", "replay", traces["tau2"]]
        + ["--target", f"vllm={vllm_shared.url}", "--model", vllm_shared.model]
        + ["--timing", "asap", "--sessions", "2..3", "--stall-timeout", "4"]
        + ["--out", str(tmp_path / "run"), "--quiet", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: _metric(vllm_shared, "vllm:request_success_total") >= done0 + 2,
            120,
            "two requests to complete",
        )
        os.kill(core, signal.SIGSTOP)
        out, err = proc.communicate(timeout=120)
    finally:
        os.kill(core, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()  # replayer replay --target: it owns no server
            proc.wait(30)
    assert proc.returncode == 1, out + err
    f = summary(tmp_path / "run")["targets"]["vllm"]["failure"]
    assert f["class"] == "hang"
    assert any(p["status"] == 200 for p in f["health"])  # before the stop
    after = [p["error"] for p in f["health"] if p["t"] > f["at_s"]]
    if stopped == "engine_core":
        assert "health_stalled" not in f and set(after) == {None}
    else:
        assert f["health_stalled"] is True and after and set(after) == {"timeout"}
    wait_for(lambda: vllm_shared.server.get("/health")[0] == 200, 30, "health after SIGCONT")
    status, _ = vllm_shared.server.post(
        "/v1/completions", {"model": vllm_shared.model, "prompt": "ok", "max_tokens": 2}
    )
    assert status == 200


@pytest.mark.parametrize("order", ["strict", "admitted"])
def test_admission_order(vllm_shared, tmp_path, order):
    """Strict order writes the requests in trace order, but with 4 renderer
    workers the engine may *admit* them out of order (and across connections
    the API server may even parse them out of order: seen once in 4 runs);
    admitted order paces each request on the previous one's response
    headers, and both the API server and the engine see trace order."""
    ids = ordered_chat_trace(tmp_path / "ordered.arrow", vllm_shared.model)
    start = vllm_shared.admission_log.stat().st_size
    res = replay(
        tmp_path / "ordered.arrow",
        vllm_shared,
        tmp_path / "run",
        "--timing",
        "asap",
        "--order",
        order,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    log = tmp_path / "admission.jsonl"
    with vllm_shared.admission_log.open("rb") as f:
        f.seek(start)
        log.write_bytes(f.read())
    received = admission_sequence(log, ids, "receipt")
    admitted = admission_sequence(log, ids, "admit")
    assert sorted(received) == sorted(admitted) == sorted(ids)
    sent = sorted(read_results(tmp_path / "run" / "results.arrow"), key=lambda r: r["seq"])
    assert [r["request_id"] for r in sent] == ids  # both modes: written in trace order
    print(
        f"order {order}: received {in_order_fraction(received, ids):.3f}, admitted "
        f"{in_order_fraction(admitted, ids):.3f} in order ({len(ids)} requests)"
    )
    if order == "admitted":
        assert received == ids
        assert admitted == ids
