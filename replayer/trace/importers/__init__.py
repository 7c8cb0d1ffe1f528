"""Importers of public trace formats: each turns source files into
:class:`~replayer.trace.model.RequestRecord` values, streaming.

An importer module defines ``NAME``, ``add_arguments(parser)`` and
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
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from replayer.trace.model import RequestRecord

# Format name -> (module, one-line help); the order here is the order in --help.
IMPORTERS: dict[str, tuple[str, str]] = {
    "mooncake": (
        "replayer.trace.importers.mooncake",
        "Mooncake FAST'25 JSONL (timestamp, input/output length, 512-token hash ids)",
    ),
    "kv-cache-tester": (
        "replayer.trace.importers.kv_cache_tester",
        "kv-cache-tester Claude Code session traces (trace_NNNN.json[.gz], 64-token hash ids)",
    ),
    "azure": (
        "replayer.trace.importers.azure",
        "Azure LLM inference trace 2023 CSV (TIMESTAMP,ContextTokens,GeneratedTokens)",
    ),
    "tau-bench": (
        "replayer.trace.importers.tau_bench",
        "τ-bench historical trajectories (JSON list of {task_id, trial, traj[]})",
    ),
    "tau2-bench": (
        "replayer.trace.importers.tau2_bench",
        "τ²-bench simulation results (JSON with simulations[], timestamps, real usage)",
    ),
    "swe-agent": (
        "replayer.trace.importers.swe_agent",
        "SWE-agent .traj files and mini-swe-agent .traj.json message lists (files or dirs)",
    ),
    "openai-jsonl": (
        "replayer.trace.importers.openai_jsonl",
        "OpenAI request bodies, one per line (bare, or {body, request_id, session_id, ...})",
    ),
    "aiperf": (
        "replayer.trace.importers.aiperf",
        "AIPerf mooncake_trace JSONL (input_length+hash_ids | text_input | messages | payload)",
    ),
    "aiperf-payloads": (
        "replayer.trace.importers.aiperf_payloads",
        "AIPerf verbatim payloads: a run's inputs.json, or raw_payload JSONL files / directories",
    ),
    "aiperf-dag": (
        "replayer.trace.importers.aiperf_dag",
        "AIPerf dag_jsonl conversation DAGs (spawns and forks become joins; message arrays only)",
    ),
}
"""The help is declared here, not in the module, so ``replayer import --help``
lists every format without loading any of them (or Arrow)."""


class Importer(Protocol):
    NAME: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def records(self, sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]: ...


def load(name: str) -> Importer:
    return cast(Importer, importlib.import_module(IMPORTERS[name][0]))


def help_of(name: str) -> str:
    return IMPORTERS[name][1]


def details(mod: Importer, sources: list[Path], opts: argparse.Namespace) -> dict[str, Any]:
    fn = getattr(cast(ModuleType, mod), "details", None)
    return dict(fn(sources, opts)) if fn is not None else {}
