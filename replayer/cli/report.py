"""``replayer report``, ``replayer compare`` and ``replayer sweep``: looking at runs.

``report RUN`` writes one self-contained HTML file (plotly.js inlined, works
offline) for a run directory, a bisect directory or a bundle. ``compare``
puts targets or runs side by side with bootstrap confidence intervals on the
latency percentiles and output divergence; ``sweep`` replays a trace at
several ``--max-inflight`` values and compares them.

Exit codes: 0 done, 2 usage or input error; ``compare --fail-on-regression``
exits 1 when a latency is called slower, errors grew or a failure appeared;
``sweep`` exits 3 when a target was unreachable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayer import options
from replayer.cli.args import add_options, build

COMPARE_DOC = """\
Compare the targets of one run, or several runs (A/B), request by request:
latency percentiles (TTFT, ITL, E2E) with bootstrap confidence intervals on
their ratio, errors, goodput within an SLO, and output divergence. A
difference is called only when its interval excludes 1 and lies outside
[1/(1+F), 1+F] (--min-effect F).
"""

SWEEP_DOC = """\
One replay of the trace per --max-inflight value (each into OUT/inflight-N,
a complete run directory), then the comparison of them all against the first
value, in OUT/compare.json. The points run one after another against the same
server(s): the prefix cache carries over from one to the next.
"""


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    p = sub.add_parser(
        "report",
        help="an HTML report of a run, bisect or bundle (self-contained, offline)",
        description="Write one self-contained HTML report (plotly.js inlined; no network) of a "
        "run directory, a bisect directory or a bundle: session timeline, in-flight and server "
        "gauges, latency distributions, schedule lag, summary, and the bisect search.",
    )
    p.add_argument("run", type=Path, metavar="RUN", help="run, bisect or bundle directory")
    p.add_argument(
        "-o", "--output", type=Path, default=None, metavar="HTML",
        help="where to write (default RUN/report.html)",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="overwrite an existing -o file")
    p.set_defaults(func=cmd_report)

    c = sub.add_parser(
        "compare",
        help="compare targets of a run, or runs (A/B), with confidence intervals",
        description=COMPARE_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories")
    add_options(c, "compare")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.add_argument("--baseline", default=None, metavar="LABEL", help="config to compare against "
                   "(a run directory name or target name; default the first)")  # fmt: skip
    c.add_argument(
        "--fail-on-regression", action="store_true",
        help="exit 1 when a latency is slower, errors grew or a failure appeared",
    )  # fmt: skip
    c.set_defaults(func=cmd_compare)

    s = sub.add_parser(
        "sweep",
        help="replay a trace at several --max-inflight values and compare them",
        description=SWEEP_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("trace", type=Path, metavar="TRACE")
    add_options(s, "sweep")
    s.add_argument("--json", action="store_true", help="print the comparison as JSON")
    s.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="one run directory per value (DIR/inflight-N) and DIR/compare.json",
    )
    s.add_argument("--quiet", action="store_true", help="no live progress")
    s.set_defaults(func=cmd_sweep)


def _print(result: dict[str, Any], as_json: bool) -> None:
    import orjson

    from replayer.analysis.compare import render

    if as_json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render(result))


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_report(args: argparse.Namespace) -> int:
    from replayer import api

    path = api.report(args.run, args.output, force=args.force)
    print(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from replayer import api
    from replayer.analysis.compare import any_regression

    result = api.compare(
        args.runs, baseline=args.baseline, options=build(options.CompareOptions, args, "compare")
    )
    _print(result, args.json)
    return 1 if args.fail_on_regression and any_regression(result) else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from replayer import api

    sweep = build(options.SweepOptions, args, "sweep")
    assert sweep.limits is not None
    result = api.sweep_sync(
        args.trace,
        build(options.Targets, args, "sweep").endpoints(),
        sweep.limits,
        args.out,
        build(options.ReplayPolicy, args, "sweep"),
        selection=build(options.Selection, args, "sweep"),
        watch=build(options.WatchConfig, args, "sweep"),
        options=build(options.CompareOptions, args, "sweep"),
        progress=not args.quiet,
        command=sys.argv,
        say=_say,
    )
    if "unreachable" in result:
        print(f"replayer sweep: {result['unreachable']}", file=sys.stderr)
        return 3
    _print(result, args.json)
    print(f"sweep: {args.out}/compare.json", file=sys.stderr)
    return 0
