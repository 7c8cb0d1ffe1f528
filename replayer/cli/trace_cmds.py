"""Trace commands: ``import``, ``synth``, ``inspect``, ``export`` and
``trace convert`` (registered under ``replayer trace`` by :func:`register_trace_ops`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from replayer.errors import UsageError


def register(sub: Any) -> None:
    from replayer.trace.importers import IMPORTERS, load

    p = sub.add_parser(
        "import",
        help="convert a public trace format into a replayer trace",
        description="Convert source files of a public trace format into one replayer trace.",
    )
    fmts = p.add_subparsers(dest="format", metavar="FORMAT", required=True, parser_class=type(p))
    for name in IMPORTERS:
        mod = load(name)
        fp = fmts.add_parser(name, help=mod.HELP, description=mod.HELP)
        fp.add_argument(
            "sources",
            nargs="+",
            type=Path,
            metavar="SRC",
            help="source files (or directories, for multi-file formats)",
        )
        fp.add_argument("-o", "--output", required=True, type=Path, metavar="OUT.arrow")
        fp.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
        mod.add_arguments(fp)
        fp.set_defaults(func=cmd_import, importer=name)

    p = sub.add_parser("synth", help="synthesize agent sessions into a trace")

    _add_synth_arguments(p)
    p.add_argument("-o", "--output", required=True, type=Path, metavar="OUT.arrow")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser(
        "inspect",
        help="summarize a trace (sessions, turns, context lengths)",
        description="Summarize a trace. Every batch is decoded and matched against its "
        "digests first: a damaged trace exits 2 naming the first bad batch.",
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also rebuild every body (length against body_bytes) and check the index "
        "invariants (unique ids, delta bases, turn order); print what was checked",
    )
    p.add_argument(
        "--prefix-cache",
        type=int,
        default=None,
        metavar="BLOCK",
        help="also the ideal prefix-cache hit ratio of the blocks requests, for a server "
        "with BLOCK-token KV blocks (vLLM: 16 on GPUs, 128 on CPU); reads all content",
    )
    from replayer.cli.replay import add_selection_arguments

    add_selection_arguments(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("export", help="write a trace as JSONL (full bodies, trace order)")
    p.add_argument("trace", type=Path, metavar="TRACE")
    from replayer.cli.replay import add_selection_arguments

    add_selection_arguments(p)
    p.add_argument("-o", "--output", required=True, type=Path, metavar="OUT.jsonl")
    p.add_argument(
        "--format",
        choices=("jsonl", "aiperf", "aiperf-inputs"),
        default="jsonl",
        help="jsonl: replayer rows with full bodies; aiperf: AIPerf mooncake_trace rows; "
        "aiperf-inputs: an AIPerf inputs.json (verbatim payloads by session)",
    )
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=cmd_export)


def register_trace_ops(tsub: Any) -> None:
    """``replayer trace convert``, beside ``trace merge``."""
    c = tsub.add_parser(
        "convert",
        help="rewrite a trace at the current schema version",
        description="Rewrite a trace of an older schema version (read through the "
        "migrations) at the current one: same rows in the same order, same bodies, "
        "fresh digests. The input is verified in full first.",
    )
    c.add_argument("trace", type=Path, metavar="TRACE")
    c.add_argument("-o", "--output", required=True, type=Path, metavar="OUT.arrow")
    c.add_argument(
        "--form",
        choices=("file", "stream"),
        default=None,
        help="IPC form of the output (default: the input's)",
    )
    c.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    c.set_defaults(func=cmd_convert)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _add_synth_arguments(p: argparse.ArgumentParser) -> None:
    from replayer.trace.synth import SynthOptions

    d = SynthOptions()
    p.add_argument("--sessions", type=int, default=d.sessions, help="number of sessions")
    p.add_argument("--turns", type=int, default=d.turns, help="requests per session")
    p.add_argument(
        "--context",
        type=int,
        default=d.context,
        help="context tokens of each session's last request",
    )
    p.add_argument(
        "--system-tokens",
        type=int,
        default=d.system_tokens,
        help="tokens of the system prompt shared by all sessions",
    )
    p.add_argument("--tools", type=int, default=d.tools, help="tool schemas shared by all sessions")
    p.add_argument(
        "--reply-tokens", type=int, default=d.reply_tokens, help="mean tokens of an assistant reply"
    )
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="max_tokens of every body")
    p.add_argument("--payload", choices=("chat", "blocks"), default=d.payload)
    p.add_argument(
        "--api",
        choices=("chat", "messages", "responses"),
        default=d.api,
        help="wire format of chat payloads: OpenAI chat completions (default), Anthropic "
        "Messages (Claude Code's shape) or OpenAI Responses (Codex's shape)",
    )
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per block")
    p.add_argument(
        "--rate",
        type=float,
        default=d.rate,
        help="session arrivals per second (Poisson; 0 = all at once)",
    )
    p.add_argument("--think", type=float, default=d.think, help="mean think time in seconds")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--model", default=d.model, help="model name written into the bodies")


def _synth_options(args: argparse.Namespace) -> Any:
    from replayer.trace.synth import SynthOptions

    o = SynthOptions(
        sessions=args.sessions,
        turns=args.turns,
        context=args.context,
        system_tokens=args.system_tokens,
        tools=args.tools,
        reply_tokens=args.reply_tokens,
        max_tokens=args.max_tokens,
        payload=args.payload,
        api=args.api,
        block_size=args.block_size,
        rate=args.rate,
        think=args.think,
        seed=args.seed,
        model=args.model,
    )
    if not o.roomy():
        raise UsageError(
            f"--context {o.context} is too small for --system-tokens {o.system_tokens} "
            f"and {o.turns} turns"
        )
    return o


def cmd_import(args: argparse.Namespace) -> int:
    from replayer._files import atomic_output
    from replayer.trace.importers import details, load
    from replayer.trace.model import TraceMeta
    from replayer.trace.writer import TraceWriter

    mod = load(args.importer)
    for src in args.sources:
        if not src.exists():
            raise UsageError(f"{src}: no such file or directory")
    meta = TraceMeta(
        source=f"import:{args.importer}",
        details={"sources": [str(s) for s in args.sources], **details(mod, args.sources, args)},
    )
    t0 = time.monotonic()
    last = t0
    with (
        atomic_output(args.output, force=args.force) as tmp,
        TraceWriter(tmp, meta, form="file") as w,
    ):
        for rec in mod.records(args.sources, args):
            w.add(rec)
            now = time.monotonic()
            if now - last >= 2.0 and sys.stderr.isatty():
                _progress(f"import {args.importer}: {w.rows:,} requests ...")
                last = now
        rows = w.rows
    if rows == 0:
        _progress(f"import {args.importer}: warning: no requests found in the sources")
    _progress(
        f"imported {rows:,} requests from {len(args.sources)} source(s) into {args.output} "
        f"in {time.monotonic() - t0:.1f} s"
    )
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from replayer._files import atomic_output
    from replayer.trace import synth

    with atomic_output(args.output, force=args.force) as tmp:
        n = synth.write_trace(tmp, _synth_options(args))
    _progress(f"synthesized {n:,} requests into {args.output}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import orjson

    from replayer.trace.reader import Trace
    from replayer.trace.stats import inspect_trace, prefix_cache_figures, render_text

    if args.prefix_cache is not None and args.prefix_cache < 1:
        raise UsageError("--prefix-cache wants a block size >= 1")
    from replayer.replay.plan import select

    trace = Trace.open(args.trace)
    report = trace.verify(bodies=args.verify)
    rows = None
    if args.limit is not None or args.sessions or args.requests:
        rows = select(trace, limit=args.limit, sessions=args.sessions, requests=args.requests)
    info = inspect_trace(trace, rows)
    if args.prefix_cache is not None:
        info["prefix_cache"] = prefix_cache_figures(trace, args.prefix_cache, rows)
    if args.verify:
        info["verify"] = report.lines()
    if args.json:
        sys.stdout.write(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render_text(info))
        if args.verify:
            print("\n" + "\n".join(report.lines()))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from replayer._files import atomic_output
    from replayer.replay.plan import select
    from replayer.trace.export import export_path
    from replayer.trace.reader import Trace

    trace = Trace.open(args.trace)
    rows = select(trace, limit=args.limit, sessions=args.sessions, requests=args.requests)
    if not rows and (args.limit, args.sessions, args.requests) != (None, None, None):
        raise UsageError("the selection is empty: nothing to export")
    with atomic_output(args.output, force=args.force) as tmp:
        n, skipped = export_path(trace, tmp, args.format, rows)
    if skipped:
        _progress(
            f"export: {len(skipped)} request(s) of no chat/text/blocks shape have no "
            f"{args.format} form and were left out (first: {skipped[0]})"
        )
    _progress(f"exported {n:,} requests to {args.output}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from replayer._files import atomic_output
    from replayer.trace.convert import convert
    from replayer.trace.reader import Trace
    from replayer.trace.schema import TRACE_SCHEMA_VERSION

    trace = Trace.open(args.trace)
    trace.verify()
    with atomic_output(args.output, force=args.force) as tmp:
        rows, batches = convert(trace, tmp, form=args.form)
    _progress(
        f"converted {rows:,} requests from schema v{trace.schema_version} to "
        f"v{TRACE_SCHEMA_VERSION} into {args.output} ({batches:,} batches, digests written)"
    )
    return 0
