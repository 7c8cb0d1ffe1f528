"""Anthropic Messages and OpenAI Responses against the shared real vLLM: the
official SDKs through the recorder see what they see direct, the trace keeps
each agent's session, and a synthetic trace of each API replays clean with
TTFT and usage from that API's stream."""

from __future__ import annotations

from replayer.record.proxy import RecordConfig, RecordingProxy
from replayer.replay.results import read_results
from replayer.trace.reader import Trace
from tests.helpers.agent_sessions import claude_session, codex_session, round_robin
from tests.helpers.realvllm import cli, summary


async def test_sdks_through_the_recorder_see_what_they_see_direct(vllm_shared, tmp_path):
    def agents(url: str):
        return round_robin(
            claude_session(url, "c1", 2, model=vllm_shared.model),
            codex_session(url, "x1", 2, chain=False, model=vllm_shared.model),
            codex_session(url, "x2", 2, chain=True, model=vllm_shared.model),
        )

    vllm_shared.reset_prefix_cache()
    # greedy decoding of one model, one request at a time: the same outputs twice
    want = await agents(vllm_shared.url)
    vllm_shared.reset_prefix_cache()
    cfg = RecordConfig(upstream=vllm_shared.url, output=tmp_path / "rec.arrow", port=0)
    async with RecordingProxy(cfg) as proxy:
        got = await agents(proxy.url)
    assert _without_ids(got) == _without_ids(want)
    t = Trace.open(cfg.output)
    c = t.column
    rows = {c("kind")[r]: [] for r in t.order}
    for r in t.order:
        rows[c("kind")[r]].append(r)
    assert sorted(rows) == ["messages", "responses"]
    assert (len(rows["messages"]), len(rows["responses"])) == (2, 4)
    for kind, rs in rows.items():
        sessions = {c("session_id")[r] for r in rs}
        assert len(sessions) == (1 if kind == "messages" else 2), kind
        assert sorted(c("turn")[r] for r in rs) == sorted([0, 1] * len(sessions))
        assert all(t.outcome(r)["status"] == 200 for r in rs)
        assert all(t.outcome(r)["usage_prompt_tokens"] for r in rs)
    # the chained turn was stored expanded: its parent's input and output, then its own
    (chained,) = [r for r in rows["responses"] if (t.meta(r) or {}).get("expanded")]
    parent = t.row_of(t.meta(chained)["expanded"]["parent"])
    assert c("session_id")[parent] == c("session_id")[chained]
    body = t.body(chained)
    assert "previous_response_id" not in body
    assert body["input"][: len(t.body(parent)["input"])] == t.body(parent)["input"]

    # and the recording replays clean against the same server
    res = cli("replay", cfg.output, "--target", f"vllm={vllm_shared.url}", "--timing", "asap",
              "--max-inflight", "1", "--out", tmp_path / "run", "--quiet")  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert summary(tmp_path / "run")["targets"]["vllm"]["status"] == {"ok": 6}
    # and chained again against it, to live response ids (the store is on)
    res = cli("replay", cfg.output, "--target", f"vllm={vllm_shared.url}", "--timing", "asap",
              "--max-inflight", "1", "--responses-state", "chain", "--out", tmp_path / "chain",
              "--quiet")  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert summary(tmp_path / "chain")["targets"]["vllm"]["status"] == {"ok": 6}


def _without_ids(seen):
    """Tool-call ids are random per response; everything else a client sees
    must be the same."""

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k != "id"}
        if isinstance(v, list | tuple):
            return [strip(x) for x in v]
        return v

    return strip(seen)


def test_synthetic_agent_traces_replay_clean(vllm_shared, tmp_path):
    for api in ("messages", "responses"):
        trace = tmp_path / f"{api}.arrow"
        res = cli("synth", "-o", trace, "--api", api, "--sessions", "2", "--turns", "3",
                  "--context", "2500", "--system-tokens", "400", "--max-tokens", "8",
                  "--rate", "0", "--think", "0")  # fmt: skip
        assert res.returncode == 0, res.stderr
        out = tmp_path / f"run-{api}"
        res = cli("replay", trace, "--target", f"vllm={vllm_shared.url}", "--model",
                  vllm_shared.model, "--timing", "asap", "--out", out, "--quiet")  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        t = summary(out)["targets"]["vllm"]
        assert t["status"] == {"ok": 6}, (api, t)
        assert t["exercised"] is True and t["client_errors"] == 0
        rows = read_results(out / "results.arrow")
        assert all(r["prompt_tokens"] and r["completion_tokens"] for r in rows), api
        assert all(r["first_token_us"] is not None for r in rows), api
