"""``replayer bundle verify`` and ``replayer soak``: rates, not anecdotes.

``bundle verify DIR`` replays a repro bundle N times (its own policy) against
a server and reports how often the bundle's crash reproduced: k/N with a 95%
Wilson interval. Exit 0 if it reproduced at least once, 1 if never (with the
upper bound on its rate), 2 usage, 3 if the server would not come up.

``soak TRACE`` verifies a fix: N runs of a trace; exit 0 if none crashed
(the report gives the 95% upper bound on the crash rate, 1 - 0.05^(1/N)),
1 if any did.

Both refuse (exit 4) as soon as a run's requests were mostly rejected as
client errors: such a run exercised nothing, and counting it as clean would
bound a crash rate the server was never asked to show.

``bundle verify --vary FILE|default`` then relaunches the server with each
variant and replays the bundle ``--vary-runs`` times (5) on each; the N runs
above are the control row. The table is printed and saved as
OUT/variants.json; the exit code is the unmodified launch's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.bisect import add_vary_arguments, print_variants, vary_plan
from replayer.cli.check import add_lifecycle_arguments, target_from
from replayer.cli.replay import (
    add_monitor_arguments,
    add_policy_arguments,
    add_selection_arguments,
    policy_from,
    watch_from,
)
from replayer.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("bundle", help="work with repro bundles")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(p))
    v = verbs.add_parser(
        "verify",
        help="replay a bundle N times and report the crash rate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("bundle", type=Path, metavar="DIR")
    add_lifecycle_arguments(v)
    v.add_argument("--runs", type=int, default=10, metavar="N", help="runs (default 10)")
    v.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the runs go (default DIR/verify-<timestamp>)",
    )
    add_monitor_arguments(v)
    add_vary_arguments(v)
    v.set_defaults(func=cmd_verify)

    s = sub.add_parser(
        "soak",
        help="verify a fix: N runs of a trace, expecting no crash",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("trace", type=Path, metavar="TRACE")
    add_lifecycle_arguments(s)
    s.add_argument("--runs", type=int, default=20, metavar="N", help="runs (default 20)")
    s.add_argument("--out", type=Path, default=None, metavar="DIR")
    add_policy_arguments(s)
    add_monitor_arguments(s)
    add_selection_arguments(s)
    s.set_defaults(func=cmd_soak)


async def _runs(env: Any, rows: list[int], out: Path, n: int, label: str) -> list[Any]:
    from replayer.bisect.trial import NotExercised

    results = []
    try:
        for i in range(n):
            res = await env.run(rows, out / f"{i + 1:03d}")
            if res.unexercised:
                raise NotExercised(res.unexercised)
            results.append(res)
            cls = f" [{res.failure_class}]" if res.failure_class else ""
            print(f"{label} {i + 1}/{n}: {res.outcome.value}{cls}", file=sys.stderr, flush=True)
    finally:
        await env.target.stop()
    return results


def _refuse(cmd: str, exc: Exception) -> int:
    from replayer.replay.run import EXIT_NOT_EXERCISED

    print(f"replayer {cmd}: NOT EXERCISED, refusing to count runs: {exc}", file=sys.stderr)
    return EXIT_NOT_EXERCISED


def _out_dir(given: Path | None, base: Path, prefix: str) -> Path:
    import datetime as dt

    from replayer.replay.run import prepare_out

    if given is not None:
        return prepare_out(given, False)
    return prepare_out(base / f"{prefix}-{dt.datetime.now():%Y%m%d-%H%M%S}", False)


def cmd_verify(args: argparse.Namespace) -> int:
    import asyncio

    import orjson

    from replayer.bisect.oracle import Outcome
    from replayer.bisect.stats import describe_rate
    from replayer.bisect.trial import Chase, TrialEnv
    from replayer.replay.policy import Mode, OnFailure, Order, ReplayPolicy, Timing
    from replayer.trace.reader import Trace

    d: Path = args.bundle
    try:
        manifest = orjson.loads((d / "manifest.json").read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UsageError(f"{d}: not a repro bundle (manifest.json: {exc})") from None
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    watch = watch_from(args)
    if watch is None:
        raise UsageError("verify classifies every run: it needs the monitor")
    plan = vary_plan(args)
    trace = Trace.open(d / "trace.arrow")
    p = manifest.get("policy") or {}
    policy = ReplayPolicy(
        timing=Timing(p.get("timing", "recorded")),
        order=Order(p.get("order", "strict")),
        speed=float(p.get("speed", 1.0)),
        max_inflight=p.get("max_inflight"),
        mode=Mode(p.get("mode", "verbatim")),
        force_stream=p.get("force_stream", True),
        model=p.get("model"),
        request_timeout=float(p.get("request_timeout", 1800.0)),
        on_failure=OnFailure.STOP,
    )
    sig = manifest.get("signature") or {}
    # a bundle written before signatures covered the exit has no log_hash:
    # its hash is one, and matches a new run's whatever the exit
    chase = Chase(
        failure_class=sig.get("class"),
        signature=sig.get("hash"),
        log_hash=sig.get("log_hash"),
        exit=sig.get("exit"),
    )
    rows = list(trace.order)
    trace.verify(rows)  # nothing is sent before the selection reads
    out = _out_dir(args.out, d, "verify")
    target, key = target_from(args, out / "server.log", trace.model_of(rows, policy.model))
    env = TrialEnv(
        trace=trace,
        policy=policy,
        target=target,
        watch=watch,
        reset=options.reset_mode(args.reset),
        api_key=key,
        chase=chase,
    )
    from replayer.bisect.trial import NotExercised

    try:
        results = asyncio.run(_runs(env, rows, out, args.runs, "run"))
    except NotExercised as exc:
        return _refuse("bundle verify", exc)
    counted = [r for r in results if r.outcome is not Outcome.INFRA]
    k = sum(r.outcome is Outcome.MATCH for r in counted)
    other = sum(r.outcome is Outcome.OTHER_FAILURE for r in counted)
    print(
        f"bundle {d}: {describe_rate(k, len(counted))}"
        + (f"; {other} other failure(s)" if other else "")
        + (
            f"; {len(results) - len(counted)} run(s) could not start"
            if len(counted) < len(results)
            else ""
        )
    )
    if not counted:
        return 3
    if plan is not None:
        from replayer.bisect.vary import run_plan, variant_envs, write_report

        report = asyncio.run(
            run_plan(
                plan,
                rows,
                out / "variants",
                variant_envs(env, args.url),
                policy=policy,
                chase=chase,
                key="bundle",
                control=(k, len(counted), "verify"),
                say=lambda msg: print(msg, file=sys.stderr, flush=True),
            )
        )
        write_report(out / "variants.json", report)
        print_variants(report)
    return 0 if k else 1


def cmd_soak(args: argparse.Namespace) -> int:
    import asyncio

    from replayer.bisect.oracle import Outcome
    from replayer.bisect.stats import describe_rate
    from replayer.bisect.trial import TrialEnv
    from replayer.replay.plan import select
    from replayer.trace.reader import Trace

    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    policy = policy_from(args)
    watch = watch_from(args)
    if watch is None:
        raise UsageError("soak classifies every run: it needs the monitor")
    trace = Trace.open(args.trace)
    rows = select(trace, limit=args.limit, sessions=args.sessions, requests=args.requests)
    trace.verify(rows)  # nothing is sent before the selection reads
    if not rows:
        raise UsageError("the selection is empty: nothing to replay")
    out = _out_dir(args.out, Path("runs"), "soak")
    target, key = target_from(args, out / "server.log", trace.model_of(rows, policy.model))
    env = TrialEnv(
        trace=trace,
        policy=policy,
        target=target,
        watch=watch,
        reset=options.reset_mode(args.reset),
        api_key=key,
    )
    from replayer.bisect.trial import NotExercised

    try:
        results = asyncio.run(_runs(env, rows, out, args.runs, "soak"))
    except NotExercised as exc:
        return _refuse("soak", exc)
    counted = [r for r in results if r.outcome is not Outcome.INFRA]
    crashes = [r for r in counted if r.outcome in (Outcome.MATCH, Outcome.OTHER_FAILURE)]
    print(f"soak {args.trace}: {describe_rate(len(crashes), len(counted))}")
    for r in crashes[:5]:
        sig = f" {r.signature.hash}" if r.signature else ""
        print(f"  crash: {r.failure_class}{sig}: {(r.message or '')[:160]}")
    if not counted:
        return 3
    return 1 if crashes else 0
