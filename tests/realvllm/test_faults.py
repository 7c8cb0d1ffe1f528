"""Faults against the shared real vLLM, as the emulator tier tries them: a
recorder killed with SIGKILL while SDK clients stream through it keeps every
exchange a client saw end, and a connection reset between replay and a
healthy vLLM is the network's (class ``network``, exit 3), not a crash."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import openai
import orjson

from replayer._async import spawn
from replayer.testing.faultproxy import Fault, FaultProxy
from replayer.trace.reader import Trace
from tests.helpers.realvllm import summary

BOUND = 120.0


async def _recorder(upstream: str, out: Path) -> tuple[asyncio.subprocess.Process, str]:
    port_file = out.with_suffix(".port")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "replayer", "record", "--upstream", upstream, "-o", str(out),
        "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--progress", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    async with asyncio.timeout(60):
        while not (port_file.exists() and port_file.read_text().endswith("\n")):
            assert proc.returncode is None, "record exited before it listened"
            await asyncio.sleep(0.05)  # polling the port file, bounded above
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


async def test_a_recorder_killed_mid_stream_keeps_every_exchange_a_client_saw_end(
    vllm_shared, tmp_path
):
    out = tmp_path / "rec.arrow"
    proc, url = await _recorder(vllm_shared.url, out)
    done: set[str] = set()
    enough = asyncio.Event()

    async def client(k: int) -> None:
        oa = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        async with oa:
            for n in range(50):  # bounded; the kill ends it first
                rid = f"c{k}-{n}"
                try:
                    stream = await oa.chat.completions.create(
                        model=vllm_shared.model,
                        messages=[{"role": "user", "content": f"count to {n} ({rid})"}],
                        max_tokens=12,
                        stream=True,
                        extra_headers={"X-Request-Id": rid},
                    )
                    async for _ in stream:
                        pass
                except openai.APIError:
                    return  # the recorder is gone
                done.add(rid)  # the client had the stream's end
                if len(done) >= 8:
                    enough.set()

    clients = [spawn(client(k), name=f"client{k}") for k in range(3)]
    try:
        async with asyncio.timeout(BOUND):
            await enough.wait()
        proc.send_signal(signal.SIGKILL)  # mid-stream: three clients are always streaming
        await asyncio.wait_for(proc.wait(), 30)
        await asyncio.wait_for(asyncio.gather(*clients), BOUND)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for c in clients:
            c.cancel()
    assert proc.returncode == -signal.SIGKILL
    t = Trace.open(out)  # whole batches kept, a torn tail dropped
    kept = set(t.column("request_id"))
    assert len(done) >= 8
    assert done <= kept, sorted(done - kept)
    assert all(t.outcome(r)["status"] == 200 for r in range(len(t)))


async def test_a_reset_in_front_of_a_healthy_vllm_is_the_networks(vllm_shared, traces, tmp_path):
    async with FaultProxy(vllm_shared.url) as proxy:
        proxy.on(Fault.reset(after_bytes=200), method="POST", nth=3)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "replayer", "replay", str(traces["chat"]),
            "--target", f"vllm={proxy.url}", "--target-health", f"vllm={vllm_shared.url}",
            "--model", vllm_shared.model, "--timing", "asap", "--max-inflight", "1",
            "--out", str(tmp_path / "run"), "--quiet", "--health-interval", "0.5",
            "--settle", "2", "--grace", "0.5",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ},
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 3, err.decode()[-2000:]
    t = summary(tmp_path / "run")["targets"]["vllm"]
    assert t["failure"]["class"] == "network", orjson.dumps(t["failure"]).decode()
    assert "network: the target answered /health 200" in t["failure"]["message"]
    status, _ = vllm_shared.server.post("/reset_prefix_cache", {})
    assert status == 200  # vLLM itself never noticed: it is up and answering
