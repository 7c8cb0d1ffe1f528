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
* **Exactly the CLI.** The worker runs ``replayer.cli.main`` on the argv the
  service built from the options layer (:mod:`replayer.options`), so a job
  behaves exactly as the same command typed in a shell: defaults,
  validation, exit codes, ``--resume``. It lives in ``cli`` because it is
  the command line: the service starts it by module name, never imports it.

The worker dies with ``serve`` (Linux ``PR_SET_PDEATHSIG``): a job never
outlives the service that accounts for it. After a restart ``serve`` resumes
a bisect from its journal (``--resume`` also reaps the server the dead
worker left) and marks a replay interrupted.

At the end it renders the run's HTML report through
:mod:`replayer.service.hooks` when issue 8's report writer exists.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

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
    argv: list[str] = state["argv"] + orjson.loads(
        os.environ.get("REPLAYER_WORKER_EXTRA_ARGV", "[]")
    )
    kind: str = state["kind"]
    os.chdir(job_dir)
    sys.argv = ["replayer", *argv]
    from replayer.cli import main

    code = main(argv)
    if kind in ("replay", "bisect"):
        from replayer.service.hooks import write_report

        out = job_dir / "out"
        write_report(out, out / "report.html")
    return code


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
