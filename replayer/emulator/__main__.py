"""``python -m replayer.emulator [options]``: the emulator without the full CLI
(faster start-up for test fixtures); same options as ``replayer emulate``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from replayer.emulator.config import add_arguments, config_from_args
from replayer.errors import ReplayerError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m replayer.emulator", description="vLLM emulator")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        from replayer.emulator.server import run

        return run(config_from_args(args))
    except ReplayerError as exc:
        print(f"replayer emulate: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
