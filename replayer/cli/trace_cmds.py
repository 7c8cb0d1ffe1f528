"""Trace commands: ``import``, ``synth``, ``inspect``, ``export`` and
``trace convert`` (registered under ``replayer trace`` by :func:`register_trace_ops`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_options, build
from replayer.errors import UsageError


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    from replayer.trace.importers import IMPORTERS, help_of, load

    p = sub.add_parser(
        "import",
        help="convert a public trace format into a replayer trace",
        description="Convert source files of a public trace format into one replayer trace.",
    )
    fmts = p.add_subparsers(dest="format", metavar="FORMAT", required=True, parser_class=type(p))
    # a format's own flags come with its module: loaded only for the format named
    # (``replayer import --help`` lists every format from the registry alone)
    named = set(argv) & set(IMPORTERS) if argv else set(IMPORTERS)
    for name in IMPORTERS:
        fp = fmts.add_parser(name, help=help_of(name), description=help_of(name))
        fp.add_argument(
            "sources",
            nargs="+",
            type=Path,
            metavar="SRC",
            help="source files (or directories, for multi-file formats)",
        )
        fp.add_argument("-o", "--output", required=True, type=Path, metavar="OUT.arrow")
        fp.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
        if name in named:
            load(name).add_arguments(fp)
        fp.set_defaults(func=cmd_import, importer=name)

    p = sub.add_parser("synth", help="synthesize agent sessions into a trace")
    add_options(p, "synth")
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
    add_options(p, "inspect")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("export", help="write a trace as JSONL (full bodies, trace order)")
    p.add_argument("trace", type=Path, metavar="TRACE")
    add_options(p, "export")
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


def _tty_progress(msg: str) -> None:
    if sys.stderr.isatty():
        _progress(msg)


def cmd_import(args: argparse.Namespace) -> int:
    from replayer import api

    t0 = time.monotonic()
    got = api.import_trace(
        args.importer,
        args.sources,
        args.output,
        options=args,
        force=args.force,
        say=_tty_progress,
    )
    if got.requests == 0:
        _progress(f"import {args.importer}: warning: no requests found in the sources")
    _progress(
        f"imported {got.requests:,} requests from {len(args.sources)} source(s) into "
        f"{args.output} in {time.monotonic() - t0:.1f} s"
    )
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from replayer import api

    o = build(options.SynthOptions, args, "synth")
    if not o.roomy():
        raise UsageError(
            f"--context {o.context} is too small for --system-tokens {o.system_tokens} "
            f"and {o.turns} turns"
        )
    got = api.synth(args.output, o, force=args.force)
    _progress(f"synthesized {got.requests:,} requests into {args.output}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import orjson

    from replayer import api
    from replayer.trace.stats import render_text

    info = api.inspect(
        args.trace,
        selection=build(options.Selection, args, "inspect"),
        verify=args.verify,
        prefix_cache=args.prefix_cache,
    )
    from replayer.trace.stats import synthetic_note

    note = synthetic_note(info.get("kinds") or {})
    if note:
        info["synthetic_prompts"] = note
    if args.json:
        sys.stdout.write(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render_text(info))
        if note:
            print(note)
        if args.verify:
            print("\n" + "\n".join(info["verify"]))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from replayer import api

    got = api.export(
        args.trace,
        args.output,
        format=args.format,
        selection=build(options.Selection, args, "export"),
        force=args.force,
    )
    skipped = got.details.get("skipped") or []
    if skipped:
        _progress(
            f"export: {len(skipped)} request(s) of no chat/text/blocks shape have no "
            f"{args.format} form and were left out (first: {skipped[0]})"
        )
    _progress(f"exported {got.requests:,} requests to {args.output}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from replayer import api
    from replayer.trace.schema import TRACE_SCHEMA_VERSION

    got = api.convert(args.trace, args.output, form=args.form, force=args.force)
    _progress(
        f"converted {got.requests:,} requests from schema v{got.details['from']} to "
        f"v{TRACE_SCHEMA_VERSION} into {args.output} ({got.details['batches']:,} batches, "
        "digests written)"
    )
    return 0
