"""Bodies at wire speed (issue 17): how fast replayer puts long-context bodies
on the wire, side by side with what the wire allows, in one run.

Every sender runs pinned to core 0 against one discarding sink pinned to
core 1 (an asyncio protocol that counts body bytes and answers each request
with a two-chunk SSE completion), so each figure is one core of sending:

* **raw**: pre-built HTTP requests written with ``sendall`` on one blocking
  socket, each response read before the next: loopback's own ceiling;
* **prebuilt**: an aiohttp client posting pre-built bodies (16 in flight):
  the best any Python HTTP client does with no body to build;
* **replayer**: ``replayer replay --timing asap --no-monitor`` (16 in
  flight), building every body from the trace as it goes.

Traces: the kv-cache-tester corpus (real Claude Code sessions as 64-token
hash blocks, ~0.5 MB token-id bodies) and synthetic chat sessions with
120K-token contexts. MB/s is body bytes the sink received over the span from
its first to its last body byte; CPU is the sender's whole process (startup
included for replayer, so an upper bound). Also measured in-process: the
emulator's CPU per MB to read a token-id prompt (the fast read vs the full
JSON parse it falls back to).

``python -m bench wire_speed [-- --requests N --seconds S]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.replay import _pin, run_child

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "bench" / "out" / "wire_speed"
SHARED = REPO.parent / "shared" / "data"
MODEL = "sink-model"
SINK_CPU, SEND_CPU = 1, 0
CONCURRENCY = 16


# -- the discarding sink ----------------------------------------------------------


def _sse(chat: bool) -> bytes:
    if chat:
        first = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "x"},
                              "finish_reason": "length"}]}  # fmt: skip
    else:
        first = {"id": "c", "object": "text_completion", "created": 0, "model": MODEL,
                 "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}  # fmt: skip
    usage = {**first, "choices": [],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (first, usage))
    body += b"data: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


def _json(obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


class Stats:
    def __init__(self) -> None:
        self.bytes = 0
        self.requests = 0
        self.first: float | None = None
        self.last = 0.0
        self.delay = 0.0
        """Seconds a completion's answer waits (a server busy with prefill:
        every request of a burst then holds its own connection)."""

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


class Sink(asyncio.Protocol):
    """HTTP/1.1 keep-alive, Content-Length bodies only; bodies are counted
    and dropped, never buffered."""

    CHAT, TEXT = _sse(True), _sse(False)

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.head = bytearray()
        self.need = 0
        self.path = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.need:
                take = min(self.need, len(view))
                now = time.monotonic()
                st = self.stats
                st.first = now if st.first is None else st.first
                st.bytes += take
                st.last = now
                self.need -= take
                view = view[take:]
                if not self.need:
                    self._answer()
                continue
            self.head += view
            view = memoryview(b"")
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, rest = bytes(self.head[:end]), bytes(self.head[end + 4 :])
            self.head.clear()
            lines = head.split(b"\r\n")
            method, self.path = lines[0].split(b" ")[:2]
            length = 0
            for ln in lines[1:]:
                k, _, v = ln.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            self.need = length
            if not length:
                self._answer()
            view = memoryview(rest)

    def _answer(self) -> None:
        assert self.transport is not None
        p = self.path.split(b"?")[0]
        if p.startswith(b"/v1/") and p != b"/v1/models":
            self.stats.requests += 1
            answer = self.CHAT if p == b"/v1/chat/completions" else self.TEXT
            if self.stats.delay:
                asyncio.get_running_loop().call_later(self.stats.delay, self._late, answer)
            else:
                self.transport.write(answer)
        elif p == b"/v1/models":
            self.transport.write(
                _json(
                    {
                        "object": "list",
                        "data": [{"id": MODEL, "object": "model", "max_model_len": 10_000_000}],
                    }
                )  # fmt: skip
            )
        elif p == b"/stats":
            st = self.stats
            span = (st.last - st.first) if st.first is not None else 0.0
            self.transport.write(_json({"bytes": st.bytes, "requests": st.requests, "span": span}))
        elif p.startswith(b"/delay/"):  # /delay/MS: answers wait MS ms from now on
            self.stats.delay = int(p[7:]) / 1000
            self.transport.write(_json({}))
        elif p == b"/reset":
            self.stats.reset()
            self.transport.write(_json({}))
        else:
            self.transport.write(_json({}))

    def _late(self, answer: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(answer)


def sink_main(port_file: str) -> None:
    async def serve() -> None:
        stats = Stats()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Sink(stats), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with open(port_file, "w") as f:  # noqa: ASYNC230 - once, before serving
            f.write(str(port))
        await server.serve_forever()

    asyncio.run(serve())


@contextlib.contextmanager
def sink() -> Iterator[str]:
    WORK.mkdir(parents=True, exist_ok=True)
    pf = WORK / "sink.port"
    pf.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.wire_speed", "sink", str(pf)],
        preexec_fn=_pin(SINK_CPU),
        start_new_session=True,
    )
    try:
        for _ in range(500):
            if pf.exists() and pf.read_text():
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("the sink did not start")
        yield f"http://127.0.0.1:{pf.read_text()}"
    finally:
        proc.kill()
        proc.wait()


def _get(url: str, path: str) -> dict[str, Any]:
    import httpx

    r = httpx.get(url + path, timeout=30)
    result: dict[str, Any] = r.json()
    return result


# -- the senders ------------------------------------------------------------------


def bodies(trace: Path, n: int) -> tuple[str, list[bytes]]:
    """The first ``n`` bodies in trace order, as replayer sends them."""
    from replayer.trace import Trace
    from replayer.trace.schema import Kind

    t = Trace.open(trace)
    rows = list(t.order)[:n]
    patch = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}}
    out = [b for _, b in t.iter_json(rows, patch=patch)]
    path = "/v1/chat/completions" if Kind(t.column("kind")[rows[0]]).itemized else "/v1/completions"
    return path, out


def raw_child(trace: str, n: int, seconds: float, url: str) -> None:
    path, bs = bodies(Path(trace), n)
    host, port = url.removeprefix("http://").split(":")
    reqs = [
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (path.encode(), host.encode(), len(b)) + b
        for b in bs
    ]
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = s.makefile("rb")
        c0, t0 = time.process_time(), time.monotonic()
        sent = 0
        while time.monotonic() - t0 < seconds:
            for r in reqs:
                s.sendall(r)
                sent += 1
                length = 0
                while (line := f.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                f.read(length)
        print(json.dumps({"cpu_s": time.process_time() - c0, "requests": sent}))


def prebuilt_child(trace: str, n: int, seconds: float, url: str) -> None:
    import aiohttp

    path, bs = bodies(Path(trace), n)

    async def go() -> dict[str, Any]:
        conn = aiohttp.TCPConnector(limit=CONCURRENCY)
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as session:
            c0, t0 = time.process_time(), time.monotonic()
            sent = 0
            nxt = iter(range(1 << 40))

            async def worker() -> None:
                nonlocal sent
                while time.monotonic() - t0 < seconds:
                    body = bs[next(nxt) % len(bs)]
                    async with session.post(url + path, data=body, headers=headers) as r:
                        await r.read()
                    sent += 1

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            return {"cpu_s": time.process_time() - c0, "requests": sent}

    print(json.dumps(asyncio.run(go())))


def floor_child(trace: str, url: str) -> None:
    """The t = 0 burst's bodies, pre-built, written in strict order (each
    once the previous one is in its transport), two ways: aiohttp with
    replayer's own body payload, and a bare asyncio protocol (keep-alive
    pool, the request written as two transport writes, the answer known by
    its ``[DONE]``): what any client on aiohttp, and a lean one, could do."""
    from typing import Any as _Any

    import aiohttp

    from replayer._async import spawn

    class _Body(aiohttp.BytesPayload):
        """The body as its own write after the headers; ``sent`` once in the
        transport (what replayer's client did on aiohttp, until stop 25)."""

        def __init__(self, value: bytes, sent: asyncio.Future[None]) -> None:
            super().__init__(value)
            self._sent = sent

        async def write_with_length(self, writer: _Any, content_length: int | None) -> None:
            await writer.write(b"")
            await writer.write(self._value, drain=False)
            if not self._sent.done():
                self._sent.set_result(None)
            await writer.drain()

    path, bs = bodies(Path(trace), BURST)
    host, port = url.removeprefix("http://").split(":")
    headers = {"Content-Type": "application/json"}

    async def with_aiohttp() -> float:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            loop = asyncio.get_running_loop()
            tasks = []

            async def one(body: bytes, sent: asyncio.Future[None]) -> None:
                async with session.post(url + path, data=_Body(body, sent), headers=headers) as r:
                    await r.read()

            t0 = time.perf_counter()
            for b in bs:
                sent: asyncio.Future[None] = loop.create_future()
                tasks.append(spawn(one(b, sent), name="floor-send"))
                await sent
            took = time.perf_counter() - t0
            await asyncio.gather(*tasks)
            return took

    class Conn(asyncio.Protocol):
        def __init__(self, pool: list[Conn]) -> None:
            self.pool, self.buf = pool, b""
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.buf += data
            if b"[DONE]" in self.buf:
                self.buf = b""
                self.pool.append(self)

    async def with_protocol() -> float:
        loop = asyncio.get_running_loop()
        pool: list[Conn] = []
        t0 = time.perf_counter()
        for b in bs:
            if pool:
                c = pool.pop()
            else:
                _, c = await loop.create_connection(lambda: Conn(pool), host, int(port))
            assert c.transport is not None
            head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            c.transport.write(head.encode() + b"Content-Length: %d\r\n\r\n" % len(b))
            c.transport.write(b)
            await asyncio.sleep(0)  # one loop pass, as a send task would take
        return time.perf_counter() - t0

    out = {"aiohttp_ms": asyncio.run(with_aiohttp()) * 1e3}
    time.sleep(1)  # the sink drains the first burst
    out["protocol_ms"] = asyncio.run(with_protocol()) * 1e3
    print(json.dumps(out))


def measure(
    url: str, cmd: list[str], log: Path, timeout: float, pin: int | None = SEND_CPU
) -> dict[str, Any]:
    _get(url, "/reset")
    run = run_child(cmd, log=log, timeout=timeout, cpu=pin)
    if run.rc not in (0, 1):
        raise RuntimeError(f"{cmd[:4]} exited {run.rc}: {run.log_tail(800)}")
    st = _get(url, "/stats")
    mb = st["bytes"] / 1e6
    own = [json.loads(ln) for ln in run.log_tail(4000).splitlines() if ln.startswith('{"cpu_s"')]
    cpu = own[-1]["cpu_s"] if own else run.cpu
    return {
        "mb": round(mb, 1),
        "requests": st["requests"],
        "span_s": round(st["span"], 2),
        "mb_per_s": round(mb / st["span"], 1) if st["span"] > 0 else None,
        "cpu_ms_per_mb": round(1000 * cpu / mb, 2) if mb else None,
        "sender_cpu_s": round(cpu, 2),
        "process_wall_s": round(run.wall, 2),
        "mb_per_process_s": round(mb / run.wall, 1) if run.wall > 0 else None,
        "maxrss_mb": round(run.maxrss / 2**20),
    }


def side_by_side(
    url: str, trace: Path, n: int, prebuilt: int, seconds: float, label: str
) -> dict[str, Any]:
    """The first ``prebuilt`` bodies (held in memory, sent over and over) for
    raw and prebuilt; the first ``n`` requests for replayer."""
    me = [sys.executable, "-m", "bench.wire_speed"]
    out: dict[str, Any] = {}
    for kind in ("raw", "prebuilt"):
        cmd = [*me, kind, str(trace), str(prebuilt), str(seconds), url]
        out[kind] = measure(url, cmd, WORK / f"{label}-{kind}.log", seconds + 300)
    run_dir = WORK / f"{label}-replayer"
    cmd = [sys.executable, "-m", "replayer", "replay", str(trace), "--target", url,
           "--out", str(run_dir), "--force", "--quiet", "--timing", "asap", "--no-monitor",
           "--max-inflight", str(CONCURRENCY), "--model", MODEL]  # fmt: skip
    if n:
        cmd += ["--limit", str(n)]
    out["replayer"] = measure(url, cmd, WORK / f"{label}-replayer.log", 1800)
    summary = json.loads((run_dir / "summary.json").read_text())["targets"]["target"]
    out["replayer"]["ok"] = summary["status"].get("ok")
    pb = out["prebuilt"]["mb_per_s"]
    if pb and out["replayer"]["mb_per_s"]:
        out["ratio_vs_prebuilt"] = round(out["replayer"]["mb_per_s"] / pb, 3)
    return out


# -- the traces -------------------------------------------------------------------


def blocks_trace() -> Path:
    out = WORK / "kv-cache-tester.arrow"
    if not out.exists():
        srcs = sorted((SHARED / "kv_cache_tester_claude_code").glob("*.json.gz"))
        cmd = [sys.executable, "-m", "replayer", "import", "kv-cache-tester", *map(str, srcs),
               "-o", str(out)]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
    return out


def chat_trace() -> Path:
    out = WORK / "chat-120k.arrow"
    if not out.exists():
        cmd = [sys.executable, "-m", "replayer", "synth", "--sessions", "64", "--turns", "10",
               "--context", "120000", "--rate", "1", "--think", "1", "--seed", "5",
               "--max-tokens", "16", "--model", MODEL, "-o", str(out)]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
    return out


def emulator_read() -> dict[str, Any]:
    """CPU per MB of a 128K-token prompt: the fast read vs the full parse."""
    from replayer.emulator import tokenizer
    from replayer.emulator.config import EmulatorConfig
    from replayer.emulator.parsing import fast_token_prompt, parse_generation, parse_json_body
    from replayer.trace.tokens import BlockPrompts

    cfg = EmulatorConfig()
    prompt = BlockPrompts().json(list(range(2000)), 64, 128_000, "r")
    raw = b'{"model":"%s","max_tokens":1,"prompt":%s}' % (
        cfg.served_model_names[0].encode(),
        prompt.encode(),
    )

    def fast() -> None:
        got = fast_token_prompt(raw, "application/json")
        assert got is not None
        g = parse_generation(got[0], False, cfg, got[1])
        tokenizer.block_hashes(g.stream_bytes, cfg.block_size)

    def full() -> None:
        g = parse_generation(parse_json_body(raw, "application/json"), False, cfg)
        tokenizer.block_hashes(g.stream_bytes, cfg.block_size)

    def before() -> None:
        """The read as it was before issue 17 (commit 87b3e57), for the ratio."""
        import hashlib
        from array import array

        import orjson

        prompt = orjson.loads(raw)["prompt"]
        assert all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        assert not any(t < 0 for t in prompt) and max(prompt) < 1 << 64
        stream = array("Q", prompt).tobytes()
        top = max(array("Q", stream).tolist())
        assert top >= 0
        step, prev = cfg.block_size * 8, b""
        for i in range(len(stream) // step):
            prev = hashlib.blake2b(
                prev + stream[i * step : (i + 1) * step], digest_size=16
            ).digest()

    res: dict[str, Any] = {"body_mb": round(len(raw) / 1e6, 3)}
    for name, f in (("before", before), ("full_parse", full), ("fast_read", fast)):
        f()
        c0 = time.process_time()
        for _ in range(20):
            f()
        res[f"{name}_ms_per_mb"] = round(
            (time.process_time() - c0) / 20 / (len(raw) / 1e6) * 1e3, 2
        )
    return res


def build_only(trace: Path, n: int) -> dict[str, Any]:
    """In-process: CPU per MB to build the first ``n`` bodies, no sending."""
    from replayer.trace import Trace

    t = Trace.open(trace)
    rows = list(t.order)[:n]
    b = t.builder(rows)
    c0, total = time.process_time(), 0
    for r in rows:
        total += len(b.json(r, {"stream": True}))
    cpu = time.process_time() - c0
    return {
        "requests": len(rows),
        "mb": round(total / 1e6),
        "mb_per_cpu_s": round(total / 1e6 / cpu, 1),
        "stats": dict(t._prompts.stats),
    }


MEMORY_BOUNDS_MB = (256, 384, 512, 4096)
"""Prompt-cache bounds built under; 4,096 MB holds every prompt (the floor:
what no cache can save, each session's first turn and the blocks each turn
adds)."""


def memory_child(trace: str, cap_mb: str) -> None:
    """Build every body in dispatch order through the replay's own planned
    builder under one bound, nothing sent; figures as one JSON line."""
    from replayer.trace import Trace

    t = Trace.open(trace).configured(body_cache_bytes=int(cap_mb) << 20)
    rows = list(t.order)
    b = t.builder(rows)
    c0, total, peak_cache = time.process_time(), 0, 0
    for r in rows:
        total += len(b.json(r, {"stream": True}))
        peak_cache = max(peak_cache, t._prompts._prompts.size)
    cpu = time.process_time() - c0
    out = {"cap_mb": int(cap_mb), "requests": len(rows), "mb": round(total / 1e6),
           "mb_per_cpu_s": round(total / 1e6 / cpu), "cache_peak_mb": peak_cache >> 20,
           **t._prompts.stats}  # fmt: skip
    print(json.dumps(out), flush=True)


def memory(trace: Path) -> dict[str, Any]:
    """Peak RSS of building the whole corpus, per prompt-cache bound, and the
    blocks drawn again (past the floor an unbounded cache draws)."""
    out: dict[str, Any] = {}
    for cap in MEMORY_BOUNDS_MB:
        cmd = [sys.executable, "-m", "bench.wire_speed", "memory", str(trace), str(cap)]
        run = run_child(cmd, log=WORK / f"memory-{cap}.log", timeout=900, cpu=SEND_CPU)
        got = [ln for ln in run.log_tail(4000).splitlines() if ln.startswith('{"cap_mb"')]
        if run.rc != 0 or not got:
            raise RuntimeError(f"memory {cap} MB exited {run.rc}: {run.log_tail(800)}")
        out[str(cap)] = {**json.loads(got[-1]), "maxrss_mb": round(run.maxrss / 2**20)}
    floor = out[str(MEMORY_BOUNDS_MB[-1])]["drawn_blocks"]
    for v in out.values():
        v["drawn_again"] = v["drawn_blocks"] - floor
    return out


def _paced(url: str, trace: Path, run_dir: Path, speed: int, limit: int) -> list[str]:
    """A replay at recorded pace times ``speed`` of the first ``limit`` requests."""
    return [sys.executable, "-m", "replayer", "replay", str(trace), "--target", url,
            "--out", str(run_dir), "--force", "--quiet", "--no-monitor", "--speed",
            str(speed), "--limit", str(limit), "--model", MODEL]  # fmt: skip


CORPUS_REQUESTS = 33049
"""The corpus at 5x up to where stop 25's run was stopped: 67 % of the
requests, the dense first 94 minutes of the recording (all 710 sessions
live at 210 s); the rest is a tail of days."""


def corpus(url: str, trace: Path, speed: int = 5) -> dict[str, Any]:
    """The long run: recorded pace over most of the corpus; lag, stalls and
    peak RSS over all of it."""
    run_dir = WORK / f"corpus-{speed}x"
    cmd = _paced(url, trace, run_dir, speed, CORPUS_REQUESTS)
    m = measure(url, cmd, WORK / f"corpus-{speed}x.log", 3600)
    summary = json.loads((run_dir / "summary.json").read_text())
    target = summary["targets"]["target"]
    return {
        "speed": speed,
        "requests": target["lag_ms"].get("n"),
        "ok": target["status"].get("ok"),
        "lag_ms": target["lag_ms"],
        "loop_stall_ms": summary.get("loop_stall_ms"),
        "maxrss_mb": m["maxrss_mb"],
        "process_wall_s": m["process_wall_s"],
    }


PACE_REQUESTS = 2000
"""The corpus' first 2,000 requests: 710 sessions start at t = 0 (389 MB of
bodies due in the first second), then 45 s of recorded agent turns."""


def pace(url: str, trace: Path) -> dict[str, Any]:
    """Recorded timing at increasing speed: schedule lag and loop stalls
    (replayer's own figures, summary.json), peak RSS."""
    out: dict[str, Any] = {}
    for speed in (1, 5, 10, 20):
        run_dir = WORK / f"pace-{speed}x"
        cmd = _paced(url, trace, run_dir, speed, PACE_REQUESTS)
        m = measure(url, cmd, WORK / f"pace-{speed}x.log", 900)
        summary = json.loads((run_dir / "summary.json").read_text())
        lag = summary["targets"]["target"]["lag_ms"]
        out[f"{speed}x"] = {
            "lag_p50_ms": lag.get("p50"),
            "lag_p99_ms": lag.get("p99"),
            "lag_max_ms": lag.get("max"),
            "loop_stall_ms": summary.get("loop_stall_ms"),
            "maxrss_mb": m["maxrss_mb"],
            "mb": m["mb"],
        }
    return out


BURST = 710
"""The corpus' first 710 requests: one per session, all due at t = 0."""


def burst(url: str, trace: Path, repeat: int) -> dict[str, Any]:
    """The t = 0 burst alone (710 new sessions, 389 MB) at recorded pace,
    against a sink that answers at once (a few connections carry it all)
    and one that answers after 3 s (a server busy with prefill: every
    request on a connection of its own); ``repeat`` rounds, interleaved
    (this VM drifts), lag of the last request sent (summary ``lag_ms``)."""
    runs: dict[str, list[float]] = {
        "answer-at-once": [],
        "answer-after-3s": [],
        "floor-aiohttp": [],
        "floor-protocol": [],
    }
    for _ in range(repeat):
        _get(url, "/reset")
        floor = run_child([sys.executable, "-m", "bench.wire_speed", "floor", str(trace), url],
                          log=WORK / "burst-floor.log", timeout=300, cpu=SEND_CPU)  # fmt: skip
        got = [json.loads(ln) for ln in floor.log_tail(4000).splitlines() if ln.startswith("{")]
        if floor.rc != 0 or not got:
            raise RuntimeError(f"burst floor exited {floor.rc}: {floor.log_tail(800)}")
        runs["floor-aiohttp"].append(round(got[-1]["aiohttp_ms"], 1))
        runs["floor-protocol"].append(round(got[-1]["protocol_ms"], 1))
        for label, delay in (("answer-at-once", 0), ("answer-after-3s", 3000)):
            run_dir = WORK / f"burst-{label}"
            cmd = [sys.executable, "-m", "replayer", "replay", str(trace), "--target", url,
                   "--out", str(run_dir), "--force", "--quiet", "--no-monitor",
                   "--limit", str(BURST), "--model", MODEL]  # fmt: skip
            _get(url, "/reset")
            _get(url, f"/delay/{delay}")
            run = run_child(cmd, log=WORK / f"burst-{label}.log", timeout=300, cpu=SEND_CPU)
            if run.rc != 0:
                raise RuntimeError(f"burst {label} exited {run.rc}: {run.log_tail(800)}")
            summary = json.loads((run_dir / "summary.json").read_text())
            runs[label].append(summary["targets"]["target"]["lag_ms"]["max"])
    _get(url, "/reset")
    out: dict[str, Any] = {}
    for label, lags in runs.items():
        out[label] = {"lag_max_ms_median": sorted(lags)[len(lags) // 2], "all": lags}
    return out


def workers(url: str, trace: Path, n: int, repeat: int) -> dict[str, Any]:
    """``--workers 1`` on one core, ``--workers 1`` and ``--workers 2`` on
    both (the sink shares one): the first ``n`` blocks requests as fast as
    they go, strict order; ``repeat`` rounds, interleaved (this VM drifts),
    the median run of each kept. CPU is the replayer's process tree's,
    workers included; ``cores`` is that CPU over the process's wall time."""
    runs: dict[str, list[dict[str, Any]]] = {}
    configs = (("1-one-core", 1, SEND_CPU), ("1", 1, None), ("2", 2, None))
    for _ in range(repeat):
        for label, k, cpu in configs:
            run_dir = WORK / f"workers-{label}"
            cmd = [sys.executable, "-m", "replayer", "replay", str(trace), "--target", url,
                   "--out", str(run_dir), "--force", "--quiet", "--timing", "asap",
                   "--no-monitor", "--max-inflight", str(CONCURRENCY), "--model", MODEL,
                   "--workers", str(k), "--limit", str(n)]  # fmt: skip
            m = measure(url, cmd, WORK / f"workers-{label}.log", 1800, pin=cpu)
            summary = json.loads((run_dir / "summary.json").read_text())
            m["ok"] = summary["targets"]["target"]["status"].get("ok")
            m["body_workers"] = summary.get("body_workers")
            m["cores"] = round(m["sender_cpu_s"] / m["process_wall_s"], 2)
            runs.setdefault(label, []).append(m)
    out: dict[str, Any] = {}
    for label, ms in runs.items():
        ms.sort(key=lambda m: m["mb_per_s"] or 0)
        out[label] = {**ms[len(ms) // 2], "all_mb_per_s": [m["mb_per_s"] for m in ms]}
    for base in ("1-one-core", "1"):
        a, b = out[base]["mb_per_s"], out["2"]["mb_per_s"]
        if a and b:
            out[f"speedup_vs_{base}"] = round(b / a, 2)
    return out


def sigterm(url: str, trace: Path, runs: int) -> dict[str, Any]:
    """SIGTERM at a random moment of a replay (start-up, the T0 burst, steady
    sending): seconds until the process is gone, and how it exited."""
    import random
    import signal

    rng = random.Random(17)
    out: list[dict[str, Any]] = []
    for k in range(runs):
        run_dir = WORK / f"sigterm-{k}"
        cmd = [sys.executable, "-m", "replayer", "replay", str(trace), "--target", url,
               "--out", str(run_dir), "--force", "--quiet", "--speed", "20", "--no-monitor",
               "--limit", "4000", "--model", MODEL]  # fmt: skip
        with (WORK / f"sigterm-{k}.log").open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=_pin(SEND_CPU))  # fmt: skip
            at = rng.uniform(0.3, 6.0)
            try:
                proc.wait(timeout=at)
                out.append({"at_s": round(at, 2), "ended_before": True, "rc": proc.returncode})
                continue
            except subprocess.TimeoutExpired:
                pass
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            gone = time.monotonic() - t0
        summary = run_dir / "summary.json"
        interrupted = summary.exists() and json.loads(summary.read_text()).get("interrupted")
        out.append({"at_s": round(at, 2), "exit_s": round(gone, 3), "rc": rc,
                    "summary_says_interrupted": bool(interrupted)})  # fmt: skip
    exits = [r["exit_s"] for r in out if "exit_s" in r]
    return {
        "runs": out,
        "signalled": len(exits),
        "max_exit_s": max(exits) if exits else None,
        "within_1s": sum(e <= 1.0 for e in exits),
    }


def main(argv: list[str]) -> dict[str, Any]:
    if argv and argv[0] in ("sink", "raw", "prebuilt", "floor", "memory"):
        kind, rest = argv[0], argv[1:]
        if kind == "memory":
            memory_child(rest[0], rest[1])
        elif kind == "sink":
            sink_main(rest[0])
        elif kind == "floor":
            floor_child(rest[0], rest[1])
        else:
            fn = raw_child if kind == "raw" else prebuilt_child
            fn(rest[0], int(rest[1]), float(rest[2]), rest[3])
        return {}
    ap = argparse.ArgumentParser(prog="bench wire_speed")
    ap.add_argument(
        "--requests", type=int, default=0, help="blocks requests replayed (default: all)"
    )
    ap.add_argument("--seconds", type=float, default=8.0, help="raw and prebuilt send time")
    ap.add_argument("--sigterm-runs", type=int, default=20, help="replays stopped by SIGTERM")
    ap.add_argument(
        "--only",
        choices=("speed", "pace", "burst", "sigterm", "workers", "memory", "corpus"),
        help="one part only (corpus: ~20 minutes, only when asked for)",
    )
    ap.add_argument("--burst-repeat", type=int, default=5, help="rounds of the t = 0 burst")
    ap.add_argument(
        "--workers-requests", type=int, default=12000, help="blocks requests, workers 1 vs 2"
    )
    ap.add_argument("--workers-repeat", type=int, default=3, help="rounds of workers 1 vs 2")
    args = ap.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    fig: dict[str, Any] = {"cores": os.cpu_count()}
    blocks, chat = blocks_trace(), chat_trace()
    if args.only in (None, "speed"):
        fig["emulator_read"] = emulator_read()
        fig["build_blocks"] = build_only(blocks, args.requests or 10**9)
    if args.only in (None, "memory"):
        fig["memory"] = memory(blocks)
    with sink() as url:
        if args.only in (None, "speed"):
            fig["blocks"] = side_by_side(url, blocks, args.requests, 1500, args.seconds, "blocks")
            fig["chat"] = side_by_side(url, chat, 640, 640, args.seconds, "chat")
        if args.only in (None, "pace"):
            fig["pace"] = pace(url, blocks)
        if args.only in (None, "burst"):
            fig["burst"] = burst(url, blocks, args.burst_repeat)
        if args.only in (None, "sigterm"):
            fig["sigterm"] = sigterm(url, blocks, args.sigterm_runs)
        if args.only in (None, "workers"):
            fig["workers"] = workers(url, blocks, args.workers_requests, args.workers_repeat)
        if args.only == "corpus":
            fig["corpus"] = corpus(url, blocks)
    print(render(fig))
    return fig


def render(fig: dict[str, Any]) -> str:
    lines = []
    for cap, m in fig.get("memory", {}).items():
        lines.append(
            f"whole corpus built, prompt cache {cap} MB: peak RSS {m['maxrss_mb']} MB, "
            f"cache peak {m['cache_peak_mb']} MB, blocks drawn {m['drawn_blocks']} "
            f"({m['drawn_again']} again), {m['mb_per_cpu_s']} MB per CPU second"
        )
    if "corpus" in fig:
        c = fig["corpus"]
        st = c["loop_stall_ms"] or {}
        lines.append(
            f"corpus at {c['speed']}x, {c['requests']} requests ({c['ok']} ok): lag p99 "
            f"{c['lag_ms'].get('p99')} / max {c['lag_ms'].get('max')} ms; loop stall p99.9 "
            f"{st.get('p99_9')} / max {st.get('max')} ms; peak RSS {c['maxrss_mb']} MB "
            f"in {c['process_wall_s']} s"
        )
    if "sigterm" in fig:
        st = fig["sigterm"]
        lines.append(
            f"SIGTERM at random moments: {st['within_1s']} of {st['signalled']} signalled runs "
            f"gone within 1 s (max {st['max_exit_s']} s)"
        )
    for speed, p in fig.get("pace", {}).items():
        st = p["loop_stall_ms"] or {}
        lines.append(
            f"recorded pace {speed}: lag p50 {p['lag_p50_ms']} / p99 {p['lag_p99_ms']} / max "
            f"{p['lag_max_ms']} ms; loop stall p99.9 {st.get('p99_9')} / max {st.get('max')} ms; "
            f"peak RSS {p['maxrss_mb']} MB"
        )
    for label, b in fig.get("burst", {}).items():
        lines.append(
            f"t = 0 burst, {label}: last request out after {b['lag_max_ms_median']} ms "
            f"(median; all {b['all']})"
        )
    if "workers" in fig:
        w = fig["workers"]
        for k in ("1-one-core", "1", "2"):
            m = w[k]
            lines.append(
                f"--workers {k}: {m['mb_per_s']} MB/s, {m['cpu_ms_per_mb']} CPU ms/MB, "
                f"{m['cores']} cores busy, {m['mb']} MB, ok {m['ok']}, "
                f"peak RSS {m['maxrss_mb']} MB (runs: {m['all_mb_per_s']} MB/s)"
            )
        lines.append(
            f"--workers 2 / --workers 1: {w.get('speedup_vs_1')}x "
            f"(/ --workers 1 on one core: {w.get('speedup_vs_1-one-core')}x)"
        )
    if "blocks" not in fig:
        return "\n".join(lines)
    lines += [
        "| trace | sender | MB/s | CPU ms/MB | MB sent | RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for label in ("blocks", "chat"):
        for kind in ("raw", "prebuilt", "replayer"):
            m = fig[label][kind]
            lines.append(
                f"| {label} | {kind} | {m['mb_per_s']} | {m['cpu_ms_per_mb']} | {m['mb']} "
                f"| {m['maxrss_mb']} |"
            )
        lines.append(
            f"| {label} | replayer / prebuilt | {fig[label].get('ratio_vs_prebuilt')} |||||"
        )
    e = fig["emulator_read"]
    lines.append("")
    lines.append(
        f"emulator, a {e['body_mb']} MB token-id prompt: before issue 17 {e['before_ms_per_mb']} "
        f"ms/MB; now the full parse {e['full_parse_ms_per_mb']} ms/MB, the fast read "
        f"{e['fast_read_ms_per_mb']} ms/MB "
        f"({e['before_ms_per_mb'] / e['fast_read_ms_per_mb']:.1f}x faster than before)"
    )
    b = fig["build_blocks"]
    lines.append(
        f"building the first {b['requests']:,} blocks bodies ({b['mb']:,} MB) in-process: "
        f"{b['mb_per_cpu_s']} MB per CPU second; {b['stats']}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
