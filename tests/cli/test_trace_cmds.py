"""The trace commands as a user runs them: real subprocesses, exit codes, and
one clear stderr line for every kind of bad input."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from replayer.trace import Trace, TraceMeta, TraceWriter
from replayer.trace.synth import SynthOptions, sessions
from tests.helpers.cli import assert_one_line_error, run
from tests.helpers.disk import fill, small_disk


@pytest.fixture(scope="module")
def synth_trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("cli") / "t.arrow"
    res = run("synth", "--sessions", 3, "--turns", 4, "--context", 9000, "--seed", 5, "-o", p)
    assert res.returncode == 0, res.stderr
    assert "synthesized 12 requests" in res.stderr
    return p


def test_inspect_text_and_json(synth_trace):
    res = run("inspect", synth_trace)
    assert res.returncode == 0
    assert "requests     12" in res.stdout and "sessions     3" in res.stdout
    res = run("inspect", synth_trace, "--json")
    info = orjson.loads(res.stdout)
    assert (info["requests"], info["sessions"], info["input_tokens"]["max"]) == (12, 3, 9000)


def test_export_then_compare_bodies(synth_trace, tmp_path):
    out = tmp_path / "t.jsonl"
    res = run("export", synth_trace, "-o", out)
    assert res.returncode == 0, res.stderr
    t = Trace.open(synth_trace)
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [x["request_id"] for x in lines] == [t.column("request_id")[r] for r in t.order]
    assert [x["body"] for x in lines] == [t.body(r) for r in t.order]


def test_outputs_are_never_clobbered(synth_trace, tmp_path):
    out = tmp_path / "t.jsonl"
    out.write_text("precious")
    assert_one_line_error(run("export", synth_trace, "-o", out), "already exists", "--force")
    assert out.read_text() == "precious"
    assert run("export", synth_trace, "-o", out, "--force").returncode == 0
    assert out.read_text() != "precious"


def test_failed_import_leaves_no_output(tmp_path, shared_data):
    out = tmp_path / "o.arrow"
    src = shared_data / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    assert_one_line_error(run("import", "mooncake", src, "-o", out), "not a Mooncake trace")
    assert list(tmp_path.iterdir()) == []


def _arrow_not_trace(path):
    t = pa.table({"a": [1]})
    with pa.OSFile(str(path), "wb") as f, ipc.new_file(f, t.schema) as w:
        w.write_table(t)


@pytest.mark.parametrize(
    "make,fragment",
    [
        (None, "no such file"),
        (lambda p: p.write_bytes(b""), "empty file"),
        (lambda p: p.write_text("hello, not arrow\n"), "not an Arrow IPC file or stream"),
        (_arrow_not_trace, "not a replayer trace"),
    ],
    ids=["missing", "empty", "not-arrow", "arrow-not-trace"],
)
def test_inspect_bad_input(tmp_path, make, fragment):
    p = tmp_path / "bad.arrow"
    if make:
        make(p)
    assert_one_line_error(run("inspect", p), fragment)


def test_truncated_header_is_bad_input(synth_trace, tmp_path):
    p = tmp_path / "cut.arrow"
    p.write_bytes(synth_trace.read_bytes()[:100])
    assert_one_line_error(run("inspect", p), "not an Arrow IPC file or stream")


def test_torn_tail_is_readable_with_a_warning(tmp_path):
    p = tmp_path / "t.arrow"
    with TraceWriter(p, TraceMeta(source="test"), flush_rows=10) as w:
        for rec in sessions(SynthOptions(sessions=10, turns=12, context=12_000)):
            w.add(rec)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) * 2 // 3])
    res = run("inspect", p, "--json")
    assert res.returncode == 0
    assert "incomplete tail dropped" in res.stderr
    info = orjson.loads(res.stdout)
    assert info["torn_tail"] is True and 0 < info["requests"] < 120
    assert info["requests"] % 10 == 0


def test_usage_errors_are_one_line(tmp_path):
    assert_one_line_error(run("inspect"), "required")
    assert_one_line_error(run("import", "nosuchformat", "x", "-o", "y"), "invalid choice")
    assert_one_line_error(run("synth", "--sessions", 0, "-o", tmp_path / "x"), "at least 1")
    assert_one_line_error(
        run("import", "mooncake", tmp_path / "nope.jsonl", "-o", tmp_path / "o.arrow"),
        "no such file",
    )


@pytest.mark.inprocess
def test_inspect_takes_replays_selection(capsys):
    from replayer.cli import main

    sample = Path(__file__).resolve().parents[2] / "traces" / "agents-8x10.arrow"
    assert main(["inspect", str(sample), "--sessions", "0..1", "--json"]) == 0
    info = orjson.loads(capsys.readouterr().out)
    assert (info["requests"], info["sessions"], info["selection_of"]) == (20, 2, 80)
    assert info["turns_per_session"]["max"] == 10
    assert main(["inspect", str(sample), "--limit", "-1"]) == 2
    assert capsys.readouterr().err == "replayer inspect: error: --limit must not be negative\n"


# -- a full disk --------------------------------------------------------------------------


def _writers(src: Path, jsonl: Path, out: Path) -> dict[str, list[object]]:
    return {
        "import": ["import", "openai-jsonl", jsonl, "-o", out],
        "synth": ["synth", "--sessions", 8, "--turns", 6, "--context", 20_000, "-o", out],
        "trace merge": ["trace", "merge", src, "-o", out],
        "trace convert": ["trace", "convert", src, "-o", out],
        "export": ["export", src, "-o", out],
    }


@pytest.mark.parametrize("command", ["import", "synth", "trace merge", "trace convert", "export"])
def test_a_full_disk_is_one_line_and_leaves_no_output(synth_trace, tmp_path, command):
    """The output's disk fills while it is written: exit 2, one line naming
    the output, no traceback, and nothing left under the output's name or a
    temporary one; an older output given --force stays as it was."""
    jsonl = tmp_path / "src.jsonl"
    assert run("export", synth_trace, "-o", jsonl).returncode == 0
    with small_disk(tmp_path, "256k") as disk:
        out = disk / "out.arrow"
        fill(disk, leave=16 * 1024)
        res = run(*_writers(synth_trace, jsonl, out)[command])
        assert_one_line_error(res, f"{out}: no space left on device (free space and rerun)")
        assert sorted(p.name for p in disk.iterdir()) == ["ballast"]
        old = b"an older output, kept whole"
        out.write_bytes(old)
        res = run(*_writers(synth_trace, jsonl, out)[command], "--force")
        assert_one_line_error(res, f"{out}: no space left on device")
        assert sorted(p.name for p in disk.iterdir()) == ["ballast", "out.arrow"]
        assert out.read_bytes() == old
