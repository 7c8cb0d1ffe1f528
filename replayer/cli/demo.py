"""``replayer demo``: the main job on the embedded default (``make demo``).

It starts the built-in vLLM emulator with a crash hidden in it (the engine
dies once a long context meets a busy batch, as on the MI355 reports), replays
the bundled agent trace ``traces/agents-8x10.arrow`` against it at 10x speed,
and shows the failure being caught: which request, what the client saw, every
request accounted for. Exit 0 when the crash was caught as expected.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

REPO_TRACES = Path(__file__).resolve().parents[2] / "traces"
DEMO_TRACE = REPO_TRACES / "agents-8x10.arrow"
DEMO_FAULT = "exit gpu=hsa when prompt_tokens>=15000 and running>=2"


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="crash the built-in emulator with a sample trace, catch it")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="where to write")
    p.add_argument("--trace", type=Path, default=DEMO_TRACE, help="trace to replay")
    p.add_argument("--fault", default=DEMO_FAULT, help="the emulator fault to hide")
    p.set_defaults(func=cmd_demo)


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    import shutil

    from replayer.monitor.watch import WatchConfig
    from replayer.replay.client import Target
    from replayer.replay.plan import select
    from replayer.replay.policy import ReplayPolicy
    from replayer.replay.run import replay_to_dir
    from replayer.replay.summary import render
    from replayer.testing.emulator import EmulatorProcess
    from replayer.trace.reader import Trace
    from replayer.trace.stats import inspect_trace

    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    trace = Trace.open(args.trace)
    info = inspect_trace(trace)
    _say(
        f"== trace {args.trace}: {info['requests']} requests, {info['sessions']} agent "
        f"sessions, context up to {info['input_tokens']['max']:,} tokens"
    )
    _say(f"== starting the vLLM emulator with a hidden fault: {args.fault!r}")
    emu_dir = out / "emulator"
    with EmulatorProcess(["--speed", "10", "--fault", args.fault], workdir=emu_dir) as emu:
        _say(f"   emulator ready at {emu.url} (log: {emu.log_path})")
        _say("== replaying at 10x recorded speed, strict trace order")
        rows = select(trace)
        policy = ReplayPolicy(speed=10.0, request_timeout=60.0)
        watch = WatchConfig(health_interval=0.5, scrape_interval=0.5, stall_timeout=20.0)
        outcome = asyncio.run(
            replay_to_dir(
                trace,
                rows,
                policy,
                [Target("emulator", emu.url)],
                out / "run",
                command=["replayer", "demo"],
                watch=watch,
                processes={"emulator": emu},
            )
        )
        code = emu.wait_exit(30)
    _say()
    _say(render(outcome.summary))
    t = outcome.summary["targets"].get("emulator", {})
    if not t.get("failed"):
        _say("\n!! the emulator survived: the fault was not reached (unexpected)")
        return 1
    f = t["failure"]
    _say(
        f"\n== caught: {f.get('class', f['kind'])}: the server failed on request "
        f"{f['request_id']} ({f['kind']}); it exited with code {code}, as single-API-server "
        "vLLM does after engine death"
    )
    if f.get("inflight"):
        _say(f"   in flight with it: {', '.join(f['inflight'])}")
    _say(f"   every request is accounted for: {t['status']}")
    _say(f"   results: {out / 'run' / 'results.arrow'}, summary: {out / 'run' / 'summary.json'}")
    _say(f"   server log: {emu_dir / 'server.log'}")
    return 0
