"""The registry: which accumulator reads which API and path; and the wire layer
stays a leaf (nothing of replayer's pipeline imported)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import replayer.wire
from replayer.wire import (
    ACCUMULATORS,
    Api,
    ChatAccumulator,
    CompletionsAccumulator,
    MessagesAccumulator,
    Reply,
    ResponsesAccumulator,
    accumulator,
    api_for_path,
)

pytestmark = pytest.mark.inprocess

ROOT = Path(replayer.wire.__file__).parents[1]


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", Api.CHAT),
        ("http://h:8000/prefix/v1/chat/completions?x=1", Api.CHAT),
        ("/v1/completions", Api.COMPLETIONS),
        ("/v1/completions/", Api.COMPLETIONS),
        ("/v1/messages", Api.MESSAGES),
        ("/v1/responses", Api.RESPONSES),
        ("/v1/embeddings", None),
        ("/health", None),
    ],
)
def test_api_for_path(path, api):
    assert api_for_path(path) is api


def test_every_api_has_its_accumulator():
    assert set(ACCUMULATORS) == set(Api)
    for api, cls in ACCUMULATORS.items():
        assert cls.api is api
        reply = Reply()
        acc = accumulator(api, reply)
        assert type(acc) is cls and acc.reply is reply
    assert {
        ChatAccumulator,
        CompletionsAccumulator,
        MessagesAccumulator,
        ResponsesAccumulator,
    } == set(ACCUMULATORS.values())
    assert accumulator(Api.CHAT).reply is not accumulator(Api.CHAT).reply


def _replayer_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n == "replayer" or n.startswith("replayer.")}


@pytest.mark.parametrize(
    "path", [*sorted((ROOT / "wire").glob("*.py")), ROOT / "_http.py"], ids=str
)
def test_leaf_modules_import_nothing_of_the_pipeline(path):
    allowed = {"replayer.errors"}
    own = {n for n in _replayer_imports(path) if not n.startswith("replayer.wire")}
    assert own <= allowed, own
