"""``replayer replay``: a trace against one or more targets, side by side.

Exit codes: 0 every target survived, 1 a target failed, 2 usage or input
error, 3 a target was unreachable before the first request, 4 the trace did
not exercise a target (most requests were rejected as client errors).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from replayer.errors import UsageError


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """The replay policy options, shared by replay, check and bisect."""
    g = p.add_argument_group("policy")
    g.add_argument(
        "--timing",
        choices=("recorded", "gaps", "asap"),
        default="recorded",
        help="recorded: absolute recorded offsets and think gaps (default); "
        "gaps: closed loop on think gaps; asap: dependencies only",
    )
    g.add_argument(
        "--order",
        choices=("strict", "admitted", "session"),
        default="strict",
        help="strict: the server receives trace order (default); admitted: also wait for "
        "each stream's response headers, so the engine admits trace order; session: "
        "per session only",
    )
    g.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="divide recorded times by X (default 1)",
    )
    g.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        metavar="N",
        help="at most N requests in flight per target",
    )
    g.add_argument(
        "--mode",
        choices=("verbatim", "live"),
        default="verbatim",
        help="live: the target's replies replace recorded assistant turns (chat)",
    )
    g.add_argument(
        "--no-force-stream",
        dest="force_stream",
        action="store_false",
        help="send bodies' own stream flag instead of streaming with usage",
    )
    g.add_argument("--model", default=None, help="replace the model of every body")
    g.add_argument(
        "--skip-over-context",
        action="store_true",
        help="skip requests longer than the target's max_model_len (else sent)",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="bound on one request, seconds (default 1800: prefills are slow)",
    )
    g.add_argument(
        "--on-failure",
        choices=("stop", "continue"),
        default="stop",
        help="stop dispatching to a failed target (default) or keep going",
    )
    g.add_argument(
        "--session-header",
        default="X-Session-Id",
        metavar="NAME",
        help="header carrying the session id ('none' to omit)",
    )
    g.add_argument(
        "--token-range",
        default=None,
        metavar="LO:HI",
        help="token ids for blocks payloads, e.g. 1000:150000",
    )
    g.add_argument("--save-output", action="store_true", help="keep response texts in results")


def add_monitor_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("monitor")
    g.add_argument(
        "--health-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="poll /health every S seconds (default 1)",
    )
    g.add_argument(
        "--scrape-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="scrape /metrics every S seconds into RUN/metrics.arrow (default 2)",
    )
    g.add_argument(
        "--scrape",
        action="append",
        default=[],
        metavar="URL",
        help="also scrape this Prometheus endpoint (repeatable: node, GPU exporters)",
    )
    g.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="hang: no token progress for S seconds while /health stays 200 "
        "(pending prefills get S + tokens / --min-prefill-rate)",
    )
    g.add_argument(
        "--min-prefill-rate",
        type=float,
        default=1000.0,
        metavar="TOK_S",
        help="prefill tokens/s any healthy server beats (default 1000)",
    )
    g.add_argument(
        "--settle",
        type=float,
        default=10.0,
        metavar="S",
        help="after a failure, watch S seconds more before classifying (default 10)",
    )
    g.add_argument(
        "--grace",
        type=float,
        default=3.0,
        metavar="S",
        help="after the last request, watch S seconds more for a late crash (default 3)",
    )
    g.add_argument(
        "--no-monitor", action="store_true", help="no health polling, scraping or hang watchdog"
    )


def add_metrics_arguments(p: argparse.ArgumentParser) -> None:
    """``--metrics-port``: replayer's own live Prometheus metrics (replay, bisect, record)."""
    g = p.add_argument_group("live metrics (replayer's own, for Prometheus/Grafana)")
    g.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve replayer_* metrics on http://HOST:PORT/metrics while running "
        "(0: any free port; the URL is printed on stderr)",
    )
    g.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 for a remote Prometheus)",
    )


def start_metrics(args: argparse.Namespace) -> tuple[Any, Any]:
    """(LiveMetrics, MetricsServer) when ``--metrics-port`` was given, else (None, None)."""
    if getattr(args, "metrics_port", None) is None:
        return None, None
    from replayer.telemetry import LiveMetrics

    if not 0 <= args.metrics_port < 65536:
        raise UsageError(f"--metrics-port {args.metrics_port}: want 0..65535")
    live = LiveMetrics()
    try:
        server = live.serve(args.metrics_port, args.metrics_host)
    except OSError as exc:
        raise UsageError(
            f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc.strerror}"
        ) from None
    print(f"replayer: metrics on {server.url}", file=sys.stderr, flush=True)
    return live, server


