"""Run files carry their format version: a newer one is a clear error, an
older one is migrated on read, one step at a time."""

from __future__ import annotations

import orjson
import pytest

from replayer._runfile import JsonFile, RunFileError
from replayer.bisect.files import VARIANTS, journal_events, journal_header
from replayer.replay.files import RUN, SUMMARY, read_run

pytestmark = pytest.mark.inprocess


def test_written_files_are_stamped_and_read_back(tmp_path):
    SUMMARY.write(tmp_path, {"exit_code": 0, "targets": {}})
    raw = orjson.loads((tmp_path / "summary.json").read_bytes())
    assert list(raw)[0] == "format_version" and raw["format_version"] == SUMMARY.version
    assert SUMMARY.load(tmp_path) == raw
    assert not list(tmp_path.glob("*.tmp"))  # through a temporary file and a rename


def test_an_older_file_is_migrated_one_version_at_a_time(tmp_path):
    f = JsonFile(
        "x.json",
        3,
        "a test directory",
        migrations={0: lambda d: {**d, "a": 1}, 2: lambda d: {**d, "b": d["a"] + 1}},
    )
    (tmp_path / "x.json").write_bytes(orjson.dumps({"kept": True}))  # before versions: 0
    assert f.load(tmp_path) == {"kept": True, "a": 1, "b": 2, "format_version": 3}


def test_a_newer_or_broken_file_is_one_clear_error(tmp_path):
    (tmp_path / "run.json").write_bytes(orjson.dumps({"format_version": 7}))
    with pytest.raises(RunFileError, match=r"written by a newer replayer \(run.json version 7; "):
        RUN.load(tmp_path)
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(RunFileError, match=r"run.json: not JSON"):
        read_run(tmp_path)
    with pytest.raises(RunFileError, match=r"not a run directory \(no run.json\)"):
        read_run(tmp_path / "nowhere")


def test_a_run_from_before_versions_reads_as_today(tmp_path):
    (tmp_path / "run.json").write_bytes(orjson.dumps({"server": {"launch": "vllm serve m"}}))
    failed = {"class": "process_exit", "request_id": "r1"}
    (tmp_path / "summary.json").write_bytes(
        orjson.dumps({"targets": {"t": {"failed": True, "failure": failed}}})
    )
    run = read_run(tmp_path)
    assert (run.launch, run.failure, run.info["format_version"]) == ("vllm serve m", failed, 1)


def test_the_journal_names_its_version_and_a_newer_one_is_refused(tmp_path):
    j = tmp_path / "journal.jsonl"
    j.write_bytes(orjson.dumps(journal_header()) + b"\n" + b'{"event": "mark"}\n{"torn')
    assert [e["event"] for _, e in journal_events(j)] == ["format", "mark"]
    j.write_bytes(orjson.dumps({"event": "format", "format_version": 2}) + b"\n")
    with pytest.raises(RunFileError, match="journal version 2"):
        list(journal_events(j))


def test_variants_reports_are_versioned(tmp_path):
    VARIANTS.write(tmp_path, {"runs": 5})
    assert VARIANTS.load(tmp_path) == {"format_version": 1, "runs": 5}
