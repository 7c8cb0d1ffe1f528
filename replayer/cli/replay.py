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

from replayer import options
from replayer.cli.args import add_group
from replayer.errors import UsageError


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """The replay policy options, shared by replay, check, bisect and soak."""
    add_group(p, options.POLICY)


def add_monitor_arguments(p: argparse.ArgumentParser) -> None:
    add_group(p, options.WATCH)


def add_metrics_arguments(p: argparse.ArgumentParser) -> None:
    """``--metrics-port``: replayer's own live Prometheus metrics (replay, bisect, record)."""
    add_group(p, options.METRICS)


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
    return options.watch_config(vars(args))


def add_selection_arguments(p: argparse.ArgumentParser) -> None:
    add_group(p, options.SELECTION)


def selection_from(args: argparse.Namespace) -> options.Selection:
    return options.selection(vars(args))


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
    add_group(p, options.LAUNCHED_REPLAY)
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
    return options.replay_policy(vars(args))


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
    from replayer.replay.client import Endpoint

    if not args.target:
        raise UsageError("no target: pass --target [NAME=]URL")
    default_key = default_api_key(args)
    keys = {}
    for spec in args.target_key:
        name, sep, ref = spec.partition("=")
        if not sep:
            raise UsageError(f"--target-key wants NAME=env:VAR|file:PATH, not {spec!r}")
        keys[name] = read_key(ref, f"--target-key {name}")
    out: list[Endpoint] = []
    for spec in args.target:
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = "target" if len(args.target) == 1 else f"target{len(out)}", spec
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--target {spec!r}: the URL must start with http:// or https://")
        if any(t.name == name for t in out):
            raise UsageError(f"two targets are named {name!r}")
        out.append(Endpoint(name=name, url=url.rstrip("/"), api_key=keys.get(name, default_key)))
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
    trace.verify(rows)  # nothing is sent before the selection reads
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

    from replayer.bisect.trial import TrialEnv
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
    trace.verify(rows)  # nothing is sent before the selection reads
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
