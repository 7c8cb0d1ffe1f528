"""Servers replayer launches and that die: readiness, clean stop, engine death.

Each test starts its own real vLLM through ``--launch`` (about 40-70 s on two
cores), so the tier keeps them few. The tests find the server's processes by
lineage from the replayer they started (:class:`ProcessTree`), never by name:
another vLLM on the same machine is not theirs, and they prove none of their
own is left when replayer is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

import orjson

from replayer.testing.vllm import free_port, serve_command
from tests.helpers.agents import mixed_trace
from tests.helpers.realvllm import summary, synth
from tests.helpers.target import ProcessTree, alive, titled

APIS = ("chat", "messages", "responses")


def stop(proc: subprocess.Popen[str], tree: ProcessTree) -> None:
    """However a test ends, nothing it started outlives it: SIGTERM lets
    replayer stop the server it launched; what is left of the tree is killed."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=60)
    if proc.poll() is None:
        proc.kill()
    tree.kill()


def watch(proc: subprocess.Popen[str], tree: ProcessTree, within: float) -> tuple[str, str]:
    """Wait for the CLI (bounded), scanning its tree meanwhile: the server it
    launches leaves for a session of its own, and is ours only as long as
    its parent is seen alive with it."""
    deadline = time.monotonic() + within
    while proc.poll() is None and time.monotonic() < deadline:
        tree.scan()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)  # a bounded poll: the server loads, then serves
    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    return out, err


def replayer(*args: Any) -> subprocess.Popen[str]:
    """``replayer ARGS`` as a session leader: the root of a :class:`ProcessTree`."""
    return subprocess.Popen(
        [sys.executable, "-m", "replayer", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def metric(port: int, name: str) -> float | None:
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        conn.close()
    except OSError:
        return None
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def test_launch_waits_for_ready_rejected_run_is_not_exercised_and_stops_clean(
    vllm_env, vllm_models, traces, tmp_path
):
    """A server started without tool calling rejects every body that carries
    tools (vLLM defaults tool_choice to "auto"): the replay is NOT EXERCISED,
    exit 4, not "survived". The server came up before the first request and
    its whole process group is gone afterwards."""
    port = free_port()
    cmd = serve_command(vllm_env, vllm_models["llama"], port, tools=False, served_name="tiny-llama")
    run = tmp_path / "run"
    proc = replayer(
        "replay",
        traces["chat"],
        *("--launch", cmd, "--model", "tiny-llama", "--timing", "asap"),
        *("--out", run, "--quiet"),
    )
    tree = ProcessTree(proc.pid)
    try:
        out, err = watch(proc, tree, 600)
        left = tree.alive()  # before any clean-up of ours
    finally:
        stop(proc, tree)  # a timed-out CLI cannot stop its server
    assert proc.returncode == 4, out + err
    seen = [t for t in tree.titles.values() if t.startswith(b"VLLM::EngineCore")]
    assert seen, "the tree never saw the server's engine: nothing was judged"
    assert "16 of 16 requests were rejected" in err
    assert '"auto" tool choice requires --enable-auto-tool-choice' in err
    info = orjson.loads((run / "run.json").read_bytes())
    assert info["target_facts"]["target"]["models"] == ["tiny-llama"]
    t = summary(run)["targets"]["target"]
    assert t["status"] == {"http_error": 16} and t["first_rejection"]["http_status"] == 400
    log = (run / "server.log").read_text()
    assert "Application startup complete" in log
    assert left == []  # the API server is gone, and its EngineCore and worker


def test_kill_9_mid_stream_on_every_api_is_process_exit_with_requests_named(
    vllm_env, vllm_models, tmp_path
):
    """SIGKILL of EngineCore on the MLA + MoE model while streams of chat
    completions, Anthropic Messages and OpenAI Responses are open: each ends
    its own way (chat's error event, Messages' error event after a converter
    failure, Responses cut mid-body), the API server exits 0 a few seconds
    later. replayer calls it process_exit as on chat alone, names the failing
    request and the ones in flight (of every API), and the signature has the
    exit status."""
    common = ["--sessions", "2", "--turns", "2", "--context", "1500", "--system-tokens",
              "300", "--max-tokens", "512", "--rate", "0", "--think", "0"]  # fmt: skip
    mixed = mixed_trace(
        tmp_path / "mixed.arrow",
        [(api, synth(tmp_path / f"{api}.arrow", "--api", api, *common)) for api in APIS],
        sep="-",
    )
    port = free_port()
    log = tmp_path / "admission.jsonl"
    cmd = serve_command(
        vllm_env,
        vllm_models["dsv2"],
        port,
        served_name="tiny-dsv2",
        extra=(
            "--enforce-eager",
            *("--middleware", "replayer.testing.vllm_plugin.ReceiptMiddleware"),
        ),
        environ={"REPLAYER_VLLM_ADMISSION_LOG": str(log)},
    )
    run = tmp_path / "run"
    proc = replayer("replay", mixed, "--launch", cmd, "--model", "tiny-dsv2",
                    "--timing", "asap", "--out", run, "--quiet")  # fmt: skip
    tree = ProcessTree(proc.pid)

    def streaming() -> set[str]:
        """APIs with a response whose headers have left (its stream is open)."""
        if not log.exists():
            return set()
        out = set()
        for line in log.read_text().splitlines():
            rec = orjson.loads(line)
            if rec.get("ev") == "headers":
                out.add(str(rec.get("id", "")).split("-", 1)[0])
        return out

    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and proc.poll() is None:
            tree.scan()
            if {"chat", "messages", "responses"} <= streaming():
                break
            time.sleep(0.2)  # a bounded poll: the server is loading, then serving
        assert proc.poll() is None, proc.communicate()
        assert {"chat", "messages", "responses"} <= streaming()
        members = tree.alive()
        cores = titled(members, b"VLLM::EngineCore")
        assert len(cores) == 1, members
        os.kill(cores[0], signal.SIGKILL)
        out, err = watch(proc, tree, 180)
        left = [p for p in members if alive(p)]  # before any clean-up of ours
    finally:
        stop(proc, tree)
    assert proc.returncode == 1, out + err
    t = summary(run)["targets"]["target"]
    f = t["failure"]
    assert f["class"] == "process_exit"
    assert f["request_id"] is not None
    lost = {f["request_id"], *f["inflight"]}
    assert {rid.split("-", 1)[0] for rid in lost} == {"chat", "messages", "responses"}, lost
    # every API has requests the death failed, not only ok or never sent
    by = t["by_api"]
    assert sorted(by) == ["chat.completions", "messages", "responses"], by
    assert all(set(by[a]["status"]) - {"ok", "not_sent_after_crash"} for a in by), by
    sig = orjson.loads((run / "signature.json").read_bytes())
    assert sig["failure_class"] == "process_exit"
    assert sig["exit"] == "code 0"  # vLLM's API server exits 0 after engine death
    assert left == []
