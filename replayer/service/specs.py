"""From a job request (JSON) to the job the worker runs: a typed spec.

A job takes "the same options as the CLI": ``options`` is an object of
parameter names (``"max_inflight"``, or the flag's ``"max-inflight"``) to
values, checked against the declared options (:mod:`replayer.options`, the
ones the CLI's flags are generated from) and built into the same validated
objects before the job is queued. The worker (:mod:`replayer.cli.worker`)
builds those objects again from the spec and calls the same
:mod:`replayer.api` verb the command line does: defaults, validation, exit
codes and ``--resume`` are the command's. The equivalent command line is
kept beside the spec for people (launch commands hidden when shown);
flags take ``true``/``false``; repeatable options a list. Only exact names
count (no prefix matching).

What a request may never carry, anywhere in the body: launch commands
(``launch``, ``restart_cmd``, ``log_cmd``, ``control_launch``): they come
only from ``targets.toml`` (:mod:`replayer.service.config`). Options the
server owns are refused too: output locations and resuming (``out``,
``resume``, ``force``), URLs and keys (``target``, ``url``, ``control``,
``scrape``, ``api-key-*``, ``target-key``, ``control-key``: a job names configured targets),
paths outside the request's confined fields (``from-run``), the live
metrics endpoint (``metrics-port``/``-host``: the scheduler gives each job a
loopback port), terminal niceties (``json``, ``quiet``, ``keep-running``),
and the pool options (``pool``, ``control-pool``, ``servers``, ``gpus``):
a bisect names a configured pool instead of a target (``"pool": NAME``,
optionally ``"max_servers": N``), and the scheduler writes its pool file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayer import options
from replayer.errors import OptionError, ReplayerError, UsageError
from replayer.options import Spec
from replayer.service.config import TargetConfig, Targets
from replayer.service.pools import POOL_FILE, PoolConfig

KINDS = ("replay", "bisect", "verify")
LAUNCH_KEYS = frozenset({"launch", "restart_cmd", "log_cmd", "control_launch"})
SERVER_OWNED = frozenset(
    {
        "out",
        "resume",
        "force",
        "json",
        "quiet",
        "keep_running",
        "target",
        "url",
        "control",
        "scrape",
        "api_key_env",
        "api_key_file",
        "target_key",
        "target_health",
        "control_key",
        "from_run",
        "help",
        "metrics_port",
        "metrics_host",
        "trace",
        "bundle",
    }
)
POOL_OWNED = frozenset({"pool", "control_pool", "servers", "gpus"})
REFUSED = LAUNCH_KEYS | SERVER_OWNED | POOL_OWNED
"""Declared options a job's ``options`` may not set (the OpenAPI document leaves them out)."""
TOP_LEVEL = frozenset({"kind", "trace", "bundle", "job", "target", "targets", "control"})
TOP_LEVEL |= {"options", "label", "pool", "max_servers"}


class SpecError(ValueError):
    """A job request the service refuses (a 400, nothing created)."""


def _norm(key: str) -> str:
    return key.strip().lower().replace("-", "_")


