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
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_opt
from replayer.cli.replay import (
    add_monitor_arguments,
    add_policy_arguments,
    add_selection_arguments,
    policy_from,
    watch_from,
)
from replayer.errors import UsageError


def add_lifecycle_arguments(p: argparse.ArgumentParser) -> None:
    """One server's lifecycle; ``--target`` (replay's spelling) is ``--url``."""
    g = p.add_argument_group(options.SERVER.title)
    for o in options.SERVER.opts:
        if o.name == "url":
            add_opt(g, o, "--target")
        else:
            add_opt(g, o)
    g.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="read the API key from a file",
    )


def target_from(
    args: argparse.Namespace,
    log_path: Path,
    model: str | None,
    marks: dict[str, str] | None = None,
) -> Any:
    import os

    from replayer.cli.replay import read_key
    from replayer.target.factory import make_target

    key = None
    if getattr(args, "api_key_file", None) is not None:
        key = read_key(f"file:{args.api_key_file}", "--api-key-file")
    elif args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if key is None:
            raise UsageError(f"--api-key-env: environment variable {args.api_key_env} is not set")
    elif os.environ.get("REPLAYER_API_KEY"):
        key = os.environ["REPLAYER_API_KEY"]
    if args.url is not None:
        name, sep, rest = args.url.partition("=")
        if sep and "://" not in name:
            args.url = rest  # --target NAME=URL, as replay takes it
        options.url("url", args.url)
    target = make_target(
        launch=args.launch,
        restart_cmd=args.restart_cmd,
        url=args.url,
        log_cmd=args.log_cmd,
        log_path=log_path,
        model=model,
        api_key=key,
        ready_timeout=args.ready_timeout,
        marks=marks,
    )
    return target, key


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="one trial: does this trace crash the target?",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    add_lifecycle_arguments(p)
    add_policy_arguments(p)
    add_monitor_arguments(p)
    add_selection_arguments(p)
    g = p.add_argument_group("verdict")
    g.add_argument(
        "--signature",
        default=None,
        metavar="REGEX",
        help="the chased failure: crashes whose signature text matches",
    )
    g.add_argument(
        "--expect-signature",
        default=None,
        metavar="HASH",
        help="the chased failure: crashes with this signature hash",
    )
    g.add_argument("--convention", choices=("bisect", "reduce"), default="bisect")
    g.add_argument(
        "--also-interesting",
        type=int,
        default=None,
        metavar="N",
        help="reduce convention: exit N for another failure",
    )
    p.add_argument("--out", type=Path, default=None, metavar="RUN")
    p.add_argument("--force", action="store_true", help="reuse a non-empty --out")
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="leave a launched server running after the trial",
    )
    p.set_defaults(func=cmd_check)


def exit_code(outcome: str, convention: str, also: int | None) -> int:
    if convention == "bisect":
        return {"PASS": 0, "MATCH": 1}.get(outcome, 125)
    if outcome == "MATCH":
        return 0
    if outcome == "OTHER_FAILURE" and also is not None:
        return also
    return 1


def cmd_check(args: argparse.Namespace) -> int:
    import asyncio

    from replayer.bisect.trial import Chase, TrialEnv
    from replayer.monitor.signature import compile_signature_regex
    from replayer.replay.plan import select
    from replayer.replay.run import prepare_out
    from replayer.replay.summary import render
    from replayer.trace.reader import Trace

    policy = policy_from(args)
    watch = watch_from(args)
    if watch is None:
        raise UsageError("check classifies failures: it needs the monitor (drop --no-monitor)")
    if args.also_interesting is not None and not 2 < args.also_interesting < 125:
        raise UsageError("--also-interesting must be between 3 and 124")
    chase = Chase(
        regex=compile_signature_regex(args.signature) if args.signature else None,
        signature=args.expect_signature,
    )
    trace = Trace.open(args.trace)
    rows = select(trace, limit=args.limit, sessions=args.sessions, requests=args.requests)
    trace.verify(rows)  # nothing is sent before the selection reads
    if not rows:
        raise UsageError("the selection is empty: nothing to replay")
    out = prepare_out(args.out, args.force)
    target, key = target_from(args, out / "server.log", trace.model_of(rows, policy.model))

    async def go() -> Any:
        env = TrialEnv(
            trace=trace,
            policy=policy,
            target=target,
            watch=watch,
            reset=options.reset_mode(args.reset),
            api_key=key,
            chase=chase,
        )
        try:
            return await env.run(rows, out, progress=True, command=sys.argv)
        finally:
            if not args.keep_running:
                await target.stop()

    res = asyncio.run(go())
    if res.run is not None and "targets" in res.run.summary:
        print(render(res.run.summary))
    sig = res.signature
    print(
        f"outcome: {res.outcome.value}"
        + (f" [{res.failure_class}]" if res.failure_class else "")
        + (f" signature {sig.hash}" if sig else "")
        + (f": {res.message}" if res.outcome.value == "INFRA" and res.message else "")
    )
    if sig is not None:
        print(sig.text)
    print(f"run directory: {out}")
    if res.unexercised:
        # not "no failure": git bisect must not call this commit good, nor a
        # reducer keep going on a trace the server never ran
        print(f"replayer check: NOT EXERCISED: {res.unexercised}", file=sys.stderr)
        return NOT_EXERCISED[args.convention]
    return exit_code(res.outcome.value, args.convention, args.also_interesting)


NOT_EXERCISED = {"bisect": 128, "reduce": 1}
"""``git bisect run`` aborts on 128..255; a reducer sees "not interesting"."""
