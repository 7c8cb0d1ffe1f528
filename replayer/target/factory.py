"""From command-line options to a target: ``--launch``, ``--restart-cmd``,
``--url``, ``--log-cmd``.

Exactly one way of holding the server is allowed: ``--launch CMD`` (we run
it; ``--url`` is optional and otherwise read from the command's ``--host``
and ``--port``, vLLM's default port being 8000), ``--restart-cmd CMD --url
URL`` (someone else runs it, a command restarts it), or ``--url URL`` alone
(no restarts). Contradictions are usage errors, before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from replayer.errors import OptionError
from replayer.target.base import DEFAULT_READY_TIMEOUT, ServerTarget
from replayer.target.process import DEFAULT_STOP_GRACE, LaunchedTarget, split_command
from replayer.target.remote import ExternalTarget, RestartableTarget

VLLM_DEFAULT_PORT = 8000


def url_from_command(argv: Sequence[str]) -> str:
    """``http://HOST:PORT`` from ``--host``/``--port`` (wildcards -> 127.0.0.1)."""
    host, port = "127.0.0.1", str(VLLM_DEFAULT_PORT)
    for i, arg in enumerate(argv):
        for flag in ("--host", "--port"):
            value = None
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            if value is None:
                continue
            if flag == "--port":
                port = value
            elif value not in ("0.0.0.0", "::", ""):
                host = value
    if not port.isdigit():
        raise OptionError("launch", f"cannot read a port from --port {port!r}; give url")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def make_target(
    *,
    launch: str | Sequence[str] | None = None,
    restart_cmd: str | None = None,
    url: str | None = None,
    log_cmd: str | None = None,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    marks: Mapping[str, str] | None = None,
    model: str | None = None,
    api_key: str | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    stop_grace: float = DEFAULT_STOP_GRACE,
) -> ServerTarget:
    """The target the options describe (see the module docstring).

    Usage::

        target = make_target(launch=args.launch, url=args.url, log_path=run / "server.log",
                             model=trace_model)
    """
    if launch is not None and restart_cmd is not None:
        raise OptionError("launch", "and restart_cmd are exclusive: give one")
    if launch is not None:
        if log_cmd is not None:
            raise OptionError(
                "log_cmd", "is for restart_cmd or url: a launched server's log is captured already"
            )
        if log_path is None:
            raise OptionError("launch", "needs a log file (the run directory's server.log)")
        argv, _ = split_command(launch)
        return LaunchedTarget(
            launch,
            url or url_from_command(argv),
            log_path,
            env=env,
            marks=marks,
            model=model,
            api_key=api_key,
            stop_grace=stop_grace,
            ready_timeout=ready_timeout,
        )
    if env:
        raise OptionError("env", "applies only to a launched server (launch)")
    if url is None:
        if restart_cmd is not None:
            raise OptionError("restart_cmd", "needs url (where the restarted server listens)")
        raise OptionError("launch", "or restart_cmd with url, or url alone: no server given")
    fetched = log_path if log_cmd else None  # no --log-cmd: there is no log to hold
    if restart_cmd is not None:
        return RestartableTarget(
            restart_cmd,
            url,
            log_cmd=log_cmd,
            log_path=fetched,
            model=model,
            api_key=api_key,
            ready_timeout=ready_timeout,
        )
    return ExternalTarget(
        url,
        log_cmd=log_cmd,
        log_path=fetched,
        model=model,
        api_key=api_key,
        ready_timeout=ready_timeout,
    )
