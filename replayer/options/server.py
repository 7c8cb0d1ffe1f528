"""The servers a job talks to: the one it may launch and restart
(:class:`Server`), plain endpoints and their keys (:class:`Targets`), the
control platform (:class:`ControlOptions`), and replayer's own metrics
endpoint (:class:`MetricsOptions`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from replayer._declare import Declared, option
from replayer.errors import OptionError

LIFECYCLE = frozenset({"check", "bisect", "verify", "soak"})
"""The verbs that run trials on a server they may restart."""


class ResetMode(StrEnum):
    """``--reset``: how state is cleared between trials when the server survived."""

    PREFIX_CACHE = "prefix-cache"
    RESTART = "restart"
    NONE = "none"


def _http(url: str) -> str | None:
    if url.startswith(("http://", "https://")):
        return None
    return f"{url!r}: must start with http:// or https://"


def url_value(text: str) -> str:
    """A URL, or ``NAME=URL`` as ``replay --target`` takes it (the name is
    replay's; one server needs none)."""
    name, sep, rest = text.partition("=")
    return rest if sep and "://" not in name else text


@dataclass(frozen=True)
class Server(Declared):
    """A server replayer may start, restart and read the log of.

    Give ``launch`` (a command; replayer starts it in its own process group
    and keeps its log), or ``restart_cmd`` with ``url`` (someone else runs
    it), or ``url`` alone (it cannot be restarted: one trial only)."""

    __group__ = "target (one of --launch, --restart-cmd + --url, --url)"
    __verbs__ = LIFECYCLE

    launch: str | None = option(
        None,
        "start the server with CMD (its own process group; log in RUN)",
        metavar="CMD",
        verbs=LIFECYCLE | {"replay"},
    )
    url: str | None = option(
        None,
        "where the server listens (read from --launch's --host/--port if absent; "
        "--target URL is the same)",
        metavar="URL",
        aliases=("--target",),
        parse=url_value,
        check=_http,
    )
    restart_cmd: str | None = option(
        None,
        "restart a server someone else runs (e.g. ssh node docker restart vllm)",
        metavar="CMD",
    )
    log_cmd: str | None = option(
        None, "print the server's log (with --restart-cmd or --url)", metavar="CMD"
    )
    ready_timeout: float = option(
        1800.0,
        "seconds to wait for /health and /v1/models after a launch or restart (default 1800: "
        "big models load for minutes)",
        metavar="S",
        gt=0,
        verbs=LIFECYCLE | {"replay"},
    )
    reset: ResetMode = option(
        ResetMode.RESTART,
        "between passing trials: clear the prefix cache (dev mode), restart (default), or nothing",
    )
    """Between passing trials: ``restart``, ``prefix-cache`` (vLLM dev mode) or ``none``."""
    keep_running: bool = option(
        False,
        "leave a launched server running afterwards",
        verbs=frozenset({"replay", "check"}),
    )
    api_key: str | None = option(None, "the server's API key", cli=False, secret=True)
    """Never a flag: the CLI reads it from the environment or a file."""
    env: Mapping[str, str] | None = option(
        None, "extra environment for a launched server", cli=False, secret=True
    )
    """Extra environment for a launched server."""

    def validate(self) -> None:
        if self.launch is None and self.url is None:
            raise OptionError("launch", "or url is required: the server to run on")
        if self.launch is not None and self.restart_cmd is not None:
            raise OptionError("launch", "and restart_cmd are exclusive: give one")

    @property
    def restartable(self) -> bool:
        return self.launch is not None or self.restart_cmd is not None


@dataclass(frozen=True)
class Endpoint(Declared):
    """Where requests go: a server under test by name and base URL (what the
    CLI calls a ``--target``). Its lifecycle, when replayer runs the server,
    is a :class:`~replayer.session.Slot`'s."""

    __verbs__ = frozenset({"replay", "sweep"})

    name: str = option("target", "its name in results and reports", cli=False)
    url: str = option("http://127.0.0.1:8000", "base URL (paths come from the trace)", cli=False)
    """Base URL, e.g. ``http://10.0.0.3:8000`` (paths come from the trace)."""
    api_key: str | None = option(None, "its API key", cli=False, secret=True)
    monitor_url: str | None = option(
        None, "where its /health and /metrics are read, when not at url", cli=False
    )
    """The server's own address when requests reach it through a proxy, a
    tunnel or a load balancer: a transport failure while this stays healthy
    is the network's (class ``network``), not the server's."""

    def validate(self) -> None:
        if self.monitor_url is not None:
            problem = _http(self.monitor_url)
            if problem is not None:
                raise OptionError("monitor_url", problem)
            object.__setattr__(self, "monitor_url", self.monitor_url.rstrip("/"))
        problem = _http(self.url)
        if problem is not None:
            raise OptionError("endpoints", problem.replace("must start", "the URL must start"))
        if not self.name:
            raise OptionError("endpoints", "a name may not be empty")
        object.__setattr__(self, "url", self.url.rstrip("/"))

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def read_key(spec: str, what: str) -> str:
    """A key from ``env:VAR`` or ``file:PATH``: keys never travel in argv."""
    kind, _, ref = spec.partition(":")
    if kind == "env":
        val = os.environ.get(ref)
        if val is None:
            raise OptionError(what, f"environment variable {ref} is not set")
        return val.strip()
    if kind == "file":
        try:
            return Path(ref).read_text().strip()
        except OSError as exc:
            raise OptionError(what, f"cannot read {ref}: {exc.strerror}") from None
    raise OptionError(what, f"wants env:VAR or file:PATH, not {spec!r}")


@dataclass(frozen=True)
class Targets(Declared):
    """Plain endpoints (``replay``, ``sweep``) and where every API key comes from."""

    __group__ = "targets (API keys come from the environment or files, never argv)"
    __verbs__ = frozenset({"replay", "sweep"}) | LIFECYCLE

    target: tuple[str, ...] = option(
        (),
        "a server under test (repeatable)",
        metavar="[NAME=]URL",
        verbs=frozenset({"replay", "sweep"}),
    )
    api_key_env: str | None = option(
        None,
        "read the API key from $VAR (default: $REPLAYER_API_KEY when set)",
        metavar="VAR",
    )
    api_key_file: str | None = option(None, "read the API key from a file", metavar="PATH")
    target_key: tuple[str, ...] = option(
        (),
        "API key of one target",
        metavar="NAME=env:VAR|file:PATH",
        verbs=frozenset({"replay", "sweep"}),
    )
    target_health: tuple[str, ...] = option(
        (),
        "read a target's /health and /metrics at its own address (when requests go "
        "through a proxy or tunnel: a transport failure while it stays healthy is the "
        "network's, not a crash) (repeatable)",
        metavar="[NAME=]URL",
        verbs=frozenset({"replay", "sweep"}),
    )

    def api_key(self) -> str | None:
        """The key for every target: ``api_key_file``, ``api_key_env``, or
        ``$REPLAYER_API_KEY``."""
        if self.api_key_file is not None:
            return read_key(f"file:{self.api_key_file}", "api_key_file")
        if self.api_key_env:
            return read_key(f"env:{self.api_key_env}", "api_key_env")
        if os.environ.get("REPLAYER_API_KEY"):
            return os.environ["REPLAYER_API_KEY"].strip()
        return None

    def endpoints(self) -> list[Endpoint]:
        """``target`` as endpoints (``[NAME=]URL``), each with its key."""
        if not self.target:
            raise OptionError("target", "is missing: give at least one [NAME=]URL")
        default_key = self.api_key()
        keys = {}
        for spec in self.target_key:
            name, sep, ref = spec.partition("=")
            if not sep:
                raise OptionError("target_key", f"wants NAME=env:VAR|file:PATH, not {spec!r}")
            keys[name] = read_key(ref, "target_key")
        health: dict[str, str] = {}
        for spec in self.target_health:
            name, sep, url = spec.partition("=")
            if not sep or "://" in name:
                if len(self.target) != 1:
                    raise OptionError(
                        "target_health",
                        f"{spec!r}: name the target (NAME=URL) when there are several",
                    )
                name, url = "", spec
            health[name] = url
        out: list[Endpoint] = []
        for spec in self.target:
            name, sep, url = spec.partition("=")
            if not sep or "://" in name:
                name, url = "target" if len(self.target) == 1 else f"target{len(out)}", spec
            if not url.startswith(("http://", "https://")):
                raise OptionError(
                    "target", f"{spec!r}: the URL must start with http:// or https://"
                )
            if any(t.name == name for t in out):
                raise OptionError("target", f"names {name!r} twice")
            out.append(
                Endpoint(
                    name=name,
                    url=url,
                    api_key=keys.get(name, default_key),
                    monitor_url=health.get(name, health.get("") if len(self.target) == 1 else None),
                )
            )
        for param, named in (("target_key", keys), ("target_health", health)):
            unknown = set(named) - {t.name for t in out} - {""}
            if unknown:
                raise OptionError(param, f"names unknown target(s): {', '.join(sorted(unknown))}")
        return out


@dataclass(frozen=True)
class ControlOptions(Declared):
    """The platform that runs clean: the final repro is replayed there too."""

    __group__ = "control (the platform that runs clean)"
    __verbs__ = frozenset({"bisect"})

    control: str | None = option(None, "replay the final repro here too", metavar="NAME=URL")
    control_launch: str | None = option(None, "start the control server with CMD", metavar="CMD")
    control_key: str | None = option(
        None, "the control's API key (default: the target's)", metavar="env:VAR|file:PATH"
    )

    def validate(self) -> None:
        if self.control_key and not (self.control or self.control_launch):
            raise OptionError("control_key", "needs control or control_launch")

    def server(self, target: Server | None) -> tuple[str, Server] | None:
        """The control's name and server (None: no control); its key is
        ``control_key``'s, else the target's, and it waits and resets as the
        target does."""
        if not (self.control or self.control_launch):
            return None
        name, url = "control", None
        if self.control:
            name, sep, url = self.control.partition("=")
            if not sep:
                name, url = "control", self.control
        base = target or Server(url=url or "http://127.0.0.1:8000")
        key = read_key(self.control_key, "control_key") if self.control_key else base.api_key
        return name, Server(
            launch=self.control_launch,
            url=url,
            ready_timeout=base.ready_timeout,
            reset=base.reset,
            api_key=key,
        )


@dataclass(frozen=True)
class PoolOptions(Declared):
    """A pool of servers: trials run on all of them at once."""

    __group__ = "a pool of servers (trials run on several at once)"
    __verbs__ = frozenset({"bisect"})

    servers: int = option(
        1,
        "run N servers of --launch and as many trials at once; {port}, {slot} and {gpus} in "
        "--launch are filled in per server (default 1)",
        metavar="N",
        ge=1,
    )
    gpus: int = option(
        0,
        "GPUs per server: {gpus} in --launch becomes each server's ids (0,1 then 2,3 ...)",
        metavar="N",
        ge=0,
    )
    pool: str | None = option(
        None,
        "a pool file (TOML): how many servers, a launch template, Slurm jobs, or servers "
        "one by one (instead of --launch/--servers)",
        metavar="FILE",
    )
    control_pool: str | None = option(
        None, "the control platform's pool file (instead of --control-launch)", metavar="FILE"
    )

    def validate(self) -> None:
        if self.pool is not None and self.servers > 1:
            raise OptionError("pool", "and servers are exclusive: the pool file says how many")


@dataclass(frozen=True)
class MetricsOptions(Declared):
    """replayer's own live metrics, for Prometheus and Grafana."""

    __group__ = "live metrics (replayer's own, for Prometheus/Grafana)"
    __verbs__ = frozenset({"replay", "bisect", "record"})

    metrics_port: int | None = option(
        None,
        "serve replayer_* metrics on http://HOST:PORT/metrics while running (0: any free "
        "port; the URL is printed on stderr)",
        metavar="PORT",
        ge=0,
        le=65535,
    )
    metrics_host: str = option(
        "127.0.0.1",
        "address for --metrics-port (default 127.0.0.1; 0.0.0.0 for a remote Prometheus)",
        metavar="HOST",
    )