def launch_keys_in(obj: object, path: str = "") -> Iterator[str]:
    """Where ``obj`` (a parsed JSON body) carries a launch-command key, at any depth."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            here = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and _norm(k).lstrip("_") in LAUNCH_KEYS:
                yield here
            yield from launch_keys_in(v, here)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from launch_keys_in(v, f"{path}[{i}]")


PREFIX = {"replay": ("replay",), "bisect": ("bisect",), "verify": ("bundle", "verify")}


def _lookup(kind: str) -> dict[str, Spec]:
    """A job kind's options by parameter name and by the flag's name."""
    out: dict[str, Spec] = {}
    for o in options.options_of(kind).values():
        out[o.name] = o
        out.setdefault(_norm(o.spelling[2:]), o)
        for alias in o.meta.aliases:
            out.setdefault(_norm(alias.lstrip("-")), o)
    return out


def option_values(kind: str, given: object) -> tuple[list[str], dict[str, Any]]:
    """``given`` (a JSON object) as ``--flag=value`` tokens for ``kind``, and
    as typed parameter values for the options layer's builders."""
    if given is None:
        return [], {}
    if not isinstance(given, Mapping):
        raise SpecError("options: want an object of option names to values")
    table = _lookup(kind)
    argv: list[str] = []
    values: dict[str, Any] = {}
    for key, value in given.items():
        name = _norm(str(key))
        if name in LAUNCH_KEYS:
            raise SpecError(
                f"options.{key}: launch commands come only from the server's targets.toml"
            )
        opt = table.get(name)
        if name in POOL_OWNED or (opt is not None and opt.name in POOL_OWNED):
            raise SpecError(
                f"options.{key}: a bisect runs on several servers by naming a pool of "
                "targets.toml (pool, max_servers)"
            )
        if name in SERVER_OWNED or (opt is not None and opt.name in SERVER_OWNED):
            raise SpecError(f"options.{key}: set by the server (or by naming a target), not a job")
        if opt is None:
            raise SpecError(f"options.{key}: not an option of replayer {' '.join(PREFIX[kind])}")
        if value is None:
            continue
        if opt.flag:
            if not isinstance(value, bool):
                raise SpecError(f"options.{key}: a flag, want true or false")
            # {"no_monitor": true} is the flag given; {"enabled": true} the parameter's value
            param = value != opt.negated if name != opt.name else value
            if param != opt.default:
                argv.append(opt.spelling)
            values[opt.name] = param
            continue
        if isinstance(value, list) and not opt.repeat:
            raise SpecError(f"options.{key}: takes one value, not a list")
        items = value if isinstance(value, list) else [value]
        typed = []
        for v in items:
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise SpecError(f"options.{key}: want a string or a number")
            text = str(v)
            if "\n" in text or "\x00" in text:
                raise SpecError(f"options.{key}: newlines and NULs are not allowed")
            try:
                typed.append(opt.parse(text) if isinstance(v, str) else v)
            except OptionError as exc:
                raise SpecError(f"options.{key}: {exc.problem}") from None
            argv.append(f"{opt.spelling}={text}")
        values[opt.name] = typed if opt.repeat else typed[0]
    return argv, values


def option_argv(kind: str, given: object) -> list[str]:
    """``given`` (a JSON object) as ``--name=value`` tokens for ``kind``."""
    return option_values(kind, given)[0]


def _lifecycle_argv(t: TargetConfig) -> list[str]:
    """The CLI's lifecycle options (check/bisect/verify) for a configured target."""
    out: list[str] = []
    if t.launch is not None:
        out.append(f"--launch={t.launch}")
    if t.restart_cmd is not None:
        out.append(f"--restart-cmd={t.restart_cmd}")
    if t.url is not None:
        out.append(f"--url={t.url}")
    if t.log_cmd is not None:
        out.append(f"--log-cmd={t.log_cmd}")
    if t.api_key_env is not None:
        out.append(f"--api-key-env={t.api_key_env}")
    if t.ready_timeout is not None:
        out.append(f"--ready-timeout={t.ready_timeout:g}")
    if t.reset is not None:
        out.append(f"--reset={t.reset}")
    out += [f"--scrape={u}" for u in t.scrape]
    return out


def _replay_targets_argv(targets: list[TargetConfig]) -> list[str]:
    launched = [t for t in targets if t.launch is not None]
    if launched and len(targets) > 1:
        raise SpecError(
            f"target {launched[0].name} is launched: a replay launches one server, alone"
        )
    out: list[str] = []
    if launched:
        t = launched[0]
        out.append(f"--launch={t.launch}")
        if t.url is not None:
            out.append(f"--target={t.name}={t.url}")
        if t.api_key_env is not None:
            out.append(f"--api-key-env={t.api_key_env}")
        if t.ready_timeout is not None:
            out.append(f"--ready-timeout={t.ready_timeout:g}")
    else:
        for t in targets:
            out.append(f"--target={t.name}={t.url}")
            if t.api_key_env is not None:
                out.append(f"--target-key={t.name}=env:{t.api_key_env}")
    for t in targets:
        out += [f"--scrape={u}" for u in t.scrape]
    return out


