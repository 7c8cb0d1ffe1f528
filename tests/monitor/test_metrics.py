"""Scraped expositions into ``metrics.arrow`` and back: every sample with its
labels (sorted JSON), one batch per scrape, a counter summed over its
series, one metric's series filtered by labels."""

from __future__ import annotations

import pytest

from replayer.monitor.metrics import (
    MetricsWriter,
    Scrape,
    counter_sum,
    parse_samples,
    read_metrics,
    series,
)

pytestmark = pytest.mark.inprocess

EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m",engine="0"} 1200.0
vllm:prompt_tokens_total{model_name="m",engine="1"} 34.0
"""


def test_every_sample_with_its_labels_as_sorted_json():
    assert list(parse_samples(EXPOSITION)) == [
        ("vllm:num_requests_running", '{"engine":"0","model_name":"m"}', 3.0),
        ("vllm:num_requests_running", '{"engine":"1","model_name":"m"}', 1.0),
        ("vllm:prompt_tokens_total", '{"engine":"0","model_name":"m"}', 1200.0),
        ("vllm:prompt_tokens_total", '{"engine":"1","model_name":"m"}', 34.0),
    ]


def test_a_counter_summed_over_its_series():
    assert counter_sum(EXPOSITION, "vllm:prompt_tokens_total") == 1234.0
    assert counter_sum(EXPOSITION, "vllm:generation_tokens_total") is None
    assert counter_sum("not an exposition {", "x") is None


def test_scrapes_written_and_read_back_as_series(tmp_path):
    path = tmp_path / "metrics.arrow"
    w = MetricsWriter(path)
    assert w.add(Scrape(0.5, "http://vllm:8000/metrics", EXPOSITION)) == 4
    assert w.add(Scrape(1.0, "http://node:9100/metrics", "")) == 0  # nothing to write
    later = EXPOSITION.replace("} 3.0", "} 0.0")
    assert w.add(Scrape(1.5, "http://vllm:8000/metrics", later)) == 4
    w.close()
    w.close()  # twice is fine
    assert w.rows == 8
    rows = read_metrics(path)
    assert [r["t"] for r in rows] == [0.5] * 4 + [1.5] * 4
    assert {r["source"] for r in rows} == {"http://vllm:8000/metrics"}
    assert series(rows, "vllm:num_requests_running", engine="0") == [(0.5, 3.0), (1.5, 0.0)]
    assert series(rows, "vllm:num_requests_running") == [
        (0.5, 3.0), (0.5, 1.0), (1.5, 0.0), (1.5, 1.0),
    ]  # fmt: skip
    assert series(rows, "vllm:num_requests_running", engine="7") == []
