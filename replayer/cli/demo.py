"""``replayer demo``: the whole story on the built-in emulator (``make demo``).

1. Start the vLLM emulator with a crash hidden in it: the engine dies (a HSA
   memory-access fault, as on MI355) when a long request gets a large
   prefix-cache hit, which only happens on a later turn of a long session.
2. Replay the bundled agent trace (``traces/agents-8x10.arrow``, 80
   requests in 8 sessions) against it at 20x speed: the crash is caught,
   classified and signed from the server log.
3. Bisect: restart the server for every trial and shrink the trace to the
   smallest one that still crashes the same way, then the requests inside
   it to the threshold (how many prompt tokens, how much decode).
4. Verify the bundle against a healthy emulator as the control platform,
   then relaunch the faulty one under a few server variants (prefix caching
   off, chunked prefill off): the crash needs a prefix-cache hit, and the
   table says so. Print where the bundle is and what it says.
"""

from __future__ import annotations

import argparse
import shlex
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayer.samples import sample_trace

DEMO_TRACE = sample_trace("agents-8x10.arrow")
DEMO_FAULT = "exit gpu=hsa after=0.3 when cached_tokens>=14000 and prompt_tokens>=18000"


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    p = sub.add_parser(
        "demo",
        help="crash the built-in emulator, bisect the trace, bundle it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=None, help="where to write (runs/demo[-vllm])")
    p.add_argument("--trace", type=Path, default=DEMO_TRACE, help="trace to replay")
    p.add_argument("--fault", default=DEMO_FAULT, help="the emulator fault to hide")
    p.add_argument(
        "--vllm",
        action="store_true",
        help="the same story on a real vLLM (the CPU build, installed once into the "
        "user's cache) with the crash plugin; a few minutes",
    )
    p.set_defaults(func=cmd_demo)


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _emulator(fault: str | None) -> str:
    args = [
        sys.executable,
        "-m",
        "replayer.emulator",
        "--port",
        str(_port()),
        "--speed",
        "10",
        "--enable-prompt-tokens-details",
    ]
    if fault:
        args += ["--fault", fault]
    return shlex.join(args)


def cmd_demo(args: argparse.Namespace) -> int:
    import shutil

    from replayer import api
    from replayer.bisect.stats import describe_rate, fisher_one_sided
    from replayer.options import BisectOptions, ReplayPolicy, Server, WatchConfig
    from replayer.replay.summary import render

    if args.vllm:
        from replayer.cli.demo_vllm import demo_vllm

        args.out = args.out or Path("runs/demo-vllm")
        return demo_vllm(args)
    args.out = args.out or Path("runs/demo")

    t_start = time.monotonic()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    info = api.inspect(args.trace)
    policy = ReplayPolicy(speed=20.0, request_timeout=60.0)
    watch = WatchConfig(
        health_interval=0.2, scrape_interval=0.5, stall_timeout=20.0, settle=3.0, grace=1.0
    )
    faulty = _emulator(args.fault)

    _say(
        f"== 1. the trace: {args.trace.name}, {info['requests']} requests in "
        f"{info['sessions']} agent sessions, contexts up to {info['input_tokens']['max']:,} "
        "tokens"
    )
    _say(f"   the emulator hides a fault: {args.fault!r}")
    _say("== 2. replay at 20x recorded speed against it")
    first = api.replay_sync(
        args.trace,
        server=Server(launch=faulty),
        policy=policy,
        watch=watch,
        out=out / "replay",
        progress=True,
        command=["replayer", "demo"],
    )
    if first.failure is None:
        _say("!! the emulator did not crash: the fault was not reached (unexpected)")
        return 1
    _say(render(dict(first.summary)))
    sig = first.failure.signature
    _say(f"   caught: {first.failure.failure_class}; signature {sig.hash if sig else '-'}")
    if sig is not None:
        _say(f"   {sig.text}")

    _say("\n== 3. bisect: a fresh server for every trial, the shortest crashing trace")
    bdir = out / "bisect"
    # five runs: 0/5 is the fewest whose upper bound (45%) clears a 5/5 control's 57%
    res = api.bisect_sync(
        args.trace,
        Server(launch=faulty),
        bdir,
        BisectOptions(calibrate_matches=3, calibrate_runs=5, confirm=5),
        policy=policy,
        watch=watch,
        control=Server(launch=_emulator(None)),
        control_name="healthy-emulator",
        vary=["default:no-prefix-caching,no-chunked-prefill"],
        vary_runs=5,
        say=_say,
    )
    if res.status != "complete" or res.bundle is None:
        _say(f"!! bisect ended {res.status}")
        return 1
    k, n = res.reproduction
    _say("\n== 4. the repro bundle")
    _say(
        f"   {len(res.requests)} of {res.selected} requests crash the server the same way: "
        + ", ".join(res.requests)
    )
    _say(f"   found in {res.trials} trials; replay {res.best.timing} at {res.best.speed:g}x")
    if res.shrink is not None:
        _say(f"   shrunk inside: {res.shrink['text']}")
    _say(f"   faulty emulator: {describe_rate(k, n)}")
    if res.control is not None:
        pval = fisher_one_sided(k, n, *res.control)
        _say(
            f"   healthy emulator (control): {describe_rate(*res.control)}; "
            f"p = {pval:.3g} (Fisher exact, one-sided)"
        )
    if res.variants is not None:
        from replayer.bisect.vary import table

        _say("   what makes it go away (the faulty emulator relaunched per variant):")
        for line in table(res.variants):
            _say(f"     {line}")
    _say(f"   bundle: {res.bundle}  (and {res.bundle}.tar.gz)")
    _say(f"   reproduce anywhere: python3 {res.bundle / 'repro.py'} --url http://HOST:PORT")
    _say("\n== 5. look at it (offline HTML: timeline, server gauges, the bisect search)")
    _say(f"   {api.report(out / 'replay')}")
    _say(f"   {api.report(bdir)}")
    _say(f"\ndemo finished in {time.monotonic() - t_start:.0f} s")
    return 0
