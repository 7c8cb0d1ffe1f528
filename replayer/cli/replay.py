"""``replayer replay``: a trace against one or more targets, side by side.

With ``--launch CMD`` the one target is a server replayer starts, watches,
signs the crash of (from its log) and stops.

Exit codes: 0 every target survived, 1 a target failed, 2 usage or input
error, 3 a target was unreachable before the first request, 4 the trace did
not exercise a target (most requests were rejected as client errors).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_options, build
from replayer.errors import OptionError


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace against one or more targets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    add_options(p, "replay")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="RUN",
        help="run directory (default runs/<timestamp>)",
    )
    p.add_argument("--force", action="store_true", help="reuse a non-empty --out")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from replayer import api

    targets = build(options.Targets, args, "replay")
    server = None
    endpoints = None
    if args.launch is not None:
        if len(targets.target) > 1:
            raise OptionError("launch", "runs one server: give at most one --target NAME=URL")
        url = targets.endpoints()[0].url if targets.target else None
        server = options.Server(
            launch=args.launch,
            url=url,
            ready_timeout=args.ready_timeout,
            keep_running=args.keep_running,
            api_key=targets.api_key(),
        )
    else:
        endpoints = targets.endpoints()
    result = api.replay_sync(
        args.trace,
        endpoints,
        build(options.ReplayPolicy, args, "replay"),
        server=server,
        selection=build(options.Selection, args, "replay"),
        out=args.out,
        watch=build(options.WatchConfig, args, "replay"),
        force=args.force,
        progress=not args.quiet,
        metrics=build(options.MetricsOptions, args, "replay"),
        command=sys.argv,
    )
    print_result(result, as_json=args.json)
    for note in result.notes:
        print(f"replayer replay: {note}", file=sys.stderr)
    return result.exit_code


def print_result(result: Any, *, as_json: bool) -> None:
    """A replay's summary, as text or JSON, and why it exercised nothing."""
    import orjson

    from replayer.replay.summary import render

    summary = dict(result.summary)
    if as_json:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif result.unreachable:
        print(f"replayer replay: {result.unreachable}", file=sys.stderr)
    else:
        print(render(summary))
        failure = result.failure
        if failure is not None and failure.signature is not None:
            print(f"  signature {failure.signature.hash}: {failure.signature.text}")
        print(f"run directory: {result.paths.out}")
    if result.unexercised:
        print(f"replayer replay: NOT EXERCISED: {result.unexercised}", file=sys.stderr)