@dataclass(frozen=True, slots=True)
class JobPlan:
    """A validated job: what it is, what it uses, and what the worker runs."""

    kind: str
    argv: list[str]
    """The equivalent command line, everything after ``replayer`` (the
    subcommand first, ``--out`` last): what a person would type."""
    targets: tuple[str, ...]
    """Configured targets it holds while running (no two jobs share one)."""
    inputs: dict[str, str]
    """The confined input paths, relative to DIR (for the listing)."""
    options: dict[str, Any]
    spec: dict[str, Any]
    """What the worker runs (:func:`replayer.cli.worker.run_spec`): the kind,
    the input, the output, the configured servers and the option values."""
    pool: str | None = None
    """The configured pool a bisect runs on (its servers are allotted when it starts)."""
    max_servers: int | None = None


def _names(value: object, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        if len(set(value)) != len(value):
            raise SpecError(f"{what}: a target is named twice")
        return list(value)
    raise SpecError(f"{what}: want a target name or a list of names")


def plan_job(
    body: object,
    targets: Targets,
    resolve_input: Callable[[str, str], tuple[Path, str]],
    out: Path,
) -> JobPlan:
    """Validate a job request and build its argv.

    ``resolve_input(field, value)`` confines a path field (or a job id, for
    ``job``) and returns ``(absolute path, relative path)``; it raises
    :class:`~replayer.service.paths.PathRejected` (a 400) for anything else.
    Nothing is written here."""
    if not isinstance(body, Mapping):
        raise SpecError("want a JSON object")
    found = list(launch_keys_in(body))
    if found:
        raise SpecError(
            f"{found[0]}: launch commands come only from the server's targets.toml; "
            "name a configured target instead"
        )
    unknown = set(body) - TOP_LEVEL
    if unknown:
        raise SpecError(f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    kind = body.get("kind")
    if kind not in KINDS:
        raise SpecError(f"kind: one of {', '.join(KINDS)}")
    opts = body.get("options") or {}
    label = body.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > 200):
        raise SpecError("label: want a string of at most 200 characters")
    pool_file = out.parent / POOL_FILE
    try:
        pool, max_servers = _pool_of(kind, body, targets)
        argv, used, inputs = _plan(kind, body, targets, resolve_input, pool, pool_file)
        extra, values = option_values(kind, opts)
        argv += extra
        argv.append(f"--out={out}")
        if pool is not None:
            values["pool"] = str(pool_file)
        _semantic_checks(kind, values)
    except OptionError as exc:
        raise SpecError(f"options.{exc.param}: {exc.problem}") from None
    except ReplayerError as exc:
        raise SpecError(str(exc)) from None
    confs = [targets.get(n) for n in used]
    # a bisect holds its server (a target, or none on a pool), then its control
    server = [] if kind == "replay" or pool is not None else confs[:1]
    control = confs[len(server) :] if kind == "bisect" else []
    spec = {
        "kind": kind,
        "input": argv[0],
        "out": str(out),
        "servers": [_conf(c) for c in server],
        "endpoints": [_conf(c) for c in confs] if kind == "replay" else [],
        "control": _conf(control[0]) if control else None,
        "pool": {"name": pool.name, "api_key_env": pool.api_key_env} if pool else None,
        "options": values,
        "resume": False,
        "command": redact_argv([*PREFIX[kind], *argv]),
    }
    return JobPlan(
        kind,
        [*PREFIX[kind], *argv],
        tuple(used),
        inputs,
        dict(opts),
        spec,
        pool.name if pool is not None else None,
        max_servers,
    )


def _pool_of(
    kind: str, body: Mapping[str, Any], targets: Targets
) -> tuple[PoolConfig | None, int | None]:
    """The pool a bisect names, and the most of its servers it may hold."""
    if "pool" not in body:
        if "max_servers" in body:
            raise SpecError("max_servers: only with pool (a bisect on a pool of servers)")
        return None, None
    if kind != "bisect":
        raise SpecError(f"pool: only bisect jobs run on a pool, not {kind}")
    if "target" in body:
        raise SpecError("pool and target are exclusive: a bisect runs on one of them")
    pool = targets.pool(body["pool"])
    n = body.get("max_servers")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= pool.size):
        raise SpecError(
            f"max_servers: want a whole number from 1 to {pool.size} (pool {pool.name} "
            f"has {pool.size} server(s))"
        )
    return pool, n


