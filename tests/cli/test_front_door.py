"""The command line, the demos and the service worker only parse, call
``replayer.api`` and print: no session, runner or replay is built under
``replayer/cli/`` or ``replayer/service/``, every command's handler calls
one api verb, and ``--help`` loads none of the library's heavy parts."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from replayer.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2] / "replayer"
BUILDERS = frozenset(
    {
        "Session",
        "Slot",
        "Bisect",
        "Search",
        "SessionRunner",
        "FunctionRunner",
        "Replay",
        "make_target",
        "replay_to_dir",
        "run_bisect",
        "run_plan",
        "select",
        "selected",
    }
)
"""What only replayer.api builds: sessions, runners, replays, targets."""


def _calls(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            out.append((node.lineno, name))
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                out.append((node.lineno, f"{f.value.id}.{f.attr}"))
    return out


@pytest.mark.inprocess
@pytest.mark.parametrize(
    "path", sorted([*ROOT.glob("cli/*.py"), *ROOT.glob("service/*.py")]), ids=lambda p: p.name
)
def test_front_ends_build_no_session_runner_or_replay(path):
    tree = ast.parse(path.read_text())
    bad = [f"{path.name}:{line}: {name}" for line, name in _calls(tree) if name in BUILDERS]
    assert bad == []


def _handlers() -> list[tuple[str, ast.FunctionDef]]:
    out = []
    for path in sorted(ROOT.glob("cli/*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("cmd_"):
                out.append((f"{path.name}:{node.name}", node))
    return out


@pytest.mark.inprocess
@pytest.mark.parametrize("where,fn", _handlers(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_handler_calls_one_api_verb(where, fn):
    verbs = {name for _, name in _calls(fn) if name.startswith("api.")}
    if fn.name == "cmd_demo":  # the story: several verbs, each printed
        assert {"api.inspect", "api.replay_sync", "api.bisect_sync", "api.report"} <= verbs
        return
    assert len(verbs) == 1, (where, sorted(verbs))


@pytest.mark.inprocess
def test_the_service_worker_runs_jobs_through_the_api():
    tree = ast.parse((ROOT / "cli" / "worker.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_spec")
    assert {n for _, n in _calls(fn) if n.startswith("api.")} == {
        "api.replay_sync",
        "api.bisect_sync",
        "api.verify_bundle_sync",
    }


HEAVY = ("pyarrow", "aiohttp", "numpy", "replayer.bisect")


@pytest.mark.parametrize("verb", [None, *COMMANDS])
def test_help_loads_no_heavy_module(verb):
    argv = ["--help"] if verb is None else [verb, "--help"]
    code = (
        "import sys\nfrom replayer.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] if not m.startswith('replayer') else "
        "'.'.join(m.split('.')[:2]) for m in sys.modules} & set(" + repr(HEAVY) + ")))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", (verb, res.stdout[-300:])


def test_every_public_name_resolves_and_import_stays_cheap():
    import replayer

    assert set(replayer.__all__) == {"__version__", *replayer._EXPORTS}
    for name in replayer.__all__:
        assert getattr(replayer, name) is not None, name
    heavy = subprocess.run(
        [sys.executable, "-c", "import replayer, sys; print(sorted(m for m in "
         "('pyarrow', 'aiohttp', 'httpx') if m in sys.modules))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert heavy.stdout.strip() == "[]"
