"""``replayer bisect``: minimize a crashing trace into a repro bundle.

Exit codes: 0 reduced and verified (bundle in OUT/bundle and
OUT/bundle.tar.gz), 1 not reproducible, 2 usage error, 3 budget exhausted
(the best bundle so far is written), 4 the full trace did not exercise the
server (most requests rejected as client errors: nothing to bisect).

``--vary FILE|default`` (repeatable): once the repro is confirmed, relaunch
the server with each variant (arguments added or removed, environment set or
unset) and replay the repro ``--vary-runs`` times (5) on each: the table of
what makes the crash go away ends the output and opens the bundle's README.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_group
from replayer.cli.check import add_lifecycle_arguments, target_from
from replayer.cli.replay import (
    add_metrics_arguments,
    add_monitor_arguments,
    add_policy_arguments,
    add_selection_arguments,
    policy_from,
    read_key,
    start_metrics,
    watch_from,
)
from replayer.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bisect",
        help="minimize a crashing trace to a repro bundle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="bisect directory: journal, trials, bundle",
    )
    p.add_argument("--resume", action="store_true", help="continue a stopped bisect in DIR")
    add_lifecycle_arguments(p)
    p.add_argument(
        "--from-run",
        type=Path,
        default=None,
        metavar="RUN",
        help="start from a failed run: its launch command and crash signature",
    )
    add_group(p, options.SEARCH)
    add_group(p, options.CONTROL)
    add_policy_arguments(p)
    add_monitor_arguments(p)
    add_selection_arguments(p)
    add_metrics_arguments(p)
    add_vary_arguments(p)
    p.set_defaults(func=cmd_bisect)


def add_vary_arguments(p: argparse.ArgumentParser) -> None:
    """``--vary`` and ``--vary-runs`` (bisect and bundle verify)."""
    g = p.add_argument_group("what makes it go away")
    g.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="FILE|default",
        help="server variants to replay the repro under (repeatable): a TOML "
        "([[variant]] name, add, remove, env, unset_env) or JSON file, 'default' for "
        "the shipped vLLM list, or 'default:NAME,NAME' for some of it; needs --launch",
    )
    g.add_argument(
        "--vary-runs",
        type=int,
        default=None,
        metavar="N",
        help="runs of each variant (default 5)",
    )


def vary_plan(args: argparse.Namespace) -> Any:
    """The variants ``--vary`` asks for, applied to ``--launch`` (None without
    ``--vary``): bad files and launches fail here, before any run."""
    if not args.vary:
        if args.vary_runs is not None:
            raise UsageError("--vary-runs needs --vary")
        return None
    if args.launch is None:
        raise UsageError(
            "--vary relaunches the server with each variant: give --launch CMD "
            "(a server given by --target/--url or --restart-cmd cannot be changed)"
        )
    from replayer.bisect.vary import DEFAULT_RUNS, make_plan

    runs = DEFAULT_RUNS if args.vary_runs is None else args.vary_runs
    return make_plan(args.vary, args.launch, runs)


def print_variants(report: dict[str, Any]) -> None:
    from replayer.bisect.vary import table

    src = report["control"].get("source")
    ctl = {"confirm": "the confirm runs", "verify": "the verify runs"}.get(src, "its own runs")
    print(f"\nwhat makes it go away ({report['runs']} run(s) per variant; control: {ctl}):")
    for line in table(report):
        print(f"  {line}")


def _from_run(args: argparse.Namespace) -> dict[str, Any]:
    import orjson

    run = args.from_run
    try:
        info = orjson.loads((run / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UsageError(f"--from-run {run}: not a run directory ({exc})") from None
    summary = {}
    if (run / "summary.json").exists():
        summary = orjson.loads((run / "summary.json").read_bytes())
    failed = [t for t in summary.get("targets", {}).values() if t.get("failed")]
    if not failed:
        raise UsageError(f"--from-run {run}: that run did not fail; nothing to chase")
    sig = None
    if (run / "signature.json").exists():
        sig = orjson.loads((run / "signature.json").read_bytes())
    return {"launch": info.get("launch"), "failure": failed[0]["failure"], "signature": sig}


def cmd_bisect(args: argparse.Namespace) -> int:
    import asyncio

    from replayer.bisect.pipeline import Bisect, Control, run_bisect
    from replayer.bisect.trial import OWNER_ENV, Chase, TrialEnv, owner_token, reap_orphan
    from replayer.monitor.signature import compile_signature_regex
    from replayer.replay.plan import select
    from replayer.target.factory import make_target
    from replayer.trace.reader import Trace

    policy = policy_from(args)
    watch = watch_from(args)
    if watch is None:
        raise UsageError("bisect classifies every trial: it needs the monitor (drop --no-monitor)")
    search = options.bisect_options(vars(args))
    chase = Chase(regex=compile_signature_regex(args.signature) if args.signature else None)
    seed: dict[str, Any] = {}
    if args.from_run is not None:
        seed = _from_run(args)
        if args.launch is None and args.restart_cmd is None and seed.get("launch"):
            args.launch = seed["launch"]
        if chase.regex is None and seed.get("signature"):
            s = seed["signature"]
            chase = Chase(
                failure_class=s.get("failure_class"),
                signature=s.get("hash"),
                log_hash=s.get("log_hash"),
                exit=s.get("exit"),
            )
        elif chase.regex is None:
            chase = Chase(failure_class=seed["failure"].get("class"))
    if args.launch is None and args.restart_cmd is None:
        raise UsageError(
            "bisect restarts the server after every crash: give --launch CMD or "
            "--restart-cmd CMD --url URL (or --from-run a run made with --launch)"
        )
    plan = vary_plan(args)
    out: Path = args.out
    journal = out / "journal.jsonl"
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise UsageError(
            f"{out} exists and is not empty: --resume to continue it, or pick another --out"
        )
    if args.resume and not journal.exists():
        raise UsageError(f"--resume: {out} holds no journal.jsonl")
    out.mkdir(parents=True, exist_ok=True)
    trace = Trace.open(args.trace)
    rows = select(trace, limit=args.limit, sessions=args.sessions, requests=args.requests)
    trace.verify(rows)  # nothing is sent before the selection reads
    if not rows:
        raise UsageError("the selection is empty: nothing to bisect")
    model = trace.model_of(rows, policy.model)
    # launched servers carry this bisect's mark so a resume can reap one a kill orphaned
    owner = {OWNER_ENV: owner_token(out)}
    target, key = target_from(args, out / "server.log", model, marks=owner)
    live, server = start_metrics(args)
    env = TrialEnv(
        trace=trace,
        policy=policy,
        target=target,
        watch=watch,
        reset=options.reset_mode(args.reset),
        api_key=key,
        chase=chase,
        pidfile=out / "server.pid",
        live=live,
    )
    if args.resume and reap_orphan(out / "server.pid"):
        print("bisect: stopped the server a killed bisect left running", file=sys.stderr)
    control = None
    if args.control_key and not (args.control or args.control_launch):
        raise UsageError("--control-key needs --control or --control-launch")
    if args.control or args.control_launch:
        name, url = "control", None
        if args.control:
            name, sep, url = args.control.partition("=")
            if not sep:
                name, url = "control", args.control
        ctl_key = read_key(args.control_key, "--control-key") if args.control_key else key
        ctl_target = make_target(
            launch=args.control_launch,
            url=url,
            log_path=out / "control-server.log",
            model=model,
            api_key=ctl_key,
            ready_timeout=args.ready_timeout,
        )
        control = Control(
            name,
            TrialEnv(
                trace=trace,
                policy=policy,
                target=ctl_target,
                watch=watch,
                reset=options.reset_mode(args.reset),
                api_key=ctl_key,
                name=name,
                live=live,
            ),
        )
    opts = search
    holder: list[Bisect] = []

    async def go() -> Any:
        facts: dict[str, Any] = {
            "launch": args.launch,
            "restart_cmd": args.restart_cmd,
            "url": target.url,
        }
        b = Bisect(trace, rows, env, out, opts, control=control, facts=facts)
        if plan is not None:
            from replayer.bisect.vary import bisect_hook, variant_envs

            b.vary = bisect_hook(plan, variant_envs(env, args.url))
        holder.append(b)
        if live is not None:
            live.attach_bisect(b)
        try:
            await env.prepare()
            got = await target.facts()
            facts.update({k: v for k, v in got.to_dict().items() if v})
        except Exception as exc:  # facts are a courtesy; the trials report real failures
            facts["facts_error"] = str(exc)[:300]
        return await run_bisect(b)

    try:
        res = asyncio.run(go())
    finally:
        if server is not None:
            server.close()
    if res.status == "not_reproducible":
        return 1
    if res.status == "not_exercised":
        from replayer.replay.run import EXIT_NOT_EXERCISED

        return EXIT_NOT_EXERCISED
    k, n = res.reproduction
    from replayer.bisect.stats import describe_rate

    print(
        f"\nbisect {res.status}: {len(res.best.positions):,} of {len(rows):,} requests "
        f"({res.best.timing}, speed {res.best.speed:g}) in {res.trials} trials"
    )
    if n:
        print(f"reproduction: {describe_rate(k, n)}")
    if res.control is not None:
        print(f"control: {describe_rate(*res.control)}")
    if res.signature is not None:
        print(f"signature {res.signature.hash}: {res.signature.text}")
    if res.shrink is not None:
        print(f"shrunk: {res.shrink['text']}")
    if res.other_failures:
        from replayer.bundle.export import bug_line

        print(f"other failures met ({len(res.other_failures)}), not the chased crash:")
        for bug in res.other_failures:
            print(f"  {bug_line(bug)}")
    if holder and holder[0].variants is not None:
        print_variants(holder[0].variants)
    print(f"bundle: {res.bundle} (and {res.bundle}.tar.gz)")
    return 3 if res.status == "budget_exhausted" else 0
