"""``replayer bisect``: minimize a crashing trace into a repro bundle.

Exit codes: 0 reduced and verified (bundle in OUT/bundle and
OUT/bundle.tar.gz), 1 not reproducible, 2 usage error, 3 budget exhausted
(the best bundle so far is written), 4 the full trace did not exercise the
server (most requests rejected as client errors: nothing to bisect).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from replayer.cli.check import add_lifecycle_arguments, target_from, trace_model
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


def _duration(text: str) -> float:
    mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in mult:
            return float(text[:-1]) * mult[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want seconds or 30m/2h/1d, not {text!r}") from None


def register(sub: Any) -> None:
    from replayer.minimize.pipeline import STAGES

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
    g = p.add_argument_group("search")
    g.add_argument(
        "--stages",
        default=",".join(STAGES),
        metavar="LIST",
        help=f"stages to run (default {','.join(STAGES)})",
    )
    g.add_argument(
        "--signature",
        default=None,
        metavar="REGEX",
        help="chase crashes whose signature text matches (default: the first crash)",
    )
    g.add_argument(
        "--calibrate",
        type=int,
        default=5,
        metavar="N",
        help="calibration stops after N matching crashes (default 5)",
    )
    g.add_argument(
        "--calibrate-runs",
        type=int,
        default=10,
        metavar="N",
        help="... or after N runs (default 10)",
    )
    g.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="risk of dismissing a crashing candidate (default 0.05)",
    )
    g.add_argument(
        "--confirm",
        type=int,
        default=10,
        metavar="N",
        help="runs of the final repro to measure its rate (default 10)",
    )
    g.add_argument("--max-trials", type=int, default=None, metavar="N")
    g.add_argument(
        "--max-time",
        type=_duration,
        default=None,
        metavar="T",
        help="wall-clock budget: seconds, or 30m, 2h, 1d",
    )
    g = p.add_argument_group("control (the platform that runs clean)")
    g.add_argument(
        "--control", default=None, metavar="NAME=URL", help="replay the final repro here too"
    )
    g.add_argument(
        "--control-launch", default=None, metavar="CMD", help="start the control server with CMD"
    )
    g.add_argument(
        "--control-key",
        default=None,
        metavar="env:VAR|file:PATH",
        help="the control's API key (default: the target's)",
    )
    add_policy_arguments(p)
    add_monitor_arguments(p)
    add_selection_arguments(p)
    add_metrics_arguments(p)
    p.set_defaults(func=cmd_bisect)


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

    from replayer.minimize.pipeline import STAGES, Bisect, BisectOptions, Control, run_bisect
    from replayer.minimize.trial import OWNER_ENV, Chase, TrialEnv, owner_token, reap_orphan
    from replayer.monitor.signature import compile_signature_regex
    from replayer.replay.plan import select
    from replayer.target.base import reset_mode
    from replayer.target.factory import make_target
    from replayer.trace.reader import Trace

    policy = policy_from(args)
    watch = watch_from(args)
    if watch is None:
        raise UsageError("bisect classifies every trial: it needs the monitor (drop --no-monitor)")
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise UsageError(f"unknown stage(s) {', '.join(bad)}; stages are {', '.join(STAGES)}")
    if args.calibrate < 1 or args.calibrate_runs < 1 or args.confirm < 0:
        raise UsageError("--calibrate and --calibrate-runs must be >= 1, --confirm >= 0")
    if not 0 < args.alpha < 1:
        raise UsageError("--alpha must be between 0 and 1")
    chase = Chase(regex=compile_signature_regex(args.signature) if args.signature else None)
    seed: dict[str, Any] = {}
    if args.from_run is not None:
        seed = _from_run(args)
        if args.launch is None and args.restart_cmd is None and seed.get("launch"):
            args.launch = seed["launch"]
        if chase.regex is None and seed.get("signature"):
            s = seed["signature"]
            chase = Chase(failure_class=s.get("failure_class"), signature=s.get("hash"))
        elif chase.regex is None:
            chase = Chase(failure_class=seed["failure"].get("class"))
    if args.launch is None and args.restart_cmd is None:
        raise UsageError(
            "bisect restarts the server after every crash: give --launch CMD or "
            "--restart-cmd CMD --url URL (or --from-run a run made with --launch)"
        )
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
    if not rows:
        raise UsageError("the selection is empty: nothing to bisect")
    model = trace_model(trace, rows, policy.model)
    # launched servers carry this bisect's mark so a resume can reap one a kill orphaned
    owner = {OWNER_ENV: owner_token(out)}
    target, key = target_from(args, out / "server.log", model, marks=owner)
    live, server = start_metrics(args)
    env = TrialEnv(
        trace=trace,
        policy=policy,
        target=target,
        watch=watch,
        reset=reset_mode(args.reset),
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
                reset=reset_mode(args.reset),
                api_key=ctl_key,
                name=name,
                live=live,
            ),
        )
    opts = BisectOptions(
        stages=stages,
        calibrate_matches=args.calibrate,
        calibrate_runs=args.calibrate_runs,
        confirm=args.confirm,
        alpha=args.alpha,
        max_trials=args.max_trials,
        max_time=args.max_time,
    )

    async def go() -> Any:
        facts: dict[str, Any] = {
            "launch": args.launch,
            "restart_cmd": args.restart_cmd,
            "url": target.url,
        }
        b = Bisect(trace, rows, env, out, opts, control=control, facts=facts)
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
    from replayer.minimize.stats import describe_rate

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
    print(f"bundle: {res.bundle} (and {res.bundle}.tar.gz)")
    return 3 if res.status == "budget_exhausted" else 0
