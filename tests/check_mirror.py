"""Fail when the tests stop mirroring the package, or a test file imports another.

``python tests/check_mirror.py [ROOT]`` (``make lint`` and ``make test`` run
it; ROOT is the checkout, by default the one this file is in). Three rules,
after mitmproxy's ``test/filename_matching.py``:

* every module ``replayer/<pkg>/X.py`` has a test file of its name at the
  mirror path, ``tests/<pkg>/test_X.py`` (a private ``_X.py`` is mirrored
  by ``test_X.py``), or a row in ``tests/README.md``'s module table saying
  which test covers it (and why it is not 1:1) or that it has no logic;
* every ``tests/**/test_*.py`` names a module that way, or is listed (itself
  or a folder above it) in the README's table of cross-cutting tests;
* no file under ``tests/`` (or ``bench/``) imports a test file
  (``test_*.py``) or a ``conftest.py``: what tests share lives in
  ``tests/helpers/``.

A README row that names a file that is not there is a problem too, so the
table cannot go stale. Exit 0 when clean, 1 with one line per problem.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

PACKAGE = "replayer"
README = "tests/README.md"
NO_LOGIC = "no logic"
ROW = re.compile(r"^\|\s*`(?P<path>[^`]+)`\s*\|(?P<rest>.*)\|\s*$")
PATH = re.compile(r"`((?:tests|replayer)/[^`]*)`")


def mirrors(module: Path) -> list[Path]:
    """The test files that mirror ``replayer/<pkg>/X.py``, relative to the root."""
    rel = module.relative_to(PACKAGE)
    name = rel.stem
    names = [f"test_{name.lstrip('_')}.py"] + ([f"test_{name}.py"] if name.startswith("_") else [])
    return [Path("tests", *rel.parent.parts, n) for n in names]


def named_module(test: Path) -> list[Path]:
    """The modules ``tests/<pkg>/test_X.py`` may name, relative to the root."""
    rel = test.relative_to("tests")
    stem = rel.stem.removeprefix("test_")
    names = [f"{stem}.py"] + ([] if stem.startswith("_") else [f"_{stem}.py"])
    return [Path(PACKAGE, *rel.parent.parts, n) for n in names]


def read_readme(root: Path) -> tuple[dict[str, tuple[int, str]], dict[str, int]]:
    """(module rows: path -> (line, the rest of the row); cross-cutting rows:
    path -> line) from the README's tables."""
    modules: dict[str, tuple[int, str]] = {}
    tests: dict[str, int] = {}
    readme = root / README
    if not readme.exists():
        return modules, tests
    for n, line in enumerate(readme.read_text().splitlines(), 1):
        m = ROW.match(line)
        if m is None:
            continue
        path = m["path"]
        if path.startswith(PACKAGE + "/"):
            modules[path] = (n, m["rest"])
        elif path.startswith("tests/"):
            tests[path] = n
    return modules, tests


def module_of(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=4096)
def imported(text: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) for every import in the source ``text`` of ``module``,
    relative ones resolved; a name imported from a package counts as the
    module it may be. (Cached: a test of this script checks many trees that
    differ in one file.)"""
    tree = ast.parse(text)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return out


def is_test_module(root: Path, module: str) -> bool:
    """Whether ``module`` is a test file or a conftest.py under tests/."""
    parts = module.split(".")
    if parts[0] != "tests" or not (parts[-1].startswith("test_") or parts[-1] == "conftest"):
        return False
    return root.joinpath(*parts).with_suffix(".py").is_file()


def check(root: Path) -> list[str]:
    problems: list[str] = []
    modules, crosscutting = read_readme(root)
    package = sorted(p.relative_to(root) for p in (root / PACKAGE).rglob("*.py"))
    tests = sorted(p.relative_to(root) for p in (root / "tests").rglob("*.py"))
    for mod in package:
        has_mirror = any((root / t).is_file() for t in mirrors(mod))
        row = modules.get(mod.as_posix())
        if row is None and not has_mirror:
            problems.append(
                f"{mod}: no test file {mirrors(mod)[0]} and no row in {README} "
                "(which test covers it, or no logic)"
            )
        elif row is not None and has_mirror:
            problems.append(f"{README}:{row[0]}: {mod} has its mirror test; drop the row")
    for path, (line, rest) in sorted(modules.items()):
        if not (root / path).is_file():
            problems.append(f"{README}:{line}: {path} is not a module of the package")
        named = PATH.findall(rest)
        if not named and NO_LOGIC not in rest:
            problems.append(
                f"{README}:{line}: the row of {path} names no test and says no '{NO_LOGIC}'"
            )
        for t in named:
            if not (root / t).exists():
                problems.append(f"{README}:{line}: {t} (covering {path}) does not exist")
    for path, line in sorted(crosscutting.items()):
        if not (root / path).exists():
            problems.append(f"{README}:{line}: {path} does not exist")
    for test in tests:
        if not test.name.startswith("test_"):
            continue
        listed = any(
            test.as_posix() == p or (p.endswith("/") and test.as_posix().startswith(p))
            for p in crosscutting
        )
        if not listed and not any((root / m).is_file() for m in named_module(test)):
            problems.append(
                f"{test}: names no module (no {named_module(test)[0]}) and is not "
                f"a cross-cutting test in {README}"
            )
    bench = sorted(p.relative_to(root) for p in (root / "bench").rglob("*.py"))
    for test in tests + bench:
        mod = module_of(root, root / test)
        seen: set[tuple[int, str]] = set()
        for line, target in imported((root / test).read_text(), mod, test.name == "__init__.py"):
            if target != mod and is_test_module(root, target) and (line, target) not in seen:
                seen.add((line, target))
                kind = "a conftest" if target.endswith("conftest") else "a test file"
                problems.append(
                    f"{test}:{line}: imports {target} ({kind}); shared helpers go to tests/helpers/"
                )
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    if not (root / PACKAGE / "__init__.py").is_file() or not (root / "tests").is_dir():
        print(f"check_mirror: {root} holds no {PACKAGE}/ and tests/", file=sys.stderr)
        return 2
    problems = check(root)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
