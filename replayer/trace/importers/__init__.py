"""Importers of public trace formats: each turns source files into
:class:`~replayer.trace.model.RequestRecord` values, streaming.

An importer module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``records(sources, opts) -> Iterator[RequestRecord]``; it may define
``details(sources, opts) -> dict`` for the provenance. It raises
:class:`~replayer.errors.ImportFormatError` on input of another format.
Records may come in any order: trace order is by recorded start time.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

from replayer.trace.model import RequestRecord

# Format name -> module; the order here is the order in --help.
IMPORTERS: dict[str, str] = {
    "mooncake": "replayer.trace.importers.mooncake",
    "kv-cache-tester": "replayer.trace.importers.kv_cache_tester",
    "azure": "replayer.trace.importers.azure",
    "tau-bench": "replayer.trace.importers.tau_bench",
    "tau2-bench": "replayer.trace.importers.tau2_bench",
    "swe-agent": "replayer.trace.importers.swe_agent",
    "openai-jsonl": "replayer.trace.importers.openai_jsonl",
    "aiperf": "replayer.trace.importers.aiperf",
    "aiperf-payloads": "replayer.trace.importers.aiperf_payloads",
}


class Importer(Protocol):
    NAME: str
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def records(self, sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]: ...


def load(name: str) -> Importer:
    return cast(Importer, importlib.import_module(IMPORTERS[name]))


def details(mod: Importer, sources: list[Path], opts: argparse.Namespace) -> dict[str, Any]:
    fn = getattr(cast(ModuleType, mod), "details", None)
    return dict(fn(sources, opts)) if fn is not None else {}
