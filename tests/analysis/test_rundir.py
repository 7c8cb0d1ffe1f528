"""Reading what replayer wrote: a target's results as columns (latencies of
the ``ok`` requests, lag of the sent ones, the span), nearest-rank
distributions, trials from a journal or a bundle, and what a directory is."""

from __future__ import annotations

import orjson
import pytest

from replayer.analysis.rundir import (
    TargetResults,
    dist_ms,
    is_bisect_dir,
    is_bundle_dir,
    is_run_dir,
    load_run,
    load_trials,
)
from replayer.bisect.files import journal_header
from replayer.errors import UsageError

pytestmark = pytest.mark.inprocess

N = None
COLS = {
    # three requests: ok, ok, and one failed before anything came back; a
    # fourth never sent
    "row": [0, 1, 2, 3],
    "status": ["ok", "ok", "error", "not_sent"],
    "seq": [0, 1, 2, N],
    "scheduled_us": [0, 1_000, 2_000, 3_000],
    "dispatched_us": [500, 1_000, 4_000, N],
    "first_token_us": [10_500, 6_000, N, N],
    "done_us": [40_500, 21_000, 9_000, N],
    "itl_mean_us": [2_000, N, N, N],
}


def test_latencies_of_the_ok_requests_and_lag_of_the_sent_ones():
    t = TargetResults("mi355", dict(COLS))
    assert len(t) == 4
    assert (t.sent(), t.ok()) == ([0, 1, 2], [0, 1])
    assert t.latencies_ms("ttft") == [10.0, 5.0]
    assert t.latencies_ms("e2e") == [40.0, 20.0]
    assert t.latencies_ms("itl") == [2.0]
    assert t.latencies_ms("lag") == [0.5, 0.0, 2.0]
    with pytest.raises(ValueError, match="unknown metric 'tpot'"):
        t.latencies_ms("tpot")
    assert t.span_s() == (40_500 - 500) / 1e6
    assert TargetResults("x", {**COLS, "dispatched_us": [N] * 4}).span_s() == 0.0


def test_a_failure_is_the_summarys_object_or_none():
    assert TargetResults("a", COLS, summary={"failure": {"class": "engine_dead"}}).failure == {
        "class": "engine_dead"
    }
    assert TargetResults("a", COLS, summary={"failure": "engine_dead"}).failure is None
    assert TargetResults("a", COLS).failure is None


def test_dist_ms_is_nearest_rank():
    assert dist_ms([5.0, 1.0, 3.0, 2.0, 4.0]) == {
        "n": 5, "p50": 3.0, "p90": 5.0, "p99": 5.0, "max": 5.0, "mean": 3.0,
    }  # fmt: skip
    assert dist_ms([]) == {"n": 0, "p50": None, "p90": None, "p99": None, "max": None,
                           "mean": None}  # fmt: skip


def test_trials_of_a_bisect_directory_or_a_bundle_in_trial_order(tmp_path):
    bisect, bundle = tmp_path / "bisect", tmp_path / "bundle"
    bisect.mkdir()
    bundle.mkdir()
    journal = [
        journal_header(),
        {"event": "trial", "timing": "asap", "speed": 1.0, "record": {"trial": 2, "size": 3}},
        {"event": "mark", "name": "prefix", "trials": 1},
        {"event": "trial", "timing": "recorded", "speed": 2.0, "record": {"trial": 1, "size": 9}},
    ]
    (bisect / "journal.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in journal))
    assert load_trials(bisect) == [
        {"trial": 1, "size": 9, "timing": "recorded", "speed": 2.0},
        {"trial": 2, "size": 3, "timing": "asap", "speed": 1.0},
    ]
    (bundle / "trials.jsonl").write_bytes(b'{"trial": 3}\n\n{"trial": 1}\n')
    (bundle / "manifest.json").write_text("{}")
    assert load_trials(bundle) == [{"trial": 1}, {"trial": 3}]
    assert load_trials(tmp_path) == []
    assert (is_bisect_dir(bisect), is_bundle_dir(bundle), is_run_dir(bundle)) == (
        True, True, False,
    )  # fmt: skip


def test_a_directory_without_results_is_not_a_run(tmp_path):
    with pytest.raises(UsageError) as info:
        load_run(tmp_path)
    assert str(info.value) == f"{tmp_path}: not a run directory (no results.arrow)"
