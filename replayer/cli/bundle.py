"""``replayer bundle verify`` and ``replayer soak``: rates, not anecdotes.

``bundle verify DIR`` replays a repro bundle N times, under exactly the
policy its bisect found it with, against a server and reports how often the
bundle's crash reproduced: k/N with a 95% Wilson interval. Exit 0 if it
reproduced at least once and at least ``--min-rate`` of its runs (0.15),
1 if never (with the upper bound on its rate), 2 usage, 3 if the server
would not come up, 5 if it reproduced below the floor (not a reproducer).

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

``bundle diagnose DIR --launch CMD`` relaunches the server once per
diagnostic profile (``--profile default``: serialized kernels, AMD log level
4 and launch blocking on ROCm; launch blocking and compute-sanitizer, where
installed, on CUDA; or a TOML/JSON file, or ``default:NAME,...``), replays
the bundle once on each and writes the faulting kernel, file and line the
server logs name into the bundle's README ("Diagnosis") and manifest. Exit
0 if a kernel was named, 1 if none was, 3 if no profile could run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_options, add_spec, build
from replayer.cli.check import server_from

EXIT_NOT_EXERCISED = 4


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    p = sub.add_parser("bundle", help="work with repro bundles")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(p))
    v = verbs.add_parser(
        "verify",
        help="replay a bundle N times and report the crash rate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("bundle", type=Path, metavar="DIR")
    add_options(v, "verify")
    v.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the runs go (default DIR/verify-<timestamp>)",
    )
    v.set_defaults(func=cmd_verify)

    dg = verbs.add_parser(
        "diagnose",
        help="rerun a bundle under diagnostic settings and name the faulting kernel",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dg.add_argument("bundle", type=Path, metavar="DIR")
    for cls in (options.Server, options.Targets, options.WatchConfig):
        got = options.exposed(cls, "verify")
        if got:
            g = dg.add_argument_group(cls.__group__ or None)
            for spec in got:
                add_spec(g, spec)
    dg.add_argument(
        "--profile",
        dest="profiles",
        action="append",
        default=None,
        metavar="FILE|default|default:NAME,...",
        help="diagnostic profiles to run, each a relaunch (repeatable; default: default)",
    )
    dg.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the runs go (default DIR-diagnose-<timestamp> beside the bundle)",
    )
    dg.set_defaults(func=cmd_diagnose)

    s = sub.add_parser(
        "soak",
        help="verify a fix: N runs of a trace, expecting no crash",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("trace", type=Path, metavar="TRACE")
    add_options(s, "soak")
    s.add_argument("--out", type=Path, default=None, metavar="DIR")
    s.set_defaults(func=cmd_soak)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _refuse(cmd: str, why: str) -> int:
    print(f"replayer {cmd}: NOT EXERCISED, refusing to count runs: {why}", file=sys.stderr)
    return EXIT_NOT_EXERCISED


def cmd_verify(args: argparse.Namespace) -> int:
    from replayer import api

    vary = build(options.VaryOptions, args, "verify")
    res = api.verify_bundle_sync(
        args.bundle,
        server_from(args, "verify"),
        runs=args.runs,
        out=args.out,
        watch=build(options.WatchConfig, args, "verify"),
        vary=vary.vary,
        vary_runs=vary.vary_runs,
        say=_say,
    )
    return print_verify(res, args.bundle, args.min_rate)


EXIT_BELOW_FLOOR = 5
"""A bundle (or a bisect's result) that crashed, but in fewer of its runs
than the floor: not a reproducer."""


def print_verify(res: Any, bundle: Path, min_rate: float = 0.15) -> int:
    """A bundle's verified rate (and variants); ``bundle verify``'s exit code."""
    from replayer.bisect.stats import describe_rate

    if res.unexercised:
        return _refuse("bundle verify", res.unexercised)
    counted = res.counted
    print(
        f"bundle {bundle}: {describe_rate(res.matched, len(counted))}"
        + (f"; {res.other} other failure(s)" if res.other else "")
        + (f"; {res.infra} run(s) could not start" if res.infra else "")
    )
    if not counted:
        return 3
    if res.variants is not None:
        from replayer.cli.bisect import print_variants

        print_variants(res.variants)
    if not res.matched:
        return 1
    if res.matched / len(counted) < min_rate:
        print(
            f"bundle {bundle}: below the floor of {min_rate:.0%}: not a reproducer "
            "(--min-rate sets the floor)"
        )
        return EXIT_BELOW_FLOOR
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from replayer import api

    res = api.diagnose_bundle_sync(
        args.bundle,
        server_from(args, "verify"),
        tuple(args.profiles or ("default",)),
        out=args.out,
        watch=build(options.WatchConfig, args, "verify"),
        say=_say,
    )
    return print_diagnosis(res, args.bundle)


def print_diagnosis(res: Any, bundle: Path) -> int:
    """Each profile's line and the reading; ``bundle diagnose``'s exit code."""
    for r in res.rows:
        f = r.get("fault")
        if r.get("skipped"):
            print(f"  {r['name']}: skipped: {r['skipped']}")
            continue
        if f:
            named = f["kernel"] + (f" at {f['file']}:{f['line']}" if f.get("file") else "")
        print(f"  {r['name']}: {r['outcome']}; " + (named if f else "no kernel named"))
    print(f"bundle {bundle}: {res.reading}")
    print(f"  README: {bundle / 'README.md'}; runs: {res.out}")
    if not res.ran:
        return 3
    return 0 if res.fault else 1


def cmd_soak(args: argparse.Namespace) -> int:
    from replayer import api
    from replayer.bisect.stats import describe_rate

    res = api.soak_sync(
        args.trace,
        server_from(args, "soak"),
        build(options.ReplayPolicy, args, "soak"),
        runs=args.runs,
        selection=build(options.Selection, args, "soak"),
        out=args.out,
        watch=build(options.WatchConfig, args, "soak"),
        say=_say,
    )
    if res.unexercised:
        return _refuse("soak", res.unexercised)
    crashes = res.crashed
    print(f"soak {args.trace}: {describe_rate(len(crashes), len(res.counted))}")
    for r in crashes[:5]:
        sig = f" {r.signature.hash}" if r.signature else ""
        print(f"  crash: {r.failure_class}{sig}: {(r.message or '')[:160]}")
    if not res.counted:
        return 3
    return 1 if crashes else 0
