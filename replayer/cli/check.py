"""``replayer check``: one trial, with exit codes a bisect or reducer script uses.

Launch (or reuse) the target, replay the trace, classify what happened.

| convention | no failure | the chased failure | other failure, INVALID, infrastructure |
|---|---|---|---|
| ``bisect`` (default, ``git bisect run``) | 0 | 1 | 125 (skip) |
| ``reduce`` (C-Reduce, shrinkray) | 1 | 0 | 1, or ``--also-interesting N`` for other failures |

A run whose requests were mostly rejected as client errors did not exercise
the server: it exits 128 under ``bisect`` (``git bisect run`` aborts) and 1
under ``reduce``, with the first rejection on stderr.

Usage errors exit 2 in both. Without ``--signature``, any crash is the
chased failure; ``--signature REGEX`` pins it to crashes whose signature
text matches, ``--expect-signature HASH`` to one signature hash.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_options, build


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    p = sub.add_parser(
        "check",
        help="one trial: does this trace crash the target?",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    add_options(p, "check")
    p.add_argument("--out", type=Path, default=None, metavar="RUN")
    p.add_argument("--force", action="store_true", help="reuse a non-empty --out")
    p.set_defaults(func=cmd_check)


def server_from(args: argparse.Namespace, verb: str) -> options.Server:
    """The one server of a lifecycle verb, its key from the environment or a file."""
    from dataclasses import replace

    key = build(options.Targets, args, verb).api_key()
    return replace(build(options.Server, args, verb), api_key=key)


def cmd_check(args: argparse.Namespace) -> int:
    from replayer import api

    chase = build(options.ChaseOptions, args, "check")
    verdict = build(options.CheckOptions, args, "check")
    res = api.check_sync(
        args.trace,
        server_from(args, "check"),
        build(options.ReplayPolicy, args, "check"),
        selection=build(options.Selection, args, "check"),
        out=args.out,
        watch=build(options.WatchConfig, args, "check"),
        signature=chase.signature,
        expect_signature=chase.expect_signature,
        keep_running=args.keep_running,
        force=args.force,
        progress=True,
        command=sys.argv,
    )
    if res.run is not None and res.run.endpoints:
        from replayer.replay.summary import render

        print(render(dict(res.run.summary)))
    sig = res.signature
    print(
        f"outcome: {res.outcome.value}"
        + (f" [{res.failure_class}]" if res.failure_class else "")
        + (f" signature {sig.hash}" if sig else "")
        + (f": {res.message}" if res.outcome.value == "INFRA" and res.message else "")
    )
    if sig is not None:
        print(sig.text)
    print(f"run directory: {res.out}")
    if res.unexercised:
        print(f"replayer check: NOT EXERCISED: {res.unexercised}", file=sys.stderr)
    return res.exit_code(verdict.convention, verdict.also_interesting)
