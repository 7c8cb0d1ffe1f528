"""``targets.toml``: the servers jobs may run against, as the operator wrote them.

This file is the only place launch commands come from. A job names a target;
the service turns the target's entry into the same options the CLI takes
(``--launch``, ``--restart-cmd``/``--url``/``--log-cmd``, ``--target``,
``--target-key``). An API request can never carry a command, a URL to
replay against or a key: all three would let anyone who holds the token run
programs on the head node or send traffic (and API keys) anywhere.

Usage::

    [targets.mi355]
    url = "http://mi355-node-3:8000"
    restart_cmd = "ssh mi355-node-3 docker restart vllm"
    log_cmd = "ssh mi355-node-3 docker logs --since {since} vllm"
    api_key_env = "MI355_API_KEY"     # the key is read from this variable, never stored
    ready_timeout = 1800
    reset = "restart"
    scrape = ["http://mi355-node-3:9100/metrics"]

    [targets.emulator]
    launch = "python -m replayer.emulator --port 8100 --speed instant"

Exactly one of ``launch`` and ``restart_cmd`` may be given; ``url`` is
required unless ``launch`` carries ``--port``. A target with neither command
can be replayed against but not bisected (nothing could restart it after a
crash).

``[pools.NAME]`` tables declare pools of interchangeable servers that bisect
jobs share (:mod:`replayer.service.pools`)::

    [pools.gpu4]
    servers = 4
    launch = "vllm serve m --port {port} --gpus {gpus}"
    gpus = 2
    description = "node 3, two GPUs a server"

A pool and a target may not share a name.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayer.errors import UsageError
from replayer.service.pools import PoolConfig, parse_pool
from replayer.target.base import ResetMode

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_KEYS = {"url", "launch", "restart_cmd", "log_cmd", "api_key_env", "ready_timeout", "reset"}
_KEYS |= {"scrape", "description"}


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """One ``[targets.NAME]`` table."""

    name: str
    url: str | None = None
    """Where it listens (optional with ``launch``: read from its ``--port``)."""
    launch: str | None = None
    """We start it: a command line, run in its own process group."""
    restart_cmd: str | None = None
    """Someone else runs it; this restarts it and returns once the old one is down."""
    log_cmd: str | None = None
    """Prints its log (with ``restart_cmd`` or ``url``), for crash signatures."""
    api_key_env: str | None = None
    """Name of the environment variable of ``serve`` that holds its API key."""
    ready_timeout: float | None = None
    reset: str | None = None
    """Default ``--reset`` between passing trials."""
    scrape: tuple[str, ...] = ()
    """Extra Prometheus endpoints to scrape during its replays."""
    description: str = ""

    @property
    def restartable(self) -> bool:
        return self.launch is not None or self.restart_cmd is not None

    def public(self) -> dict[str, Any]:
        """What the API shows: never the commands (they may name hosts and
        paths) beyond whether they exist, never a key."""
        return {
            "name": self.name,
            "url": self.url,
            "kind": "launch" if self.launch else "restart_cmd" if self.restart_cmd else "url",
            "restartable": self.restartable,
            "description": self.description,
        }


@dataclass(frozen=True, slots=True)
class Targets:
    """Every configured target and pool, by name."""

    by_name: dict[str, TargetConfig] = field(default_factory=dict)
    source: Path | None = None
    pools: dict[str, PoolConfig] = field(default_factory=dict)

    def get(self, name: object, what: str = "target") -> TargetConfig:
        if not isinstance(name, str) or name not in self.by_name:
            have = ", ".join(sorted(self.by_name)) or "none configured"
            raise UsageError(f"{what} {name!r} is not a configured target ({have})")
        return self.by_name[name]

    def pool(self, name: object) -> PoolConfig:
        if not isinstance(name, str) or name not in self.pools:
            have = ", ".join(sorted(self.pools)) or "none configured"
            raise UsageError(f"pool {name!r} is not a configured pool ({have})")
        return self.pools[name]


def _url(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise UsageError(f"{where}: want an http(s) URL")
    return value.rstrip("/")


def _str(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{where}: want a non-empty string")
    return value


def _check_name(name: str, what: str, where: str) -> None:
    if not _NAME.match(name):
        raise UsageError(f"{where}: {what} name {name!r}: letters, digits, '_', '.', '-'")


def parse_target(name: str, table: object, where: str) -> TargetConfig:
    _check_name(name, "target", where)
    if not isinstance(table, dict):
        raise UsageError(f"{where}: [targets.{name}] must be a table")
    unknown = set(table) - _KEYS
    if unknown:
        raise UsageError(f"{where}: [targets.{name}]: unknown key(s) {', '.join(sorted(unknown))}")
    w = f"{where}: [targets.{name}]"
    url = _url(table["url"], f"{w} url") if "url" in table else None
    launch = _str(table["launch"], f"{w} launch") if "launch" in table else None
    restart = _str(table["restart_cmd"], f"{w} restart_cmd") if "restart_cmd" in table else None
    log_cmd = _str(table["log_cmd"], f"{w} log_cmd") if "log_cmd" in table else None
    if launch and restart:
        raise UsageError(f"{w}: launch and restart_cmd are exclusive")
    if launch and log_cmd:
        raise UsageError(f"{w}: log_cmd is for restart_cmd/url targets (a launch's log is kept)")
    if not launch and url is None:
        raise UsageError(f"{w}: url is required unless the target is launched")
    key_env = table.get("api_key_env")
    if key_env is not None and (
        not isinstance(key_env, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key_env)
    ):
        raise UsageError(f"{w} api_key_env: want an environment variable name")
    ready = table.get("ready_timeout")
    if ready is not None and (
        isinstance(ready, bool) or not isinstance(ready, int | float) or ready <= 0
    ):
        raise UsageError(f"{w} ready_timeout: want a positive number of seconds")
    reset = table.get("reset")
    if reset is not None and reset not in {m.value for m in ResetMode}:
        raise UsageError(f"{w} reset: one of {', '.join(m.value for m in ResetMode)}")
    scrape = table.get("scrape", [])
    if not isinstance(scrape, list):
        raise UsageError(f"{w} scrape: want a list of URLs")
    desc = table.get("description", "")
    if not isinstance(desc, str):
        raise UsageError(f"{w} description: want a string")
    return TargetConfig(
        name=name,
        url=url,
        launch=launch,
        restart_cmd=restart,
        log_cmd=log_cmd,
        api_key_env=key_env,
        ready_timeout=float(ready) if ready is not None else None,
        reset=reset,
        scrape=tuple(_url(u, f"{w} scrape") for u in scrape),
        description=desc,
    )


def load_targets(path: Path | None) -> Targets:
    """Read ``targets.toml`` (no file: no targets; jobs will be refused)."""
    if path is None:
        return Targets()
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--targets {path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--targets {path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"targets", "pools"}
    if unknown:
        raise UsageError(f"--targets {path}: unknown table(s) {', '.join(sorted(unknown))}")
    where = f"--targets {path}"
    tables, pool_tables = data.get("targets", {}), data.get("pools", {})
    if not isinstance(tables, dict):
        raise UsageError(f"{where}: [targets.NAME] tables expected")
    if not isinstance(pool_tables, dict):
        raise UsageError(f"{where}: [pools.NAME] tables expected")
    by_name = {n: parse_target(n, t, where) for n, t in tables.items()}
    pools = {}
    for n, t in pool_tables.items():
        _check_name(n, "pool", where)
        if n in by_name:
            raise UsageError(f"{where}: [pools.{n}]: a target has that name too")
        pools[n] = parse_pool(n, t, where)
    return Targets(by_name, path, pools)
