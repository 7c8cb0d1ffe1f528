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
from pathlib import Path
from typing import Any

from replayer.errors import UsageError


def _size(text: str) -> int:
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want bytes or 512M/8G, not {text!r}") from None


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the job service (HTTP API, persistence, auth)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9000, help="port (default 9000; 0: any free)")
    p.add_argument("--data", type=Path, required=True, metavar="DIR", help="jobs and traces")
    p.add_argument(
        "--targets", type=Path, default=None, metavar="TOML", help="targets.toml: what jobs run on"
    )
    p.add_argument(
        "--max-concurrent-jobs",
        type=int,
        default=1,
        metavar="N",
        help="jobs running at once (default 1); the rest queue. Jobs never share a target",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="F",
        help="bearer token (default: $REPLAYER_SERVE_TOKEN)",
    )
    p.add_argument(
        "--max-upload",
        type=_size,
        default="8G",
        metavar="BYTES",
        help="largest trace upload (default 8G)",
    )
    p.add_argument(
        "--cancel-grace",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a cancelled job gets to stop its servers before it is killed",
    )
    p.add_argument(
        "--port-file",
        type=Path,
        default=None,
        metavar="F",
        help="write the bound port here once listening (for supervisors and tests)",
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from replayer.service.app import ServeConfig
    from replayer.service.auth import load_token
    from replayer.service.config import load_targets
    from replayer.service.server import serve

    if args.max_concurrent_jobs < 1:
        raise UsageError("--max-concurrent-jobs must be at least 1")
    if not 0 <= args.port < 65536:
        raise UsageError("--port must be between 0 and 65535")
    data: Path = args.data
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--data {data}: cannot create: {exc.strerror}") from None
    targets = load_targets(args.targets)
    token, source = load_token(args.token_file, data, args.host)
    cfg = ServeConfig(
        data=data.resolve(),
        token=token,
        targets=targets,
        max_concurrent=args.max_concurrent_jobs,
        max_upload_bytes=args.max_upload,
        cancel_grace=args.cancel_grace,
    )
    return asyncio.run(serve(cfg, args.host, args.port, port_file=args.port_file, source=source))
