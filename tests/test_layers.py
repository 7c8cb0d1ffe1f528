"""The layering script: clean on the real tree, and it catches what it must."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.check_layers import LAYERS, check

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "check_layers.py"


def test_main_is_clean():
    assert check(ROOT / "replayer") == []
    res = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
    assert (res.returncode, res.stdout) == (0, "")


@pytest.mark.inprocess
def test_every_subpackage_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in (ROOT / "replayer").iterdir()}
    units = {u for u in units if not u.startswith(("__pycache__", "py")) and u != "__init__"}
    placed = {u for layer in LAYERS for u in layer}
    assert units - placed == set()


def _copy(tmp_path: Path) -> Path:
    pkg = tmp_path / "replayer"
    shutil.copytree(ROOT / "replayer", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def _new(pkg: Path, before: list[str]) -> list[str]:
    """What the script says now and did not say before the edit."""
    return [p for p in check(pkg) if p not in before]


def _append(path: Path, text: str) -> int:
    """Append ``text``; returns the line number of its first line."""
    before = path.read_text()
    path.write_text(before + text)
    return before.count("\n") + 1


def test_an_upward_import_fails_the_script(tmp_path):
    pkg = _copy(tmp_path)
    reader = pkg / "trace" / "reader.py"
    before = check(pkg)
    line = _append(reader, "from replayer.cli import main\n")
    assert _new(pkg, before) == [
        f"{reader}:{line}: upward import: replayer.trace.reader (trace) imports replayer.cli "
        "(cli, a higher layer)"
    ]
    res = subprocess.run([sys.executable, SCRIPT, pkg], capture_output=True, text=True)
    assert res.returncode == 1 and "upward import" in res.stdout


@pytest.mark.inprocess
def test_lazy_and_type_only_imports_count(tmp_path):
    pkg = _copy(tmp_path)
    health = pkg / "monitor" / "health.py"
    before = check(pkg)
    line = _append(
        health,
        "\n\ndef _late() -> None:\n    from replayer.bisect import pipeline  # noqa\n"
        "\n\nif TYPE_CHECKING:\n    from replayer.replay.engine import Replay  # noqa\n",
    )
    assert _new(pkg, before) == [
        f"{health}:{line + 3}: upward import: replayer.monitor.health (monitor) imports "
        "replayer.bisect (bisect, a higher layer)",
        f"{health}:{line + 3}: upward import: replayer.monitor.health (monitor) imports "
        "replayer.bisect.pipeline (bisect, a higher layer)",
        f"{health}:{line + 7}: upward import: replayer.monitor.health (monitor) imports "
        "replayer.replay.engine (replay, a higher layer)",
    ]


@pytest.mark.inprocess
def test_a_cycle_inside_a_layer_and_an_unplaced_package_fail(tmp_path):
    pkg = _copy(tmp_path)
    _append(pkg / "trace" / "schema.py", "\nfrom replayer.trace import reader  # noqa\n")
    (pkg / "newstage").mkdir()
    (pkg / "newstage" / "__init__.py").write_text("from replayer.errors import UsageError\n")
    got = check(pkg)
    init = pkg / "newstage" / "__init__.py"
    assert f"{init}:1: replayer.newstage is in no layer (add it to LAYERS)" in got
    assert any(p.startswith("import cycle: ") and "replayer.trace.schema" in p for p in got), got


@pytest.mark.inprocess
def test_a_type_only_cycle_fails(tmp_path):
    """A type named back from the module that imports you is a cycle too."""
    pkg = _copy(tmp_path)
    before = check(pkg)
    _append(
        pkg / "monitor" / "watch.py",
        "\n\nif TYPE_CHECKING:\n    from replayer.monitor.signature import Signature  # noqa\n",
    )
    _append(
        pkg / "monitor" / "signature.py",
        "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from replayer.monitor.watch import WatchConfig  # noqa\n",
    )
    new = _new(pkg, before)
    assert len(new) == 1 and new[0].startswith("import cycle: "), new
    assert "replayer.monitor.signature" in new[0] and "replayer.monitor.watch" in new[0]


@pytest.mark.inprocess
def test_the_facade_is_a_layer_too(tmp_path):
    """Only the command line sits above ``replayer/__init__.py``: a stage
    that imports it (``import replayer``) reaches up to every layer."""
    pkg = _copy(tmp_path)
    before = check(pkg)
    health = pkg / "monitor" / "health.py"
    line = _append(health, "\nimport replayer  # noqa\n")
    assert _new(pkg, before) == [
        f"{health}:{line + 1}: upward import: replayer.monitor.health (monitor) imports "
        "replayer (__init__, a higher layer)"
    ]
