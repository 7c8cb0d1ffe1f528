"""A pool of servers: N interchangeable servers of one configuration
(:class:`PoolSpec`), from ``--servers N`` with a launch template or from a
pool file (``--pool FILE``, TOML).

A pool file::

    servers = 4                                   # how many (default 1)
    launch = "vllm serve m --port {port}"         # each server's command
    gpus = 8                                      # GPUs each: {gpus} = 0,...,7 / 8,...,15 ...
    port = 8100                                   # server i listens on port + i (default: free)
    url = "http://127.0.0.1:{port}"               # default: from the launch's --host/--port
    ready_timeout = 1800
    reset = "restart"
    api_key_env = "VLLM_API_KEY"

    [slurm]                                       # each server is one sbatch job
    partition = "mi355"
    gres = "gpu:8"
    time = "4:00:00"
    extra = ["--account", "lab"]
    pending_timeout = 900                         # then reported with Slurm's reason
    url = "http://{node}:{port}"                  # the node the job landed on

    slots = [2, 3]                                # only these servers of the pool
                                                  # (the service's share for one job)

    [[server]]                                    # or servers one by one
    url = "http://10.0.0.3:8000"
    restart_cmd = "ssh n3 systemctl restart vllm"

``{port}``, ``{slot}`` (0-based) and ``{gpus}`` are filled in per server, in
the launch and the URL; ``{node}`` in a Slurm URL once the job runs.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from replayer.errors import OptionError, UsageError
from replayer.options.server import ResetMode, Server

_TOP = {"servers", "launch", "gpus", "port", "url", "ready_timeout", "reset", "api_key_env"}
_TOP |= {"slurm", "server", "log_cmd", "restart_cmd", "slots", "description"}
_SLURM = {"partition", "gres", "time", "extra", "pending_timeout", "url"}
_SERVER = {"url", "launch", "restart_cmd", "log_cmd"}


def fill(template: str, **fields: object) -> str:
    """A template with ``{port}``, ``{slot}``, ``{gpus}``, ``{node}`` filled in:
    only those words, so the JSON a launch command carries keeps its braces."""
    for name, value in fields.items():
        template = template.replace("{" + name + "}", str(value))
    return template


@dataclass(frozen=True)
class SlurmSpec:
    """What each server's ``sbatch`` asks of the scheduler."""

    partition: str | None = None
    gres: str | None = None
    time: str | None = None
    extra: tuple[str, ...] = ()
    pending_timeout: float = 600.0
    url: str = "http://{node}:{port}"


@dataclass(frozen=True)
class PoolMember:
    """One server of a pool, its template filled in (``port`` None: a free one
    is picked when the pool starts)."""

    slot: int
    server: Server
    port: int | None = None
    gpus: str = ""


