"""Output files that never clobber or half-write, the one rule for files
users hand over (JSON or TOML), and append-only journals cut at a torn line."""

from __future__ import annotations

import os

import pytest

from replayer._files import atomic_output, parse_json_or_toml, read_jsonl
from replayer.errors import UsageError

pytestmark = pytest.mark.inprocess


def test_atomic_output_renames_into_place_only_when_the_block_succeeds(tmp_path):
    out = tmp_path / "deep" / "r.json"
    with atomic_output(out) as tmp:
        assert tmp == tmp_path / "deep" / f".r.json.tmp{os.getpid()}"
        tmp.write_text("one")
        assert not out.exists()
    assert out.read_text() == "one"
    with pytest.raises(RuntimeError), atomic_output(out, force=True) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert out.read_text() == "one"
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.json"]


def test_atomic_output_refuses_an_existing_file_unless_forced(tmp_path):
    out = tmp_path / "t.arrow"
    out.write_text("old")
    with pytest.raises(UsageError) as info, atomic_output(out):
        pass
    assert str(info.value) == f"{out} already exists (use --force to overwrite)"
    with atomic_output(out, force=True) as tmp:
        tmp.write_text("new")
    assert out.read_text() == "new"


@pytest.mark.parametrize(
    ("name", "text", "want"),
    [
        ("r.toml", 'a = 1\nb = "x"\n', {"a": 1, "b": "x"}),
        ("r.json", '{"a": [1, 2]}', {"a": [1, 2]}),
        ("rules", '{"a": 1}', {"a": 1}),
        ("rules.txt", "a = 2\n", {"a": 2}),
    ],
)
def test_json_or_toml_by_suffix_then_by_content(tmp_path, name, text, want):
    assert parse_json_or_toml(tmp_path / name, text) == want


@pytest.mark.parametrize(
    ("name", "text", "kind"),
    [("r.json", "a = 1", "JSON"), ("r.toml", '{"a": 1}', "TOML"), ("r", "{", "JSON or TOML")],
)
def test_json_or_toml_names_what_it_expected(tmp_path, name, text, kind):
    with pytest.raises(ValueError) as info:
        parse_json_or_toml(tmp_path / name, text)
    assert str(info.value).startswith(f"not {kind} (")


def test_read_jsonl_cuts_a_torn_last_line_so_the_next_append_starts_its_own(tmp_path):
    path = tmp_path / "j.jsonl"
    assert read_jsonl(path) == []
    path.write_bytes(b'{"a": 1}\n\n{"b": 2}\n{"c": ')
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}]
    assert path.read_bytes() == b'{"a": 1}\n\n{"b": 2}\n'
    with path.open("ab") as f:
        f.write(b'{"d": 4}\n')
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}, {"d": 4}]
