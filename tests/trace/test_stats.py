"""inspect figures, computed independently here from what was written."""

from __future__ import annotations

import pytest

from replayer.trace import RequestRecord, Trace
from replayer.trace.stats import inspect_trace, percentile, render_text
from tests.helpers.traces import write

pytestmark = pytest.mark.inprocess


def test_nearest_rank_percentile():
    data = list(range(1, 101))
    assert percentile(data, 50) == 50
    assert percentile(data, 99) == 99
    assert percentile(data, 100) == 100
    assert percentile([5], 1) == 5
    assert percentile([], 50) is None
    assert percentile([1, 2, 3, 4], 50) == 2


def test_inspect_figures(tmp_path):
    recs = []
    for s, turns in enumerate([3, 1, 2]):
        for k in range(turns):
            prompt = "x" * (40 * (k + 1) + s)
            recs.append(
                RequestRecord.from_body(
                    {"model": f"m{s % 2}", "prompt": prompt, "max_tokens": 5 + k},
                    request_id=f"{s}-{k}",
                    session_id=f"s{s}",
                    turn=k,
                    start_us=1_000_000 * (s + k),
                    end_us=1_000_000 * (s + k) + 500_000,
                )
            )
    t = write(tmp_path / "t.arrow", recs)
    info = inspect_trace(t)
    assert info["requests"] == 6
    assert info["sessions"] == 3
    assert info["turns_per_session"]["min"] == 1
    assert info["turns_per_session"]["max"] == 3
    assert info["turns_per_session"]["p50"] == 2
    # ceil(chars/4): 10, 20, 30 | 11 | 11, 21 (chars 40,80,120 | 41 | 42,82)
    assert sorted(t.column("input_tokens")) == [10, 11, 11, 20, 21, 30]
    assert info["input_tokens"]["max"] == 30
    assert info["input_tokens"]["p50"] == 11
    assert info["duration_s"] == 3.5  # first start 0 s, last end 3.5 s
    assert info["kinds"] == {"text": 6}
    assert info["models"] == {"m0": 5, "m1": 1}
    assert info["bytes_expanded"] == sum(len(t.body_json(r)) for r in range(6))
    assert info["bytes_on_disk"] == (tmp_path / "t.arrow").stat().st_size
    text = render_text(info)
    assert "requests     6" in text and "sessions     3" in text
    assert "context tok  min 10  p50 11  p99 30  max 30" in text


def test_inspect_empty_trace(tmp_path):
    t = write(tmp_path / "t.arrow", [])
    info = inspect_trace(Trace.open(tmp_path / "t.arrow"))
    assert (info["requests"], info["sessions"], info["input_tokens"]["max"]) == (0, 0, None)
    assert t is not None
    assert "requests     0" in render_text(info)
