"""Path confinement: every path a request names stays inside the data directory."""

from __future__ import annotations

import os

import pytest

from replayer.service.paths import PathRejected, confine, safe_name, suspicious_raw_path

pytestmark = pytest.mark.inprocess


def test_confine(tmp_path):
    root = (tmp_path / "root").resolve()
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_text("x")
    (tmp_path / "out.txt").write_text("x")
    os.symlink(tmp_path / "out.txt", root / "a" / "out-link")
    os.symlink(root / "a" / "f", root / "in-link")
    assert confine(root, "a/f") == root / "a" / "f"
    assert confine(root, "in-link") == root / "a" / "f"
    bad = ["", "/etc", "../x", "a/../a/f", "a/./f", "a//f", "%2e%2e/x", "a\\f", "a/\x00",
           "C:x", "a/out-link", "missing"]  # fmt: skip
    for text in bad:
        with pytest.raises(PathRejected):
            confine(root, text)
    assert safe_name("t.arrow") == "t.arrow"
    for name in (".x", "a/b", "..", "a..b", "", "x" * 200, "a b"):
        with pytest.raises(PathRejected):
            safe_name(name)
    assert suspicious_raw_path("/api/jobs/x/files/a.json?x=..") is None
    for raw in ("/a/../b", "/a/%2E%2e/b", "/a/..%2Fb", "/a/%5c", "/a/%00", "/a/./b", "/a\\b"):
        assert suspicious_raw_path(raw) is not None, raw
