"""Sample traces are found in a checkout, where they live in ``traces/``,
and in an installed package, where the wheel put them (the installed case
end to end: tests/test_packaging.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import replayer
from replayer import samples
from replayer.samples import sample_trace
from replayer.trace.reader import Trace

pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(replayer.__file__).resolve().parent


def test_a_checkout_reads_the_samples_where_they_live():
    assert not (PACKAGE / samples.PACKAGED).exists()
    path = sample_trace("agents-8x10.arrow")
    assert path == ROOT / "traces" / "agents-8x10.arrow"
    assert len(Trace.open(path)) == 80


def test_the_packaged_copy_wins_and_a_missing_one_is_named(monkeypatch, tmp_path):
    # Stand in for an installed _traces/ with a folder of the package, and
    # for the checkout with a folder that holds the same name.
    monkeypatch.setattr(samples, "PACKAGED", "trace")
    monkeypatch.setattr(samples, "CHECKOUT", tmp_path)
    (tmp_path / "reader.py").write_text("")
    assert sample_trace("reader.py") == PACKAGE / "trace" / "reader.py"
    missing = sample_trace("nope.arrow")
    assert missing == PACKAGE / "trace" / "nope.arrow"
    assert not missing.exists()
