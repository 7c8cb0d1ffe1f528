"""``replayer record`` (the recording proxy) and ``replayer trace merge`` (its segments)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_options, build

RECORD_DESCRIPTION = """\
Record agent sessions: a transparent reverse proxy in front of an
OpenAI-compatible server (vLLM). Point the agent at the proxy instead of the
server. Every path is forwarded unchanged; POST /v1/chat/completions,
/v1/completions, /v1/messages and /v1/responses exchanges are recorded into
TRACE (an Arrow IPC stream). Each exchange is written before its client gets
the end of the response, so SIGKILL loses none a client saw complete.

Sessions come from a session header when the client sends one, else are
inferred: a request whose messages extend an earlier request's messages plus
its reply is that conversation's next turn. Credentials (Authorization,
api-key headers, cookies, credential query/body fields) are never stored.

If TRACE exists, the recording goes to the next segment (TRACE.1.arrow, ...);
join segments with `replayer trace merge`. Stop with Ctrl-C or SIGTERM.

Exit codes: 0 stopped cleanly; 1 some exchanges could not be made into rows;
2 recording stopped early (the trace could not be written: disk full; traffic
was forwarded all along, the trace ends at the failure) or a usage error.
"""


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    p = sub.add_parser(
        "record",
        help="record agent traffic through a transparent proxy",
        description=RECORD_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="TRACE",
        help="trace to write (never overwritten: an existing one gets a new segment)",
    )
    add_options(p, "record")
    p.set_defaults(func=cmd_record)

    t = sub.add_parser("trace", help="operations on trace files (merge, convert)")
    tsub = t.add_subparsers(dest="trace_command", metavar="OP", required=True, parser_class=type(t))
    m = tsub.add_parser(
        "merge",
        help="join recording segments (or traces) into one trace",
        description="Join recording segments into one trace: rows in trace order on one "
        "clock, sessions re-linked across restarts, request-id collisions renamed.",
    )
    m.add_argument(
        "segments", nargs="+", type=Path, metavar="SEG", help="segments or traces, any order"
    )
    m.add_argument(
        "-o", "--output", required=True, type=Path, metavar="OUT.arrow", help="merged trace"
    )
    m.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    m.set_defaults(func=cmd_merge)
    from replayer.cli.trace_cmds import register_trace_ops

    register_trace_ops(tsub)


def cmd_record(args: argparse.Namespace) -> int:
    from replayer import api

    return api.record(
        build(options.RecordOptions, args, "record"),
        args.output,
        metrics=build(options.MetricsOptions, args, "record"),
    )


def cmd_merge(args: argparse.Namespace) -> int:
    import sys

    from replayer import api

    res = api.merge(args.segments, args.output, force=args.force)
    print(
        f"merged {res.rows:,} requests from {res.segments} segment(s) into {args.output}: "
        f"{res.sessions:,} sessions, {res.relinked:,} re-linked, "
        f"{res.renamed:,} request ids renamed",
        file=sys.stderr,
    )
    return 0
