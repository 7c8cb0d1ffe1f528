"""The wheel is what a user installs: built from this checkout, installed
into a fresh venv with its dependencies from the package index, and its
console script runs ``replayer demo`` in an empty folder, with no checkout
around it to fall back on.

The install needs the package index (the one network use in the suite that
is not 127.0.0.1): where it cannot be reached the test fails with pip's
reason in one line, it does not skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ("agents-8x10.arrow", "blocks-16x12.arrow")
VENDOR = ("replayer/analysis/vendor/plotly.min.js", "replayer/analysis/vendor/LICENSE.plotly.txt")
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
"""No PYTHONPATH: the installed package must not see this checkout."""


def _run(cmd: list[str | Path], timeout: float, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=ENV, **kw
    )


def _pip_error(text: str) -> str:
    """pip's first ERROR line (the cause; later ones repeat it), else its last line."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return errors[0] if errors else (lines or ["(no output)"])[-1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    res = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, ROOT], 300)
    if res.returncode != 0:
        pytest.fail(f"building the wheel failed: {_pip_error(res.stderr)}", pytrace=False)
    (path,) = out.glob("replayer-*.whl")
    return path


@pytest.mark.slow
def test_wheel_carries_the_samples_and_plotly_js_not_plotly(wheel):
    carried = {f"replayer/_traces/{n}": ROOT / "traces" / n for n in SAMPLES}
    carried |= {name: ROOT / name for name in VENDOR}
    with zipfile.ZipFile(wheel) as z:
        for name, source in carried.items():
            assert z.read(name) == source.read_bytes(), name
        (metadata,) = (n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(metadata).decode().splitlines()
    requires = [ln.removeprefix("Requires-Dist: ") for ln in lines if ln.startswith("Requires-")]
    assert "pyarrow>=16.0" in requires
    assert [r for r in requires if r.startswith("plotly")] == []


@pytest.mark.slow
def test_installed_wheel_runs_the_demo_in_an_empty_folder(wheel, tmp_path):
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", venv], 120).returncode == 0
    py = venv / "bin" / "python"
    res = _run([py, "-m", "pip", "install", "-q", wheel], 600)
    if res.returncode != 0:
        pytest.fail(
            f"pip install of the wheel failed (package index reachable?): {_pip_error(res.stderr)}",
            pytrace=False,
        )
    probe = (
        "import importlib.util; from replayer.samples import sample_trace; "
        "print(importlib.util.find_spec('plotly') is None); "
        "print(sample_trace('agents-8x10.arrow'))"
    )
    res = _run([py, "-c", probe], 60, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    no_plotly, sample = res.stdout.split("\n")[:2]
    assert no_plotly == "True"
    assert Path(sample).is_relative_to(venv) and Path(sample).parent.name == "_traces"

    empty = tmp_path / "empty"
    empty.mkdir()
    res = _run([venv / "bin" / "replayer", "demo"], 480, cwd=empty)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert (empty / "runs" / "demo" / "bisect" / "bundle" / "manifest.json").is_file()
