"""Replaying Anthropic Messages and OpenAI Responses traces: the same agent
sessions in each API, against the emulator, deliver their bodies and meet an
engine death as chat does (its class, nothing sent after it); an open
stream ends its API's way (vLLM's /v1/responses stream is cut, where chat
and Messages get an error event)."""

from __future__ import annotations

import orjson
import pytest

from replayer.analysis.compare import compare_runs
from replayer.analysis.report import render_report
from replayer.trace import Trace
from tests.helpers.agents import mixed_trace
from tests.helpers.cli import run

pytestmark = pytest.mark.e2e

MODEL = "agent-model"
SYNTH = ["--sessions", "3", "--turns", "4", "--context", "3000", "--system-tokens", "500",
         "--rate", "0", "--think", "0.01", "--max-tokens", "16", "--model", MODEL]  # fmt: skip
KIND = {"chat": "stream_error", "messages": "stream_error", "responses": "stream_cut"}
"""How a stream open at the death ends, per API; a request that arrives after
it (which comes first is the machine's call) gets vLLM's 500 on every API."""


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_engine_death_is_classified_as_on_chat(emulator_factory, tmp_path, api):
    trace = tmp_path / f"{api}.arrow"
    res = run("synth", "-o", trace, "--api", api, *SYNTH)
    assert res.returncode == 0, res.stderr
    emu = emulator_factory(
        ["--speed", "4", "--served-model-name", MODEL, "--fault", "dead when request=5"],
        log_bodies=True,
    )
    res = run(
        "replay", trace, "--target", emu.url, "--timing", "asap", "--settle", "1",
        "--out", tmp_path / "r", "--json", "--quiet",
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    t = orjson.loads(res.stdout)["targets"]["target"]
    # the engine dies as the 5th request arrives: the four before it may or
    # may not have finished (a busy machine decides), none after it is sent
    st = t["status"]
    errors = sum(n for k, n in st.items() if k not in ("ok", "not_sent_after_crash"))
    assert st["ok"] + errors + st["not_sent_after_crash"] == 12
    assert 3 <= st["ok"] <= 4 and errors >= 1 and st["not_sent_after_crash"] >= 1
    f = t["failure"]
    assert f["class"] == "engine_dead" and f["kind"] in (KIND[api], "http_500"), f
    # the first turns went through with their recorded bodies; forcing streams
    # adds stream_options to chat only (the other APIs' streams carry usage)
    tr = Trace.open(trace)
    sent = [e for e in emu.read_request_log() if e["event"] == "request"]
    patch = {"stream_options": {"include_usage": True}} if api == "chat" else {}
    first = {tr.column("request_id")[r]: {**tr.body(r), **patch} for r in tr.order[:3]}
    assert {e["request_id"]: e["body"] for e in sent if e["request_id"] in first} == first


def test_a_mixed_trace_reports_each_api_apart(emulator_factory, tmp_path):
    parts = []
    for api in ("chat", "messages", "responses"):
        p = tmp_path / f"{api}.arrow"
        assert run("synth", "-o", p, "--api", api, *SYNTH).returncode == 0
        parts.append((api, p))
    mixed = mixed_trace(tmp_path / "mixed.arrow", parts)
    emu = emulator_factory(["--speed", "instant", "--served-model-name", MODEL])
    res = run("replay", mixed, "--target", emu.url, "--timing", "asap", "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    t = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())["targets"]["target"]
    by = t["by_api"]
    assert list(by) == ["chat.completions", "messages", "responses"]
    assert [by[a]["status"] for a in by] == [{"ok": 12}] * 3
    assert all(by[a]["ttft_ms"]["n"] == 12 and by[a]["prompt_tokens"] > 0 for a in by)
    assert sum(by[a]["completion_tokens"] for a in by) == t["completion_tokens"]
    for api in by:
        assert f"  {api}: 12 requests (ok 12), ttft p50 " in res.stdout
    # compare puts each API's rows beside the run's own
    (g,) = compare_runs([tmp_path / "r", tmp_path / "r"], labels=["a", "b"])["groups"]
    rows = {r["key"]: r for r in g["rows"]}
    for api in by:
        assert rows[f"{api}_requests"]["values"] == {"a": 12, "b": 12}
        assert rows[f"{api}_ok"]["vs_baseline"]["b"]["ratio"] == 1.0
        assert rows[f"{api}_ttft_p50_ms"]["values"]["a"] == by[api]["ttft_ms"]["p50"]
    # and the HTML report has a row per API
    html = render_report(tmp_path / "r")
    section = html[html.index('<section id="by-api">') :].split("</section>")[0]
    assert [f"<td>{api}</td><td>12</td><td>12</td>" in section for api in by] == [True] * 3
