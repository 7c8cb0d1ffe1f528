"""The ``replayer`` command line: one module per command group.

Each command module exposes ``register(subparsers)`` and keeps heavy imports
inside its handlers, so ``replayer --help`` and start-up stay fast. Every
handler returns an exit code. A :class:`~replayer.errors.ReplayerError`
becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from replayer import __version__
from replayer.errors import ReplayerError

# Order here is the order in --help.
COMMAND_MODULES = (
    "replayer.cli.trace_cmds",
    "replayer.cli.replay",
    "replayer.cli.check",
    "replayer.cli.bisect",
    "replayer.cli.bundle",
    "replayer.cli.report",
    "replayer.cli.record",
    "replayer.cli.emulate",
    "replayer.cli.serve",
    "replayer.cli.demo",
)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every replayer error is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> Parser:
    parser = Parser(
        prog="replayer",
        description="Record, replay, monitor and bisect LLM-serving crash traces.",
    )
    parser.add_argument("--version", action="version", version=f"replayer {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (repeatable)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


INTERRUPTIBLE = frozenset({"replay", "check", "bisect", "bundle", "soak", "sweep", "demo"})
"""Commands that run servers and trials: SIGTERM stops them as Ctrl-C does."""


_terminating = False


def _term_as_interrupt(signum: int, frame: object) -> None:
    """The first SIGTERM is a Ctrl-C; later ones are ignored: a second SIGINT
    makes asyncio raise KeyboardInterrupt inside the clean-up that writes the
    results (a supervisor that repeats SIGTERM would lose them). A second
    Ctrl-C still forces."""
    global _terminating
    if _terminating:
        return
    _terminating = True
    signal.raise_signal(signal.SIGINT)


def _raise_open_files_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: a replay without --max-inflight
    holds one connection per waiting request, and 1024 is a common default."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (
        args.command in INTERRUPTIBLE
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        # a shell starts background jobs (``replayer replay ... &``, CI steps)
        # with SIGINT ignored: then neither kill -INT nor SIGTERM (delivered
        # as SIGINT below) would stop the run and save what it measured
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if (
        args.command in INTERRUPTIBLE
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        # asyncio.run cancels the main task on SIGINT: launched servers are
        # stopped and results, summary and journal written, as on Ctrl-C
        signal.signal(signal.SIGTERM, _term_as_interrupt)
    if args.command in INTERRUPTIBLE:
        _raise_open_files_limit()
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="replayer: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args))
    except ReplayerError as exc:
        from replayer.cli.args import flag_words

        print(f"replayer {args.command}: error: {flag_words(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        from replayer.replay.results import close_open_writers

        close_open_writers()  # a forced interrupt skipped the replay's own close
        print(f"replayer {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