def watch_from(args: argparse.Namespace) -> Any:
    from replayer.monitor.watch import WatchConfig

    if args.no_monitor:
        return None
    for name in ("health_interval", "scrape_interval", "stall_timeout", "min_prefill_rate"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if args.settle < 0 or args.grace < 0:
        raise UsageError("--settle and --grace must not be negative")
    for url in args.scrape:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--scrape {url!r}: want an http(s) URL")
    return WatchConfig(
        health_interval=args.health_interval,
        scrape_interval=args.scrape_interval,
        scrape=tuple(args.scrape),
        stall_timeout=args.stall_timeout,
        min_prefill_rate=args.min_prefill_rate,
        settle=args.settle,
        grace=args.grace,
    )


def add_selection_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("selection (ids, or inclusive 0-based ranges A..B)")
    g.add_argument("--limit", type=int, default=None, metavar="N", help="first N requests")
    g.add_argument("--sessions", default=None, metavar="SPEC", help="sessions by id or position")
    g.add_argument("--requests", default=None, metavar="SPEC", help="requests by id or position")


def add_target_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("targets (API keys come from the environment or files, never argv)")
    g.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="a server under test (repeatable)",
    )
    g.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="read the API key for every target from $VAR (default: $REPLAYER_API_KEY when set)",
    )
    g.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="read the API key for every target from a file",
    )
    g.add_argument(
        "--target-key",
        action="append",
        default=[],
        metavar="NAME=env:VAR|file:PATH",
        help="API key of one target",
    )


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace against one or more targets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    add_target_arguments(p)
    g = p.add_argument_group("launching the server (one target)")
    g.add_argument(
        "--launch",
        default=None,
        metavar="CMD",
        help="start the server with CMD, wait until ready, replay, stop it; its log "
        "goes to RUN/server.log and a crash gets a signature",
    )
    g.add_argument(
        "--ready-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="with --launch: seconds to wait for /health and /v1/models",
    )
    g.add_argument(
        "--keep-running",
        action="store_true",
        help="with --launch: leave the server running afterwards",
    )
    add_policy_arguments(p)
    add_monitor_arguments(p)
    add_selection_arguments(p)
    add_metrics_arguments(p)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="RUN",
        help="run directory (default runs/<timestamp>)",
    )
    p.add_argument("--force", action="store_true", help="reuse a non-empty --out")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.set_defaults(func=cmd_replay)


