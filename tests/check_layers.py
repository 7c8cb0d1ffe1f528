"""Fail on any upward import between replayer's layers, or an import cycle.

``python tests/check_layers.py [PACKAGE_DIR]`` (``make test`` and ``make
lint`` run it). The layers, bottom first, are :data:`LAYERS`; a module may
import its own layer and the ones below it, never one above. Every import
counts: module level, inside a function (lazy imports are still
dependencies) and under ``TYPE_CHECKING`` (a type named from a higher layer
ties the lower one to it just the same). The root ``replayer/__init__.py``
is the facade: it names the public API from every layer, lazily, so it is a
layer of its own above all of them but the command line. Within a layer,
modules may import each other but not in a cycle, type-only imports
included (a cycle is one module in two files: naming a type from the module
that imports you ties the two just the same).

Exit 0 when clean, 1 with one line per violation.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "_version", "_arrow", "_async", "_files", "_clock", "_http", "wire", "samples"),
    ("_declare", "_runfile"),
    ("options",),
    ("trace",),
    ("emulator",),
    ("monitor",),
    ("replay",),
    ("record",),
    ("target",),
    ("session",),
    ("bundle",),
    ("bisect",),
    ("telemetry",),
    ("analysis",),
    ("service",),
    ("api",),
    ("testing",),
    ("__init__",),
    ("cli", "__main__"),
)
"""Bottom first: the trace format and the leaves, then the pipeline's stages
in the order they build on each other, then the layers over all of them."""

RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
FACADE = "replayer"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != FACADE:
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imports(
    tree: ast.AST, module: str, is_package: bool, known: set[str]
) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import of a replayer module. The
    facade counts only where it is the thing imported (``import replayer``,
    ``from replayer import Name``), not as the parent of a module named from
    it (``from replayer import api`` imports ``replayer.api``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            named = [f"{target}.{a.name}" for a in node.names]
            if target != FACADE or any(n not in known for n in named):
                yield node.lineno, target
            for n in named:  # ``from replayer.x import y`` may name module y
                yield node.lineno, n


def check(root: Path) -> list[str]:
    problems: list[str] = []
    known: set[str] = set()
    files = sorted(root.rglob("*.py"))
    for f in files:
        known.add(module_name(root, f))
    graph: dict[str, set[str]] = defaultdict(set)
    for f in files:
        mod = module_name(root, f)
        unit = unit_of(mod)
        tree = ast.parse(f.read_text(), str(f))
        for line, target in imports(tree, mod, f.name == "__init__.py", known):
            if target not in known or (target != FACADE and mod.startswith(target + ".")):
                continue  # a name, not a module; or the package being initialized anyway
            other = unit_of(target)
            if other is None or unit is None:
                continue
            if unit not in RANK or other not in RANK:
                missing = unit if unit not in RANK else other
                problems.append(f"{f}:{line}: replayer.{missing} is in no layer (add it to LAYERS)")
                continue
            if RANK[other] > RANK[unit]:
                problems.append(
                    f"{f}:{line}: upward import: {mod} ({unit}) imports {target} "
                    f"({other}, a higher layer)"
                )
            if other == unit and target != mod:
                graph[mod].add(target)
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append([*sorted(comp), sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "replayer"
    if not (root / "__init__.py").exists():
        print(f"check_layers: {root} is not a package directory", file=sys.stderr)
        return 2
    problems = check(root)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
