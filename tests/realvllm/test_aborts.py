"""A crash on a client's abort, injected into real vLLM with the crash plugin
(``raise when abort>=1 and cached_tokens>=128``: EngineCore dies where its
scheduler finishes an aborted request that had a prefix-cache hit, as a KV
connector's hook does), against a trace whose recorded client left a
stream after 3 events: ``--aborts complete`` reads every answer to its end
and the server lives; ``--aborts replay`` leaves where the client did and
the engine dies, on the abort the plugin logs."""

from __future__ import annotations

import json
from pathlib import Path

from replayer.replay.results import read_results
from replayer.testing.vllm import VLLMServer, free_port
from replayer.trace.model import RequestRecord
from tests.helpers.realvllm import cli
from tests.helpers.traces import write

RULE = "raise when abort>=1 and cached_tokens>=128"
LONG = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(60))


def _trace(path: Path) -> Path:
    """One session: a long first turn, a second that extends it (a cache hit
    on replay) and that the recorded client left after 3 events, and a third
    that goes once the second is over."""
    msgs = [{"role": "user", "content": LONG}]
    second = [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    third = [*second, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "end"}]
    params = {"stream": True, "ignore_eos": True}
    rows = []
    for turn, (m, max_tokens) in enumerate(((msgs, 8), (second, 400), (third, 8))):
        body = {"model": "m", "messages": m, "max_tokens": max_tokens, **params}
        meta = {"abort": {"after_chunks": 3, "after_us": 50_000}} if turn == 1 else None
        rows.append(
            RequestRecord.from_body(
                body, request_id=f"r{turn}", session_id="s", turn=turn, start_us=turn, meta=meta
            )
        )
    write(path, rows)
    return path


def _fired(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    return [e for e in lines if e["fired"]]


def test_a_crash_on_abort_comes_with_replayed_aborts_and_not_with_complete(
    vllm_env, vllm_models, tmp_path
):
    trace = _trace(tmp_path / "t.arrow")
    log = tmp_path / "faults.jsonl"
    srv = VLLMServer(
        vllm_env,
        vllm_models["llama"],
        tmp_path / "server.log",
        extra=("--enable-prompt-tokens-details",),
        environ={"REPLAYER_VLLM_FAULTS": RULE, "REPLAYER_VLLM_FAULT_LOG": str(log)},
        served_name="tiny-llama",
        port=free_port(),
    )
    srv.start()
    try:

        def replay(name: str, aborts: str) -> tuple[int, list[str]]:
            out = tmp_path / name
            res = cli(
                "replay", trace, "--target", f"vllm={srv.url}", "--model", "tiny-llama",
                "--timing", "asap", "--aborts", aborts, "--request-timeout", "120",
                "--out", out, "--quiet", timeout=300,
            )  # fmt: skip
            by_id = {r["request_id"]: r["status"] for r in read_results(out / "results.arrow")}
            return res.returncode, [by_id[f"r{i}"] for i in range(3)]

        assert replay("complete", "complete") == (0, ["ok", "ok", "ok"])
        assert _fired(log) == [] and srv.proc is not None and srv.proc.poll() is None

        code, statuses = replay("replay", "replay")
        assert code == 1 and statuses[:2] == ["ok", "aborted"], statuses
        assert statuses[2] in ("http_error", "transport_error"), statuses
        fired = _fired(log)
        assert [(e["rule"], e["values"]["abort"]) for e in fired] == [("fault0", 1.0)], fired
        assert float(fired[0]["values"]["cached_tokens"]) >= 128  # type: ignore[arg-type]
        assert srv.wait_exit(60) == 0  # vLLM's API server exits 0 after engine death
    finally:
        srv.stop()
    assert "Triton Error [HIP]: Code: 700" in Path(srv.log_path).read_text()
