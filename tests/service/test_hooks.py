"""The service's hooks: which verbs serve live metrics, and a report that
could not be written is a False, never a failed job."""

from __future__ import annotations

import logging

import pytest

from replayer.service.hooks import takes_metrics_port, write_report

pytestmark = pytest.mark.inprocess


def test_replay_and_bisect_serve_live_metrics_verify_does_not():
    assert takes_metrics_port("replay") and takes_metrics_port("bisect")
    assert not takes_metrics_port("verify")


def test_a_report_that_cannot_be_rendered_is_false_and_logged(tmp_path, caplog):
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    with caplog.at_level(logging.WARNING, logger="replayer.service"):
        assert write_report(empty, tmp_path / "report.html") is False
    assert not (tmp_path / "report.html").exists()
    [record] = caplog.records
    assert record.getMessage().startswith(f"report for {empty} failed: ")
