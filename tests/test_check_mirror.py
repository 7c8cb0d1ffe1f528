"""The mirror script: clean on the real tree, and on a copy with one planted
violation of each kind it fails with exactly that line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.check_mirror import README, check, main

pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parents[1]


def test_the_real_tree_is_clean(capsys):
    assert check(ROOT) == []
    assert main([str(ROOT)]) == 0
    assert capsys.readouterr().out == ""


def _read_by_the_script(folder: str, names: list[str]) -> list[str]:
    return [
        n for n in names if n == "__pycache__" or not (n.endswith((".py", ".md")) or "." not in n)
    ]


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of what the script reads (the package's and the tests' Python
    files, tests/README.md): clean, as the real tree is."""
    for top in ("replayer", "tests"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=_read_by_the_script)
    return tmp_path


def row_line(root: Path, path: str) -> int:
    lines = (root / README).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith(f"| `{path}` |"))


def test_a_module_without_a_test_or_a_row(tree, capsys):
    (tree / "replayer" / "trace" / "newmod.py").write_text("X = 1\n")
    assert main([str(tree)]) == 1
    assert capsys.readouterr().out == (
        "replayer/trace/newmod.py: no test file tests/trace/test_newmod.py and no row in "
        "tests/README.md (which test covers it, or no logic)\n"
    )
    (tree / "tests" / "trace" / "test_newmod.py").write_text("")
    assert check(tree) == []


def test_a_private_module_is_mirrored_without_its_underscore(tree):
    (tree / "replayer" / "_newmod.py").write_text("X = 1\n")
    assert check(tree) == [
        "replayer/_newmod.py: no test file tests/test_newmod.py and no row in "
        "tests/README.md (which test covers it, or no logic)"
    ]
    (tree / "tests" / "test_newmod.py").write_text("")
    assert check(tree) == []


def test_a_test_file_that_names_no_module(tree):
    (tree / "tests" / "trace" / "test_nothing.py").write_text("")
    assert check(tree) == [
        "tests/trace/test_nothing.py: names no module (no replayer/trace/nothing.py) and is "
        "not a cross-cutting test in tests/README.md"
    ]
    # in a folder listed as cross-cutting it needs no row of its own
    (tree / "tests" / "trace" / "test_nothing.py").rename(tree / "tests" / "realvllm" / "test_x.py")
    assert check(tree) == []


@pytest.mark.parametrize(
    ("where", "statement", "imported", "kind"),
    [
        ("cli/test_check.py", "from tests.cli.test_replay import run", "tests.cli.test_replay",
         "a test file"),
        ("emulator/test_app.py", "from .conftest import shared_emulator",
         "tests.emulator.conftest", "a conftest"),
        ("test_telemetry.py", "def f():\n    from .trace import test_writer",
         "tests.trace.test_writer", "a test file"),
        ("helpers/cli.py", "import tests.conftest", "tests.conftest", "a conftest"),
        ("../bench/x.py", "from tests.bisect.test_runner import bisect",
         "tests.bisect.test_runner", "a test file"),
    ],
)  # fmt: skip
def test_an_import_of_a_test_file_or_a_conftest(tree, where, statement, imported, kind):
    path = tree / "tests" / where
    path.parent.mkdir(exist_ok=True)
    before = path.read_text() if path.exists() else ""
    path.write_text(before + "\n" + statement + "\n")
    line = before.count("\n") + 2 + statement.count("\n")
    shown = path.resolve().relative_to(tree.resolve())
    assert check(tree) == [
        f"{shown}:{line}: imports {imported} ({kind}); shared helpers go to tests/helpers/"
    ]


def test_stale_rows(tree):
    row = row_line(tree, "replayer/trace/subset.py")
    (tree / "tests" / "trace" / "test_subset.py").write_text("")
    assert check(tree) == [
        f"tests/README.md:{row}: replayer/trace/subset.py has its mirror test; drop the row"
    ]
    (tree / "replayer" / "trace" / "subset.py").unlink()
    (tree / "tests" / "trace" / "test_subset.py").unlink()
    assert check(tree) == [
        f"tests/README.md:{row}: replayer/trace/subset.py is not a module of the package"
    ]


def test_a_row_must_name_tests_that_exist_or_say_no_logic(tree):
    readme = tree / README
    text = readme.read_text()
    row = row_line(tree, "replayer/trace/convert.py")
    readme.write_text(text.replace("`tests/trace/test_compat.py` | `trace convert`",
                                   "`tests/trace/test_gone.py` | `trace convert`"))  # fmt: skip
    assert check(tree) == [
        f"tests/README.md:{row}: tests/trace/test_gone.py (covering replayer/trace/convert.py) "
        "does not exist"
    ]
    readme.write_text(text.replace("`tests/trace/test_compat.py` | `trace convert`",
                                   "somewhere | `trace convert`"))  # fmt: skip
    assert check(tree) == [
        f"tests/README.md:{row}: the row of replayer/trace/convert.py names no test and says "
        "no 'no logic'"
    ]
    readme.write_text(
        text.replace("| `tests/wire/test_malformed.py` |", "| `tests/wire/gone.py` |")
    )
    line = row_line(tree, "tests/wire/gone.py")
    assert check(tree) == [
        f"tests/README.md:{line}: tests/wire/gone.py does not exist",
        "tests/wire/test_malformed.py: names no module (no replayer/wire/malformed.py) and is "
        "not a cross-cutting test in tests/README.md",
    ]


def test_outside_a_checkout_it_says_so(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"check_mirror: {tmp_path} holds no replayer/ and tests/\n"