def policy_from(args: argparse.Namespace) -> Any:
    from replayer.replay.policy import Mode, OnFailure, Order, ReplayPolicy, Timing

    token_range = None
    if args.token_range:
        try:
            lo, hi = (int(x) for x in args.token_range.split(":"))
        except ValueError:
            raise UsageError(f"--token-range wants LO:HI, not {args.token_range!r}") from None
        token_range = (lo, hi)
    try:
        return ReplayPolicy(
            timing=Timing(args.timing),
            order=Order(args.order),
            speed=args.speed,
            max_inflight=args.max_inflight,
            mode=Mode(args.mode),
            force_stream=args.force_stream,
            model=args.model,
            skip_over_context=args.skip_over_context,
            request_timeout=args.request_timeout,
            on_failure=OnFailure(args.on_failure),
            session_header=None if args.session_header.lower() == "none" else args.session_header,
            token_range=token_range,
            save_output=args.save_output,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def read_key(spec: str, what: str) -> str:
    """A key from ``env:VAR`` or ``file:PATH``: keys never travel in argv."""
    kind, _, ref = spec.partition(":")
    if kind == "env":
        val = os.environ.get(ref)
        if val is None:
            raise UsageError(f"{what}: environment variable {ref} is not set")
        return val.strip()
    if kind == "file":
        try:
            return Path(ref).read_text().strip()
        except OSError as exc:
            raise UsageError(f"{what}: cannot read {ref}: {exc.strerror}") from None
    raise UsageError(f"{what}: want env:VAR or file:PATH, not {spec!r}")


def default_api_key(args: argparse.Namespace) -> str | None:
    """The key for every target: --api-key-file, --api-key-env, or $REPLAYER_API_KEY."""
    if args.api_key_file is not None:
        return read_key(f"file:{args.api_key_file}", "--api-key-file")
    if args.api_key_env:
        return read_key(f"env:{args.api_key_env}", "--api-key-env")
    if os.environ.get("REPLAYER_API_KEY"):
        return os.environ["REPLAYER_API_KEY"].strip()
    return None


def targets_from(args: argparse.Namespace) -> list[Any]:
    from replayer.replay.client import Target

    if not args.target:
        raise UsageError("no target: pass --target [NAME=]URL")
    default_key = default_api_key(args)
    keys = {}
    for spec in args.target_key:
        name, sep, ref = spec.partition("=")
        if not sep:
            raise UsageError(f"--target-key wants NAME=env:VAR|file:PATH, not {spec!r}")
        keys[name] = read_key(ref, f"--target-key {name}")
    out: list[Target] = []
    for spec in args.target:
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = "target" if len(args.target) == 1 else f"target{len(out)}", spec
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--target {spec!r}: the URL must start with http:// or https://")
        if any(t.name == name for t in out):
            raise UsageError(f"two targets are named {name!r}")
        out.append(Target(name=name, url=url.rstrip("/"), api_key=keys.get(name, default_key)))
    unknown = set(keys) - {t.name for t in out}
    if unknown:
        raise UsageError(f"--target-key for unknown target(s): {', '.join(sorted(unknown))}")
    return out


def cmd_replay(args: argparse.Namespace) -> int:
    import asyncio

    import orjson

    from replayer.replay.plan import select
    from replayer.replay.run import prepare_out, replay_to_dir
    from replayer.replay.summary import render
    from replayer.trace.reader import Trace

    policy = policy_from(args)
    watch = watch_from(args)
    if args.launch is not None:
        return _replay_launched(args, policy, watch)
    targets = targets_from(args)
    trace = Trace.open(args.trace)
    rows = select(trace, limit=args.limit, sessions=args.sessions, requests=args.requests)
    out = prepare_out(args.out, args.force)
    selection = {"limit": args.limit, "sessions": args.sessions, "requests": args.requests}
    live, server = start_metrics(args)
    try:
        outcome = asyncio.run(
            replay_to_dir(
                trace,
                rows,
                policy,
                targets,
                out,
                command=sys.argv,
                selection=selection,
                progress=not args.quiet,
                watch=watch,
                live=live,
            )
        )
    finally:
        if server is not None:
            server.close()
    if args.json:
        sys.stdout.write(orjson.dumps(outcome.summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif "unreachable" in outcome.summary:
        print(f"replayer replay: {outcome.summary['unreachable']}", file=sys.stderr)
    else:
        print(render(outcome.summary))
        print(f"run directory: {out}")
    _say_unexercised(outcome.summary)
    return outcome.exit_code


def _say_unexercised(summary: dict[str, Any]) -> None:
    from replayer.replay.summary import unexercised_text

    text = unexercised_text(summary)
    if text:
        print(f"replayer replay: NOT EXERCISED: {text}", file=sys.stderr)


def _replay_launched(args: argparse.Namespace, policy: Any, watch: Any) -> int:
    """``--launch``: the one target is a server we start, watch and stop."""
    import asyncio

    import orjson

    from replayer.minimize.trial import TrialEnv
    from replayer.replay.plan import select
    from replayer.replay.run import prepare_out
    from replayer.replay.summary import render
    from replayer.target.factory import make_target
    from replayer.trace.reader import Trace

    if len(args.target) > 1:
        raise UsageError("--launch runs one server: give at most one --target NAME=URL")
    if watch is None:
        raise UsageError("--launch watches the server it starts: drop --no-monitor")
    name, url = "target", None
    if args.target:
        t = targets_from(args)[0]
        name, url, key = t.name, t.url, t.api_key
    else:
        key = default_api_key(args)
    trace = Trace.open(args.trace)
    rows = select(trace, limit=args.limit, sessions=args.sessions, requests=args.requests)
    if not rows:
        raise UsageError("the selection is empty: nothing to replay")
    out = prepare_out(args.out, args.force)
    models = {trace.column("model")[r] for r in rows} - {None}
    model = policy.model or (next(iter(models)) if len(models) == 1 else None)
    target = make_target(
        launch=args.launch,
        url=url,
        log_path=out / "server.log",
        model=model,
        api_key=key,
        ready_timeout=args.ready_timeout,
    )

    live, server = start_metrics(args)

    async def go() -> Any:
        env = TrialEnv(
            trace=trace,
            policy=policy,
            target=target,
            watch=watch,
            name=name,
            api_key=key,
            live=live,
        )
        try:
            return await env.run(rows, out, progress=not args.quiet, command=sys.argv)
        finally:
            if not args.keep_running:
                await target.stop()

    try:
        res = asyncio.run(go())
    finally:
        if server is not None:
            server.close()
    if res.run is None:
        print(f"replayer replay: the server did not come up: {res.message}", file=sys.stderr)
        return 3
    summary = res.run.summary
    if res.signature is not None:
        summary["targets"][name]["failure"]["signature"] = res.signature.to_dict()
        (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    if args.json:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif "unreachable" in summary:
        print(f"replayer replay: {summary['unreachable']}", file=sys.stderr)
    else:
        print(render(summary))
        if res.signature is not None:
            print(f"  signature {res.signature.hash}: {res.signature.text}")
        print(f"run directory: {out}")
    _say_unexercised(summary)
    return int(res.run.exit_code)