@dataclass(frozen=True)
class PoolSpec:
    """N interchangeable servers (see the module doc)."""

    members: tuple[PoolMember, ...]
    slurm: SlurmSpec | None = None
    launch_template: str | None = None
    """The launch before filling (a variant of the pool relaunches from it)."""
    url_template: str | None = None
    source: str = ""
    """Where it came from, for messages: a file, or ``--servers N``."""
    ports: tuple[int, ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return len(self.members)

    @classmethod
    def like(cls, server: Server, n: int, *, gpus: int = 0, port: int | None = None) -> PoolSpec:
        """``n`` copies of ``server`` (``--servers N``), its launch a template."""
        if n < 1:
            raise OptionError("servers", "must be at least 1")
        if server.launch is None:
            raise OptionError("servers", "needs launch: a template with {port} per server")
        if n > 1 and "{port}" not in server.launch and server.url is None:
            raise OptionError(
                "servers", "needs {port} in launch: each server listens on its own port"
            )
        return cls._members(
            n, server, server.launch, server.url, gpus=gpus, port=port, source=f"--servers {n}"
        )

    @classmethod
    def _members(
        cls,
        n: int,
        server: Server,
        launch: str | None,
        url: str | None,
        *,
        gpus: int,
        port: int | None,
        source: str,
        slurm: SlurmSpec | None = None,
    ) -> PoolSpec:
        members = []
        for i in range(n):
            ids = ",".join(str(g) for g in range(i * gpus, (i + 1) * gpus)) if gpus else ""
            p = port + i if port is not None else None
            members.append(PoolMember(i, server, p, ids))
        return cls(tuple(members), slurm, launch, url, source)

    @classmethod
    def load(cls, path: str | Path, base: Server | None = None) -> PoolSpec:
        """A pool file (TOML); ``base`` gives what the file leaves out (the
        command line's ready timeout, reset and key)."""
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except OSError as exc:
            raise UsageError(f"--pool {p}: cannot read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"--pool {p}: not TOML: {exc}") from None
        return cls.from_dict(data, str(p), base)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str, base: Server | None = None) -> PoolSpec:
        """A pool file's tables; ``slots`` keeps only those servers (their
        ports, GPUs and numbers stay theirs: two jobs sharing one pool file
        never collide)."""
        spec = cls._from_dict(data, where, base)
        if "slots" not in data:
            return spec
        keep = data["slots"]
        if (
            not isinstance(keep, list)
            or not keep
            or not all(isinstance(i, int) and 0 <= i < len(spec) for i in keep)
        ):
            raise UsageError(f"--pool {where}: slots wants server numbers 0..{len(spec) - 1}")
        members = tuple(m for m in spec.members if m.slot in set(keep))
        return replace(spec, members=members)

    @classmethod
    def _from_dict(cls, data: dict[str, Any], where: str, base: Server | None = None) -> PoolSpec:
        unknown = set(data) - _TOP
        if unknown:
            raise UsageError(f"--pool {where}: unknown key(s) {', '.join(sorted(unknown))}")
        base = base or Server(url="http://127.0.0.1:8000")
        key = base.api_key
        if "api_key_env" in data:
            from replayer.options.server import read_key

            key = read_key(f"env:{data['api_key_env']}", f"--pool {where}: api_key_env")
        try:
            return cls._parse(data, where, replace(base, api_key=key))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, UsageError | OptionError):
                raise
            raise UsageError(f"--pool {where}: {exc}") from None

    @classmethod
    def _parse(cls, data: dict[str, Any], where: str, base: Server) -> PoolSpec:
        try:
            template = replace(
                base,
                launch=None,
                url="http://127.0.0.1:8000",
                restart_cmd=None,
                log_cmd=None,
                ready_timeout=float(data.get("ready_timeout", base.ready_timeout)),
                reset=ResetMode(data.get("reset", base.reset)),
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--pool {where}: {exc}") from None
        slurm = None
        if "slurm" in data:
            s = data["slurm"]
            if not isinstance(s, dict) or set(s) - _SLURM:
                raise UsageError(f"--pool {where}: [slurm] takes {', '.join(sorted(_SLURM))}")
            slurm = SlurmSpec(
                partition=s.get("partition"),
                gres=s.get("gres"),
                time=s.get("time"),
                extra=tuple(str(x) for x in s.get("extra", ())),
                pending_timeout=float(s.get("pending_timeout", 600.0)),
                url=str(s.get("url", "http://{node}:{port}")),
            )
        if "server" in data:
            if "launch" in data or "servers" in data:
                raise UsageError(
                    f"--pool {where}: give [[server]] tables or servers + launch, not both"
                )
            rows = data["server"]
            if not isinstance(rows, list) or not rows:
                raise UsageError(f"--pool {where}: [[server]] wants one table per server")
            members = []
            for i, row in enumerate(rows):
                if not isinstance(row, dict) or set(row) - _SERVER:
                    raise UsageError(
                        f"--pool {where}: server {i + 1} takes {', '.join(sorted(_SERVER))}"
                    )
                try:
                    srv = replace(
                        template,
                        launch=row.get("launch"),
                        url=row.get("url"),
                        restart_cmd=row.get("restart_cmd"),
                        log_cmd=row.get("log_cmd"),
                    )
                except OptionError as exc:
                    raise UsageError(f"--pool {where}: server {i + 1}: {exc}") from None
                members.append(PoolMember(i, srv))
            return cls(tuple(members), slurm, source=where)
        launch = data.get("launch")
        if not isinstance(launch, str) or not launch:
            raise UsageError(f"--pool {where}: launch is required (a command template)")
        n = data.get("servers", 1)
        if not isinstance(n, int) or n < 1:
            raise UsageError(f"--pool {where}: servers must be a count of at least 1")
        url = data.get("url") or (slurm.url if slurm else None)
        port = data.get("port")
        if slurm is not None and port is None:
            port = 8000  # each job on its own node: one port serves them all
        server = replace(template, launch=launch, url=None)
        return cls._members(
            n,
            server,
            launch,
            url,
            gpus=int(data.get("gpus", 0)),
            port=int(port) if port is not None else None,
            source=where,
            slurm=slurm,
        )
