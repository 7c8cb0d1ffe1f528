"""The process that runs one service job: ``python -m replayer.cli.worker JOBDIR``.

Why a child process per job rather than a task in ``serve``'s event loop:

* **Isolation.** A job that crashes, leaks, or takes a native library
  down with it ends its own process; the service answers the next request.
* **Responsiveness.** A replay builds long bodies, parses streams and writes
  Arrow; a bisect does that for every trial. In a separate process that
  work never delays an API answer (the API's p99 is measured in bench/).
* **Cancellation.** SIGTERM is turned into the CLI's Ctrl-C: the command's
  ``finally`` blocks stop the servers it launched, the journal keeps every
  finished trial. If the command has not ended ``$REPLAYER_WORKER_STOP_GRACE``
  seconds later, the worker kills its own children's process groups (the
  servers it launched) and exits, before ``serve`` would have to SIGKILL it
  and orphan them.
* **Exactly the CLI.** The worker builds the declared option objects
  (:mod:`replayer.options`) from the job's spec and calls the same
  :mod:`replayer.api` verb the command line calls, printing what the command
  prints, so a job behaves exactly as the same command typed in a shell:
  defaults, validation, exit codes, ``--resume``. A bisect on a pool gets
  the pool file the scheduler wrote for it (the servers it holds) as its
  ``pool`` option. It lives in ``cli``
  because it is a front end: the service starts it by module name, never
  imports it. (A job queued by an older ``serve``, with a command line and
  no spec, runs that command line.)

The worker dies with ``serve`` (Linux ``PR_SET_PDEATHSIG``): a job never
outlives the service that accounts for it. After a restart ``serve`` resumes
a bisect from its journal (``--resume`` also reaps the server the dead
worker left) and marks a replay interrupted.

At the end it renders the run's HTML report through
:mod:`replayer.service.hooks`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

PR_SET_PDEATHSIG = 1
EXIT_INTERRUPTED = 130


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    expected = os.environ.get("REPLAYER_SERVE_PID")
    if expected and os.getppid() != int(expected):
        # serve died between fork and prctl: nobody would account for us
        sys.exit(130)


_escalation: threading.Timer | None = None


def _children() -> list[int]:
    """Our direct children (launched servers, restart commands), from /proc."""
    me = os.getpid()
    out: list[int] = []
    if not os.path.isdir("/proc"):
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: ppid follows the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me:
            out.append(int(entry))
    return out


def _hard_stop() -> None:
    """The graceful stop did not finish in time: kill what we started, then
    ourselves. A launched server runs in its own process group; killing the
    group takes its engine workers with it."""
    for pid in _children():
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    print("replayer worker: stop grace over: killed its servers and exited", flush=True)
    os._exit(EXIT_INTERRUPTED)


def _terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    # asyncio.run treats SIGINT as "cancel the main task", so the command's
    # cleanup (stopping launched servers) runs as it does on Ctrl-C. A command
    # that does not stop in time (a replay stuck on a hung server may not
    # notice the cancellation) is stopped hard, servers included, so serve's
    # SIGKILL never has to orphan them.
    #
    # Only the first SIGTERM acts. PR_SET_PDEATHSIG fires once per thread of
    # the dead serve as the worker is handed from one to the next, so one
    # SIGKILLed serve sends several within milliseconds; a second SIGINT would
    # make asyncio raise KeyboardInterrupt in the middle of the clean-up and
    # the replay's results would never be closed (seen: an empty results.arrow).
    global _escalation
    if _escalation is not None:
        return
    grace = float(os.environ.get("REPLAYER_WORKER_STOP_GRACE", "20"))
    _escalation = threading.Timer(grace, _hard_stop)
    _escalation.daemon = True
    _escalation.start()
    signal.raise_signal(signal.SIGINT)


def run(job_dir: Path) -> int:
    state = orjson.loads((job_dir / "state.json").read_bytes())
    kind: str = state["kind"]
    os.chdir(job_dir)
    spec = state.get("spec")
    if spec is None:
        # queued by a serve from before job specs: its command line, as it was
        from replayer.cli import main

        argv: list[str] = state["argv"]
        sys.argv = ["replayer", *argv]
        code = main(argv)
    else:
        code = _guarded(kind, spec)
    if kind in ("replay", "bisect"):
        from replayer.service.hooks import write_report

        out = job_dir / "out"
        write_report(out, out / "report.html")
    return code


def _guarded(kind: str, spec: dict[str, Any]) -> int:
    """:func:`run_spec` with the command line's error handling: one line, exit 2."""
    from replayer.cli import install_signals
    from replayer.cli.args import flag_words
    from replayer.errors import ReplayerError

    install_signals("bundle" if kind == "verify" else kind)
    try:
        return run_spec(spec)
    except ReplayerError as exc:
        name = "bundle verify" if kind == "verify" else kind
        print(f"replayer {name}: error: {flag_words(exc)}", file=sys.stderr, flush=True)
        return exc.exit_code


