"""The ``replayer`` command line: parse, call one :mod:`replayer.api` verb, print.

Each command module exposes ``register(subparsers, argv)``; its flags come from
the declared options (:mod:`replayer.options`, rendered by
:mod:`replayer.cli.args`). Only the module of the command being run is
imported (``replayer --help`` lists the others from :data:`COMMANDS`), and
handlers import the library inside, so ``replayer --help`` and
``replayer VERB --help`` load no pyarrow, aiohttp, numpy or stage code.
Every handler returns an exit code. A :class:`~replayer.errors.ReplayerError`
becomes one line on stderr and exit code 2, never a traceback; so does a
write refused for want of space that reached here as a bare ``OSError``.
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

from replayer._version import __version__
from replayer.errors import ReplayerError

COMMANDS: dict[str, tuple[str, str]] = {
    "import": ("replayer.cli.trace_cmds", "convert a public trace format into a replayer trace"),
    "synth": ("replayer.cli.trace_cmds", "synthesize agent sessions into a trace"),
    "inspect": ("replayer.cli.trace_cmds", "summarize a trace (sessions, turns, context lengths)"),
    "export": ("replayer.cli.trace_cmds", "write a trace as JSONL (full bodies, trace order)"),
    "replay": ("replayer.cli.replay", "replay a trace against one or more targets"),
    "check": ("replayer.cli.check", "one trial: does this trace crash the target?"),
    "bisect": ("replayer.cli.bisect", "minimize a crashing trace to a repro bundle"),
    "bundle": ("replayer.cli.bundle", "work with repro bundles"),
    "soak": ("replayer.cli.bundle", "verify a fix: N runs of a trace, expecting no crash"),
    "report": (
        "replayer.cli.report",
        "an HTML report of a run, bisect or bundle (self-contained, offline)",
    ),
    "compare": (
        "replayer.cli.report",
        "compare targets of a run, or runs (A/B), with confidence intervals",
    ),
    "sweep": (
        "replayer.cli.report",
        "replay a trace at several --max-inflight values and compare them",
    ),
    "record": ("replayer.cli.record", "record agent traffic through a transparent proxy"),
    "trace": ("replayer.cli.record", "operations on trace files (merge, convert)"),
    "emulate": ("replayer.cli.emulate", "run the vLLM emulator with fault injection"),
    "serve": ("replayer.cli.serve", "run the job service (HTTP API, persistence, auth)"),
    "demo": ("replayer.cli.demo", "crash the built-in emulator, bisect the trace, bundle it"),
}
"""Every command, in ``--help`` order: its module and its one-line help."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every replayer error is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (the first word that is not a global flag)."""
    for word in argv:
        if word in ("-v", "--verbose") or (word.startswith("-v") and set(word[1:]) == {"v"}):
            continue
        return word if word in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None, *, full: bool = False) -> Parser:
    """The parser for ``argv``: the named command in full, the others as
    their one-line help. Without ``argv`` (or with ``full``), every command
    in full: what tests and docs read."""
    full = full or argv is None
    parser = Parser(
        prog="replayer",
        description="Record, replay, monitor and bisect LLM-serving crash traces.",
    )
    parser.add_argument("--version", action="version", version=f"replayer {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (repeatable)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    words = list(argv or ())
    chosen = _command_in(words)
    wanted = {m for m, _ in COMMANDS.values()} if full else set()
    if chosen is not None:
        wanted.add(COMMANDS[chosen][0])
    registered: set[str] = set()
    for name, (module, help_text) in COMMANDS.items():
        if module in wanted:
            if module not in registered:
                importlib.import_module(module).register(sub, () if full else words)
                registered.add(module)
        else:
            sub.add_parser(name, help=help_text)
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


def install_signals(command: str | None) -> None:
    """SIGINT and SIGTERM stop a command that runs servers the way Ctrl-C does."""
    if command not in INTERRUPTIBLE or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # a shell starts background jobs (``replayer replay ... &``, CI steps)
        # with SIGINT ignored: then neither kill -INT nor SIGTERM (delivered
        # as SIGINT below) would stop the run and save what it measured
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # asyncio.run cancels the main task on SIGINT: launched servers are
        # stopped and results, summary and journal written, as on Ctrl-C
        signal.signal(signal.SIGTERM, _term_as_interrupt)
    _raise_open_files_limit()


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    args = parser.parse_args(words)
    install_signals(args.command)
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
    except OSError as exc:
        from replayer._files import no_space, output_error

        if not no_space(exc):
            raise
        # a write no command turned into its own error: still one line, exit 2
        where = exc.filename or getattr(args, "out", None) or "output"
        print(f"replayer {args.command}: error: {output_error(exc, where)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from replayer.replay.results import close_open_writers

        close_open_writers()  # a forced interrupt skipped the replay's own close
        print(f"replayer {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
