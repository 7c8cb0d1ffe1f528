"""``replayer record`` (the recording proxy) and ``replayer trace merge`` (its segments)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from replayer.errors import UsageError

RECORD_DESCRIPTION = """\
Record agent sessions: a transparent reverse proxy in front of an
OpenAI-compatible server (vLLM). Point the agent at the proxy instead of the
server. Every path is forwarded unchanged; POST /v1/chat/completions and
/v1/completions exchanges are recorded into TRACE (an Arrow IPC stream,
flushed every --flush-interval seconds, readable even after SIGKILL).

Sessions come from a session header when the client sends one, else are
inferred: a request whose messages extend an earlier request's messages plus
its reply is that conversation's next turn. Credentials (Authorization,
api-key headers, cookies, credential query/body fields) are never stored.

If TRACE exists, the recording goes to the next segment (TRACE.1.arrow, ...);
join segments with `replayer trace merge`. Stop with Ctrl-C or SIGTERM.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "record",
        help="record agent traffic through a transparent proxy",
        description=RECORD_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--upstream", required=True, metavar="URL", help="the server, e.g. http://gpu1:8000"
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8001",
        metavar="[HOST:]PORT",
        help="address to serve on (default 127.0.0.1:8001; port 0 = any free port)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="TRACE",
        help="trace to write (never overwritten: an existing one gets a new segment)",
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="push recorded rows to disk at least this often (default 1 s)",
    )
    p.add_argument(
        "--session-header",
        action="append",
        default=None,
        metavar="NAME",
        help="header naming the session (repeatable; default X-Session-Id, "
        "X-Session-Affinity, X-Correlation-ID; 'none' = always infer)",
    )
    p.add_argument(
        "--drop-header",
        action="append",
        default=[],
        metavar="NAME",
        help="never store this request header (repeatable; credentials are always dropped)",
    )
    p.add_argument(
        "--redact",
        action="append",
        default=[],
        metavar="REGEX",
        help="mask matches in stored bodies and outputs (repeatable)",
    )
    p.add_argument("--fsync", action="store_true", help="fsync on every flush (survive power loss)")
    p.add_argument(
        "--record-count-tokens",
        action="store_true",
        help="record Anthropic /v1/messages/count_tokens requests too (always forwarded; "
        "not recorded by default: they are not load)",
    )
    p.add_argument(
        "--drain",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds in-flight exchanges get to finish at shutdown (default 5)",
    )
    p.add_argument(
        "--max-connections", type=int, default=4096, metavar="N", help="upstream pool size"
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="upstream connect timeout (no read timeout: prefills are long)",
    )
    p.add_argument(
        "--add-request-id",
        action="store_true",
        help="send the recorded request id upstream as X-Request-Id when the client sent none",
    )
    p.add_argument(
        "--port-file", type=Path, default=None, metavar="PATH", help="write the bound port here"
    )
    p.add_argument(
        "--progress",
        type=float,
        default=10.0,
        metavar="S",
        help="progress line on stderr every S seconds (0 = off)",
    )
    from replayer.cli.replay import add_metrics_arguments

    add_metrics_arguments(p)
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


def config_from(args: argparse.Namespace, output: Path, segment: int) -> Any:
    import re
    from urllib.parse import urlsplit

    from replayer.record.proxy import RecordConfig, parse_listen
    from replayer.record.recorder import DEFAULT_SESSION_HEADERS

    up = urlsplit(args.upstream)
    if up.scheme not in ("http", "https") or not up.hostname:
        raise UsageError(f"--upstream wants http://HOST[:PORT][/PREFIX], not {args.upstream!r}")
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for pattern in args.redact:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"--redact: bad regular expression: {exc}") from None
    if args.flush_interval <= 0:
        raise UsageError("--flush-interval must be > 0")
    if args.drain < 0 or args.connect_timeout <= 0 or args.max_connections < 1:
        raise UsageError("--drain, --connect-timeout and --max-connections must be positive")
    headers = tuple(args.session_header or DEFAULT_SESSION_HEADERS)
    if any(h.lower() == "none" for h in headers):
        headers = ()
    return RecordConfig(
        upstream=args.upstream,
        output=output,
        host=host,
        port=port,
        flush_interval=args.flush_interval,
        session_headers=headers,
        drop_headers=tuple(args.drop_header),
        redact=tuple(args.redact),
        fsync=args.fsync,
        drain=args.drain,
        max_connections=args.max_connections,
        connect_timeout=args.connect_timeout,
        add_request_id=args.add_request_id,
        record_count_tokens=args.record_count_tokens,
        id_prefix="rec-" if segment == 0 else f"rec{segment}-",
        details={"segment": segment, "segment_of": str(args.output)},
    )


def cmd_record(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib

    from replayer.cli.replay import start_metrics
    from replayer.record.run import event_loop_factory, say, serve
    from replayer.record.segments import claim

    config_from(args, args.output, 0)  # validate before claiming a file
    path, segment = claim(args.output)
    config = config_from(args, path, segment)
    if segment:
        say(f"{args.output} exists: recording to a new segment, {path}")
    live, server = None, None
    try:
        live, server = start_metrics(args)
        # uvloop when it is installed: ~7% less CPU per relayed request
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(
                serve(
                    config,
                    port_file=args.port_file,
                    progress=args.progress,
                    segment_of=args.output,
                    live=live,
                )
            )
    except BaseException:
        # nothing recorded (e.g. the port was taken): leave no empty file behind
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()
        raise
    finally:
        if server is not None:
            server.close()


def cmd_merge(args: argparse.Namespace) -> int:
    import sys

    from replayer._files import atomic_output
    from replayer.record.segments import merge

    with atomic_output(args.output, force=args.force) as tmp:
        res = merge(args.segments, tmp)
    print(
        f"merged {res.rows:,} requests from {res.segments} segment(s) into {args.output}: "
        f"{res.sessions:,} sessions, {res.relinked:,} re-linked, "
        f"{res.renamed:,} request ids renamed",
        file=sys.stderr,
    )
    return 0
