"""Pools in ``targets.toml``: N interchangeable servers that bisect jobs share.

Usage::

    [pools.gpu4]
    servers = 4
    launch = "vllm serve m --port {port} --gpus {gpus}"
    gpus = 2
    port = 8100
    description = "four 2-GPU servers on node 3"

A table takes the keys of a pool file (:mod:`replayer.options.pool`: a
launch template, ``[slurm]``, ``[[server]]`` tables ...), checked when the
file is loaded, plus ``description``. ``slots`` is the service's: it is how
one job's share is written. A bisect job names ``pool`` instead of
``target``; while it runs it holds some of the pool's servers
(:func:`allot`), and the scheduler writes its own pool file, the table plus
``slots = [...]`` (:func:`write_pool_file`), which the worker hands to
:func:`replayer.api.bisect`. Each server keeps its number, port and GPUs
whichever job runs it, so two jobs sharing a pool never collide.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayer.errors import UsageError
from replayer.options.pool import PoolSpec

POOL_FILE = "pool.toml"
"""A pool job's own pool file, in its job folder (beside ``state.json``: it
holds launch commands, so it is never served)."""

_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One ``[pools.NAME]`` table."""

    name: str
    table: dict[str, Any] = field(hash=False)
    """The pool-file keys as written (no ``description``)."""
    size: int
    kind: str
    """``local`` (launched here), ``slurm`` (one sbatch job a server) or
    ``servers`` (``[[server]]`` tables: servers someone else runs)."""
    description: str = ""

    @property
    def api_key_env(self) -> str | None:
        key = self.table.get("api_key_env")
        return key if isinstance(key, str) else None

    def public(self) -> dict[str, Any]:
        """What the API shows: never the commands."""
        return {
            "name": self.name,
            "servers": self.size,
            "kind": self.kind,
            "description": self.description,
        }


def parse_pool(name: str, table: object, where: str) -> PoolConfig:
    """``[pools.NAME]`` checked as a pool file is (errors: one line naming the table)."""
    w = f"{where}: [pools.{name}]"
    if not isinstance(table, dict):
        raise UsageError(f"{w} must be a table")
    if "slots" in table:
        raise UsageError(f"{w}: slots is set per job by the service (each job's share)")
    desc = table.get("description", "")
    if not isinstance(desc, str):
        raise UsageError(f"{w} description: want a string")
    key_env = table.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not _ENV.match(key_env)):
        raise UsageError(f"{w} api_key_env: want an environment variable name")
    rest = {k: v for k, v in table.items() if k != "description"}
    try:
        # the key is read when a job runs (the variable need not be set yet)
        spec = PoolSpec.from_dict(
            {k: v for k, v in rest.items() if k != "api_key_env"}, f"[pools.{name}]"
        )
        to_toml(rest)
    except UsageError as exc:
        msg = str(exc).splitlines()[0]
        raise UsageError(f"{where}: {msg.removeprefix('--pool ')}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{w}: {str(exc).splitlines()[0]}") from None
    kind = "slurm" if spec.slurm is not None else "servers" if "server" in rest else "local"
    return PoolConfig(name, rest, len(spec), kind, desc)


def allot(size: int, held: Collection[int], *, want: int | None, sharing: int) -> list[int]:
    """The servers a starting job gets: ``min(want, fair share, free)`` of the
    lowest free numbers, the fair share ``max(1, size // sharing)`` (``sharing``:
    the running and queued jobs naming the pool, this one included); none
    while every server is held."""
    free = [s for s in range(size) if s not in held]
    fair = max(1, size // max(1, sharing))
    return free[: min(want or size, fair, len(free))]


def write_pool_file(conf: PoolConfig, slots: Sequence[int], path: Path) -> None:
    """A job's own pool file: the pool's table and the servers it holds."""
    text = to_toml({**conf.table, "slots": list(slots)})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def to_toml(table: Mapping[str, Any]) -> str:
    """``table`` as TOML (``tomllib`` reads it back equal): one ``key = value``
    a line, sub-tables inline. Raises TypeError for a value TOML cannot hold
    as written here (dates)."""
    return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in table.items())


def _key(k: str) -> str:
    return k if _BARE.match(k) else _string(k)


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot hold a {type(v).__name__} value: {v!r}")


def servers_line(servers: Sequence[Mapping[str, Any]]) -> str:
    """A pool's servers in a few words, for the jobs page:
    ``2 running trial 12 · 3 restarting · 4 failed: reason``."""
    parts = []
    for s in servers:
        n = s.get("slot") if s.get("slot") is not None else s.get("server")
        text = f"{n} {s.get('state')}"
        if s.get("state") == "running" and s.get("trial") is not None:
            text += f" trial {s['trial']}"
        if s.get("state") in ("failed", "stopped") and s.get("reason"):
            text += f": {s['reason']}"
        parts.append(text)
    return " · ".join(parts)
