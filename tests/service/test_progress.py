"""A job's progress and result read from what its command writes: the
journal incrementally (a line cut mid-write waits for its end, a replaced
journal starts over, a newer one is named), replay and verify progress from
the log's tail, the command's one-line error."""

from __future__ import annotations

import orjson
import pytest

from replayer.bisect.files import journal_header
from replayer.service.progress import ProgressReader, last_error_line, result_of, tail

pytestmark = pytest.mark.inprocess


def trial(n: int, outcome: str, stage: str = "prefix", size: int = 10) -> bytes:
    rec = {"trial": n, "stage": stage, "size": size, "outcome": outcome, "failure_class": None}
    return orjson.dumps({"event": "trial", "record": rec}) + b"\n"


def test_the_journal_is_read_incrementally_and_a_torn_line_waits(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    journal = out / "journal.jsonl"
    reader = ProgressReader()
    assert reader.progress("bisect", out, tmp_path / "job.log") == {
        "trials": 0, "outcomes": {}, "verdicts": 0, "last_trial": None,
        "best_requests": None, "bundle_status": None,
    }  # fmt: skip
    first = orjson.dumps(journal_header()) + b"\n" + trial(1, "MATCH") + trial(2, "PASS")
    second = trial(3, "PASS", "sessions", 4)
    journal.write_bytes(first + second[:9])  # the third line cut mid-write
    p = reader.progress("bisect", out, tmp_path / "job.log")
    assert (p["trials"], p["outcomes"], p["last_trial"]["trial"]) == (2, {"MATCH": 1, "PASS": 1}, 2)
    with journal.open("ab") as f:
        f.write(second[9:] + b'{"event": "verdict"}\n')
    p = reader.progress("bisect", out, tmp_path / "job.log")
    assert (p["trials"], p["outcomes"], p["verdicts"]) == (3, {"MATCH": 1, "PASS": 2}, 1)
    assert p["last_trial"] == {
        "trial": 3, "stage": "sessions", "size": 4, "outcome": "PASS", "failure_class": None,
    }  # fmt: skip
    journal.unlink()  # a bisect that started over
    journal.write_bytes(trial(1, "INFRA"))
    p = reader.progress("bisect", out, tmp_path / "job.log")
    assert (p["trials"], p["outcomes"]) == (1, {"INFRA": 1})


def test_a_journal_from_a_newer_replayer_is_named_not_read(tmp_path):
    journal = tmp_path / "journal.jsonl"
    journal.write_bytes(orjson.dumps({"event": "format", "format_version": 99}) + b"\n")
    j = ProgressReader().journal(journal)
    assert j.error is not None and "journal version 99" in j.error


def test_replay_progress_is_the_last_line_of_each_target(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(
        "replay: mi355: sent 10/1,200  in flight 3  errors 0  lag 0.1s\n"
        "== serve 2026-01-01T00:00:00Z: started\n"
        "replay: b300: sent 1,100/1,200  in flight 0  errors 2\n"
        "replay: FAILED mi355: sent 61/1,200  in flight 4  errors 5\n"
    )
    assert ProgressReader().progress("replay", tmp_path / "out", log) == {
        "targets": {
            "mi355": {"sent": 61, "total": 1200, "in_flight": 4, "errors": 5, "failed": True},
            "b300": {"sent": 1100, "total": 1200, "in_flight": 0, "errors": 2, "failed": False},
        }
    }


def test_verify_progress_counts_its_runs(tmp_path):
    log = tmp_path / "job.log"
    reader = ProgressReader()
    assert reader.progress("verify", tmp_path, log) == {
        "runs_done": 0, "runs": None, "outcomes": [],
    }  # fmt: skip
    log.write_text("run 1/3: MATCH (12.0 s)\nrun 2/3: PASS (9.1 s)\n")
    assert reader.progress("verify", tmp_path, log) == {
        "runs_done": 2, "runs": 3, "outcomes": ["MATCH", "PASS"],
    }  # fmt: skip
    log.write_text(log.read_text() + "bundle reproduced 1/2\n")
    assert result_of("verify", tmp_path, log) == {"text": "bundle reproduced 1/2"}


def test_the_error_line_and_the_tail(tmp_path):
    log = tmp_path / "job.log"
    assert (last_error_line(log), tail(log)) == (None, "")
    log.write_text(
        "replay: mi355: sent 1/2  in flight 0  errors 0\n"
        "replayer bisect: error: t.arrow: not a trace\n"
        "== serve 2026-01-01T00:00:00Z: worker exited 2\n"
    )
    assert last_error_line(log) == "replayer bisect: error: t.arrow: not a trace"
    assert tail(log, 12) == log.read_text()[-12:]


def test_a_finished_job_without_its_files_has_no_result(tmp_path):
    assert result_of("bisect", tmp_path, tmp_path / "job.log") is None
    assert result_of("replay", tmp_path, tmp_path / "job.log") is None
