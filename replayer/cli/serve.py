"""``replayer serve``: the job service (replay, bisect and verify jobs over HTTP).

Jobs, their logs and results live under ``--data DIR`` (one folder per job,
with an atomic state file), so a restart loses nothing: a running bisect
resumes from its journal, a running replay is marked interrupted with its
partial results kept. Launch commands come only from ``--targets``
(``targets.toml``); a job names a configured target.

Every route but ``/healthz`` needs ``Authorization: Bearer TOKEN``; the
token comes from ``--token-file`` or ``$REPLAYER_SERVE_TOKEN``. Without one,
serve refuses any non-loopback address; on loopback it generates one into
``DIR/serve.token``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from replayer import options
from replayer.cli.args import add_options, build


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    p = sub.add_parser(
        "serve",
        help="run the job service (HTTP API, persistence, auth)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, "serve")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from replayer import api

    return api.serve(build(options.ServeOptions, args, "serve"))
