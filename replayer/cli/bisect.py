"""``replayer bisect``: minimize a crashing trace into a repro bundle.

Exit codes: 0 reduced and verified (bundle in OUT/bundle and
OUT/bundle.tar.gz), 1 not reproducible, 2 usage error, 3 budget exhausted
(the best bundle so far is written), 4 the full trace did not exercise the
server (most requests rejected as client errors: nothing to bisect), 5 the
result's confirm runs crashed less often than --min-rate (0.15): the bundle
is written and says so, but it is not a reproducer, 130 interrupted (the
best bundle so far and the --resume command are printed).

``--vary FILE|default`` (repeatable): once the repro is confirmed, relaunch
the server with each variant (arguments added or removed, environment set or
unset) and replay the repro ``--vary-runs`` times (5) on each: the table of
what makes the crash go away ends the output and opens the bundle's README.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_options, build
from replayer.cli.check import server_from


def register(sub: Any, argv: Sequence[str] = ()) -> None:
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
    p.add_argument(
        "--from-run",
        type=Path,
        default=None,
        metavar="RUN",
        help="start from a failed run: its launch command and crash signature",
    )
    add_options(p, "bisect")
    p.set_defaults(func=cmd_bisect)


def cmd_bisect(args: argparse.Namespace) -> int:
    from replayer import api

    given = args.launch is not None or args.url is not None or args.restart_cmd is not None
    pool = build(options.PoolOptions, args, "bisect")
    needed = args.from_run is None and pool.pool is None
    server = server_from(args, "bisect") if given or needed else None
    ctl = build(options.ControlOptions, args, "bisect").server(server)
    vary = build(options.VaryOptions, args, "bisect")
    try:
        res = api.bisect_sync(
            args.trace,
            server,
            args.out,
            build(options.BisectOptions, args, "bisect"),
            policy=build(options.ReplayPolicy, args, "bisect"),
            selection=build(options.Selection, args, "bisect"),
            watch=build(options.WatchConfig, args, "bisect"),
            signature=args.signature,
            control=ctl[1] if ctl else None,
            control_name=ctl[0] if ctl else "control",
            resume=args.resume,
            metrics=build(options.MetricsOptions, args, "bisect"),
            vary=vary.vary,
            vary_runs=vary.vary_runs,
            from_run=args.from_run,
            servers=pool.servers,
            gpus=pool.gpus,
            pool=pool.pool,
            control_pool=pool.control_pool,
        )
    except KeyboardInterrupt:
        print_interrupted(args.out)
        raise
    return print_result(res)


def print_interrupted(out: Path) -> None:
    """What an interrupted bisect leaves: its best bundle so far and the
    command that continues it (no finished trial is repeated)."""
    import shlex

    import orjson

    bundle = out / "bundle"
    try:
        m = orjson.loads((bundle / "manifest.json").read_bytes())
        what = f"{len(m.get('requests', ())):,} requests, {m.get('status', '?')}"
        print(f"best bundle so far: {bundle} ({what})", file=sys.stderr)
    except (OSError, ValueError):
        print(f"no bundle yet in {out} (no improvement was made)", file=sys.stderr)
    argv = ["replayer", *sys.argv[1:]]
    if "--resume" not in argv:
        argv.append("--resume")
    print(f"continue with: {shlex.join(argv)}", file=sys.stderr)


def print_result(res: Any) -> int:
    """What a bisect found, its rate, what else it met; its exit code."""
    from replayer.bisect.stats import describe_rate
    from replayer.bundle.export import bug_line
    from replayer.replay.run import EXIT_NOT_EXERCISED

    if res.status == "not_reproducible":
        return 1
    if res.status == "not_exercised":
        return EXIT_NOT_EXERCISED
    k, n = res.reproduction
    print(
        f"\nbisect {res.status}: {len(res.best.positions):,} of {res.selected:,} requests "
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
        print(f"other failures met ({len(res.other_failures)}), not the chased crash:")
        for bug in res.other_failures:
            print(f"  {bug_line(bug)}")
    if res.variants is not None:
        print_variants(res.variants)
    print(f"bundle: {res.bundle} (and {res.bundle}.tar.gz)")
    if res.signatures:
        from replayer.bundle.export import signature_line

        print("signatures seen:")
        for e in res.signatures:
            print(f"  {signature_line(e)}")
    if res.reliable is not None:
        r = res.reliable
        print(f"reliable candidate: {r['size']:,} requests, {r['reproduction']['text']}")
    if res.hand_over:
        print(f"hand over: {res.hand_over}")
    if res.status == "below_floor":
        print(f"below the floor of {res.floor:.0%}: not a reproducer (--min-rate sets the floor)")
        return 5
    return 3 if res.status == "budget_exhausted" else 0


def print_variants(report: Mapping[str, Any]) -> None:
    from replayer.bisect.vary import table

    src = report["control"].get("source")
    ctl = {"confirm": "the confirm runs", "verify": "the verify runs"}.get(src, "its own runs")
    print(f"\nwhat makes it go away ({report['runs']} run(s) per variant; control: {ctl}):")
    for line in table(report):
        print(f"  {line}")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
