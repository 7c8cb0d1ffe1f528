"""``summary.json`` per target from its results: counts, nearest-rank
latencies of the ``ok`` requests in ms, lag of the sent ones, throughput over
the span, cached tokens from the responses or the server's counters, client
errors and whether the run exercised the target; and the printed summary."""

from __future__ import annotations

import pytest

from replayer.replay.results import Result, Status
from replayer.replay.summary import exercised, render, summarize_target, unexercised_text

pytestmark = pytest.mark.inprocess


def result(i: int, status: Status = Status.OK, **kw) -> Result:
    sent = status not in (Status.SKIPPED, Status.NOT_SENT_AFTER_CRASH)
    times = dict(scheduled_us=i * 1000, dispatched_us=i * 1000 + 500) if sent else {}
    return Result("t", i, f"r{i}", "s", i, status, seq=i if sent else None, **times | kw)


RESULTS = [
    result(0, first_token_us=10_500, done_us=40_500, prompt_tokens=100, completion_tokens=8,
           cached_tokens=0, itl_mean_us=2_000),
    result(1, first_token_us=21_500, done_us=1_000_500, prompt_tokens=100, completion_tokens=8,
           cached_tokens=50),
    result(2, Status.HTTP_ERROR, http_status=400, error_class="http_400", error="too long",
           done_us=3_000),
    result(3, Status.NOT_SENT_AFTER_CRASH),
]  # fmt: skip


def test_the_figures_of_a_target():
    s = summarize_target(RESULTS, None)
    assert (s["requests"], s["sent"], s["failed"], s["failure"]) == (4, 3, False, None)
    assert s["status"] == {"http_error": 1, "not_sent_after_crash": 1, "ok": 2}
    assert s["error_classes"] == {"http_400": 1}
    assert s["ttft_ms"] == {"n": 2, "p50": 10.0, "p90": 20.0, "p99": 20.0, "max": 20.0,
                            "mean": 15.0}  # fmt: skip
    assert s["e2e_ms"]["p50"] == 40.0 and s["e2e_ms"]["max"] == 999.0
    assert s["itl_ms"] == {"n": 1, "p50": 2.0, "p90": 2.0, "p99": 2.0, "max": 2.0, "mean": 2.0}
    assert (s["lag_ms"]["n"], s["lag_ms"]["max"]) == (3, 0.5)
    assert s["span_s"] == 1.0  # first dispatch (500 us) to last completion
    assert (s["throughput_rps"], s["output_tokens_per_s"]) == (2.0, 16.0)
    assert (s["prompt_tokens"], s["completion_tokens"]) == (200, 16)
    assert (s["cached_tokens"], s["cached_tokens_source"], s["prefix_cache_hit_ratio"]) == (
        50, "responses", 0.25,
    )  # fmt: skip
    assert (s["client_errors"], s["exercised"]) == (1, True)
    assert s["first_rejection"] == {
        "request_id": "r2", "seq": 2, "http_status": 400, "error_class": "http_400",
        "message": "too long",
    }  # fmt: skip
    assert "by_api" not in s
    by_api = summarize_target(RESULTS, None, api_of=lambda r: "chat" if r.row else "messages")
    assert {k: v["requests"] for k, v in by_api["by_api"].items()} == {"chat": 3, "messages": 1}


def test_cached_tokens_from_the_servers_counters_when_responses_say_none():
    ok = [result(0, done_us=2_000)]
    s = summarize_target(ok, None, prefix_cache={"hits": 30.0, "queries": 120.0})
    assert (s["cached_tokens"], s["cached_tokens_source"], s["prefix_cache_hit_ratio"]) == (
        30, "metrics", 0.25,
    )  # fmt: skip
    s = summarize_target(ok, None)
    assert (s["cached_tokens"], s["cached_tokens_source"]) == (None, None)


def test_a_run_mostly_rejected_did_not_exercise_the_target():
    assert exercised(0, 0) and exercised(4, 2) and not exercised(4, 3)
    rejected = [result(i, Status.HTTP_ERROR, http_status=400, error_class="http_400",
                       error="bad") for i in range(3)] + [result(3, done_us=5_000)]  # fmt: skip
    summary = {"targets": {"t": summarize_target(rejected, None)}}
    assert summary["targets"]["t"]["exercised"] is False
    assert unexercised_text(summary) == (
        "target t: 3 of 4 requests were rejected as client errors (the trace did not exercise "
        "the target); first: r0 got HTTP 400: bad"
    )
    assert render(summary).splitlines()[0] == "t: NOT EXERCISED  sent 4/4  http_error 3  ok 1"


def test_the_printed_summary():
    text = render({"targets": {"mi355": summarize_target(RESULTS, None)}})
    assert text.splitlines() == [
        "mi355: survived  sent 3/4  http_error 1  not_sent_after_crash 1  ok 2",
        "  1 of 3 requests were rejected as client errors; first: r2 got HTTP 400: too long",
        "  cached 50 prompt tokens (25.0% hit ratio)",
        "  ttft p50 10.0  p99 20.0  max 20.0 ms",
        "  e2e  p50 40.0  p99 999.0  max 999.0 ms",
        "  lag  p50 0.5  p99 0.5  max 0.5 ms",
        "  throughput 2.0 req/s, 16 output tok/s over 1.00 s",
    ]