def _server(conf: dict[str, Any], **extra: Any) -> Any:
    from replayer.options import ResetMode, Server

    key = os.environ.get(conf["api_key_env"]) if conf.get("api_key_env") else None
    return Server(
        launch=conf.get("launch"),
        url=conf.get("url"),
        restart_cmd=conf.get("restart_cmd"),
        log_cmd=conf.get("log_cmd"),
        ready_timeout=conf.get("ready_timeout") or 1800.0,
        reset=conf.get("reset") or ResetMode.RESTART,
        api_key=key,
        **extra,
    )


def run_spec(spec: dict[str, Any]) -> int:
    """Build the job's options and call its :mod:`replayer.api` verb; print
    what the command prints; its exit code."""
    from replayer import api, options
    from replayer.cli.bisect import print_result as print_bisect
    from replayer.cli.bundle import print_verify
    from replayer.cli.replay import print_result as print_replay
    from replayer.options.server import Endpoint

    kind: str = spec["kind"]
    values: dict[str, Any] = dict(spec["options"])
    confs = [*spec.get("servers", []), *spec.get("endpoints", [])]
    scrape = [*values.get("scrape", []), *(u for c in confs for u in c.get("scrape", []))]
    if scrape:
        values["scrape"] = scrape
    port = os.environ.get("REPLAYER_WORKER_METRICS_PORT")
    if port:
        values["metrics_port"] = int(port)

    def build(cls: Any) -> Any:
        return options.build(cls, values, kind)

    out = Path(spec["out"])
    command = ["replayer", *(spec.get("command") or [kind])]
    if kind == "replay":
        eps = spec["endpoints"]
        launched = [c for c in eps if c.get("launch")]
        server = endpoints = None
        if launched:
            c = launched[0]
            endpoints = [Endpoint(name=c["name"], url=c["url"])] if c.get("url") else None
            server = _server({**c, "restart_cmd": None, "log_cmd": None})
        else:
            endpoints = [
                Endpoint(
                    name=c["name"],
                    url=c["url"],
                    api_key=os.environ.get(c["api_key_env"]) if c.get("api_key_env") else None,
                )
                for c in eps
            ]
        result = api.replay_sync(
            spec["input"],
            endpoints,
            build(options.ReplayPolicy),
            server=server,
            selection=build(options.Selection),
            out=out,
            watch=build(options.WatchConfig),
            progress=True,
            metrics=build(options.MetricsOptions),
            command=command,
        )
        print_replay(result, as_json=False)
        return result.exit_code
    if kind == "bisect":
        ctl = spec.get("control")
        vary = build(options.VaryOptions)
        pooled = build(options.PoolOptions)
        res = api.bisect_sync(
            spec["input"],
            _server(spec["servers"][0]) if spec.get("servers") else None,
            out,
            build(options.BisectOptions),
            policy=build(options.ReplayPolicy),
            selection=build(options.Selection),
            watch=build(options.WatchConfig),
            signature=values.get("signature"),
            control=_server(ctl) if ctl is not None else None,
            control_name=ctl["name"] if ctl is not None else "control",
            resume=bool(spec.get("resume")),
            metrics=build(options.MetricsOptions),
            vary=vary.vary,
            vary_runs=vary.vary_runs,
            servers=pooled.servers,
            gpus=pooled.gpus,
            pool=pooled.pool,  # a service pool's file names its key's variable itself
            control_pool=pooled.control_pool,
        )
        return print_bisect(res)
    server = _server(spec["servers"][0])
    vary = build(options.VaryOptions)
    got = api.verify_bundle_sync(
        spec["input"],
        server,
        runs=build(options.VerifyOptions).runs,
        out=out,
        watch=build(options.WatchConfig),
        vary=vary.vary,
        vary_runs=vary.vary_runs,
    )
    return print_verify(got, Path(spec["input"]))


def entry(args: list[str]) -> int:
    if len(args) != 1:
        print("usage: python -m replayer.service.worker JOBDIR", file=sys.stderr)
        return 2
    _die_with_parent()
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        return run(Path(args[0]).resolve())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
