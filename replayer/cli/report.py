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
from pathlib import Path
from typing import Any

from replayer.errors import UsageError


def register(sub: Any) -> None:
    from replayer.cli.replay import (
        add_monitor_arguments,
        add_policy_arguments,
        add_selection_arguments,
        add_target_arguments,
    )

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
        description=_compare_doc(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories")
    add_compare_arguments(c)
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
        description=_sweep_doc(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",  # our --max-inflight N,N,... replaces the policy's
    )
    s.add_argument("trace", type=Path, metavar="TRACE")
    add_target_arguments(s)
    add_policy_arguments(s)
    s.add_argument(
        "--max-inflight", dest="sweep_values", required=True, metavar="N,N,...",
        help="concurrency limits, e.g. 1,2,4,8,16 (the first is the baseline)",
    )  # fmt: skip
    add_monitor_arguments(s)
    add_selection_arguments(s)
    add_compare_arguments(s)
    s.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="one run directory per value (DIR/inflight-N) and DIR/compare.json",
    )
    s.add_argument("--quiet", action="store_true", help="no live progress")
    s.set_defaults(func=cmd_sweep, max_inflight=None)


def _compare_doc() -> str:
    from replayer.analysis import compare

    return compare.__doc__ or ""


def _sweep_doc() -> str:
    from replayer.analysis import sweep

    return sweep.__doc__ or ""


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("comparison")
    g.add_argument("--json", action="store_true", help="print the comparison as JSON")
    g.add_argument(
        "--draws",
        type=int,
        default=2000,
        metavar="N",
        help="bootstrap draws per interval (default 2000)",
    )
    g.add_argument(
        "--level", type=float, default=0.95, metavar="L", help="confidence level (default 0.95)"
    )
    g.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    g.add_argument(
        "--min-effect",
        type=float,
        default=0.10,
        metavar="F",
        help="call a latency difference only when its interval excludes 1 and lies outside "
        "[1/(1+F), 1+F] (default 0.10: run-to-run wobbles under 10%% are not called; "
        "0: any that excludes 1)",
    )
    g.add_argument(
        "--slo", default=None, metavar="ttft=2s,itl=50ms,e2e=60s",
        help="goodput counts ok requests within these bounds (default: every ok request)",
    )  # fmt: skip


def _duration_ms(text: str) -> float:
    t = text.strip().lower()
    for suffix, mult in (("ms", 1.0), ("min", 60_000.0), ("m", 60_000.0), ("s", 1000.0)):
        if t.endswith(suffix):
            return float(t[: -len(suffix)]) * mult
    return float(t) * 1000.0


def options_from(args: argparse.Namespace) -> Any:
    from replayer.analysis.compare import CompareOptions, Slo

    if not 10 <= args.draws <= 100_000:
        raise UsageError("--draws must be between 10 and 100000")
    if not 0 < args.level < 1:
        raise UsageError("--level must be between 0 and 1")
    if args.min_effect < 0:
        raise UsageError("--min-effect must not be negative")
    bounds: dict[str, float] = {}
    if args.slo:
        for part in args.slo.split(","):
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep or key not in ("ttft", "itl", "e2e"):
                raise UsageError(f"--slo wants ttft=2s,itl=50ms,e2e=60s, not {args.slo!r}")
            try:
                bounds[f"{key}_ms"] = _duration_ms(value)
            except ValueError:
                raise UsageError(f"--slo {key}: not a duration: {value!r}") from None
    return CompareOptions(
        draws=args.draws, level=args.level, seed=args.seed, min_effect=args.min_effect,
        slo=Slo(**bounds),
    )  # fmt: skip


def _print(result: dict[str, Any], as_json: bool) -> None:
    import orjson

    from replayer.analysis.compare import render

    if as_json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render(result))


def cmd_report(args: argparse.Namespace) -> int:
    from replayer.analysis.report import write_report

    if not args.run.is_dir():
        raise UsageError(f"{args.run}: no such directory")
    out = args.output if args.output is not None else args.run / "report.html"
    path = write_report(args.run, out, force=args.force or args.output is None)
    print(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from replayer.analysis.compare import any_regression, compare_runs

    for r in args.runs:
        if not r.is_dir():
            raise UsageError(f"{r}: no such directory")
    result = compare_runs(args.runs, baseline=args.baseline, opts=options_from(args))
    _print(result, args.json)
    return 1 if args.fail_on_regression and any_regression(result) else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import asyncio

    from replayer.analysis.sweep import sweep
    from replayer.cli.replay import policy_from, targets_from, watch_from
    from replayer.replay.plan import select
    from replayer.trace.reader import Trace

    try:
        values = [int(v) for v in args.sweep_values.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--max-inflight wants N,N,..., not {args.sweep_values!r}") from None
    if len(values) < 2 or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise UsageError("--max-inflight wants two or more distinct values >= 1, e.g. 1,2,4,8")
    opts = options_from(args)
    policy = policy_from(args)
    watch = watch_from(args)
    targets = targets_from(args)
    if args.out.exists() and any(args.out.iterdir()):
        raise UsageError(f"{args.out} exists and is not empty: pick another --out")
    trace = Trace.open(args.trace)
    rows = select(trace, limit=args.limit, sessions=args.sessions, requests=args.requests)
    trace.verify(rows)  # nothing is sent before the selection reads
    if not rows:
        raise UsageError("the selection is empty: nothing to replay")
    args.out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(
        sweep(
            trace, rows, policy, targets, values, args.out, watch=watch,
            progress=not args.quiet, command=sys.argv, opts=opts,
            say=lambda m: print(m, file=sys.stderr, flush=True),
        )
    )  # fmt: skip
    if "unreachable" in result:
        print(f"replayer sweep: {result['unreachable']}", file=sys.stderr)
        return 3
    _print(result, args.json)
    print(f"sweep: {args.out}/compare.json", file=sys.stderr)
    return 0