def _conf(t: TargetConfig) -> dict[str, Any]:
    """A configured target as the worker rebuilds it (no key: its variable's name)."""
    return {
        "name": t.name,
        "url": t.url,
        "launch": t.launch,
        "restart_cmd": t.restart_cmd,
        "log_cmd": t.log_cmd,
        "api_key_env": t.api_key_env,
        "ready_timeout": t.ready_timeout,
        "reset": t.reset,
        "scrape": list(t.scrape),
    }


def _plan(
    kind: str,
    body: Mapping[str, Any],
    targets: Targets,
    resolve_input: Callable[[str, str], tuple[Path, str]],
    pool: PoolConfig | None = None,
    pool_file: Path | None = None,
) -> tuple[list[str], list[str], dict[str, str]]:
    inputs: dict[str, str] = {}
    if kind == "verify":
        if ("bundle" in body) == ("job" in body):
            raise SpecError("verify: give either bundle (a path inside DIR) or job (a bisect job)")
        fld = "bundle" if "bundle" in body else "job"
        path, rel = resolve_input(fld, body[fld])
        inputs["bundle"] = rel
        positional = str(path)
    else:
        if "trace" not in body:
            raise SpecError("trace: required (a path inside DIR, e.g. traces/NAME)")
        path, rel = resolve_input("trace", body["trace"])
        inputs["trace"] = rel
        positional = str(path)
    if kind == "replay":
        if "target" in body or "control" in body:
            raise SpecError("replay: name targets with targets (a list)")
        names = _names(body.get("targets"), "targets")
        confs = [targets.get(n) for n in names]
        return [positional, *_replay_targets_argv(confs)], names, inputs
    if "targets" in body:
        raise SpecError(f"{kind}: name one target with target")
    used: list[str] = []
    if pool is not None:
        argv = [positional, f"--pool={pool_file}"]
        if pool.api_key_env is not None:
            argv.append(f"--api-key-env={pool.api_key_env}")
    else:
        t = targets.get(body.get("target"))
        if not t.restartable:
            raise SpecError(
                f"target {t.name} has no launch or restart_cmd in targets.toml: a {kind} "
                "restarts the server after every crash"
            )
        argv = [positional, *_lifecycle_argv(t)]
        used.append(t.name)
    if kind == "bisect" and body.get("control") is not None:
        c = targets.get(body["control"], "control")
        if c.name in used:
            raise SpecError("control: must be another target than target")
        used.append(c.name)
        argv.append(f"--control-launch={c.launch}" if c.launch else f"--control={c.name}={c.url}")
        if c.api_key_env is not None:
            argv.append(f"--control-key=env:{c.api_key_env}")
    elif body.get("control") is not None:
        raise SpecError(f"{kind}: control is for bisect jobs")
    return argv, used, inputs


def _semantic_checks(kind: str, values: Mapping[str, Any]) -> None:
    """Every value object the job's verb takes, built from its values: the
    checks that need no file or server, before queueing (the worker builds
    them again)."""
    for cls in options.VERBS[kind]:
        if cls not in (options.Server, options.Targets, options.ControlOptions):
            options.build(cls, values, kind)
    if kind != "replay" and not options.build(options.WatchConfig, values, kind).enabled:
        raise UsageError(f"{kind} classifies every run: it needs the monitor (no_monitor)")


def redact_argv(argv: list[str]) -> list[str]:
    """The argv as shown through the API: commands from targets.toml hidden."""
    out = []
    for tok in argv:
        m = re.match(r"^(--(?:launch|restart-cmd|log-cmd|control-launch))=", tok)
        out.append(f"{m.group(1)}=<from targets.toml>" if m else tok)
    return out
