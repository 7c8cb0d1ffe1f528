"""Facts about the server under test, for repro bundles (VLLM.md §6.2).

A crash report is only useful with the exact server that crashed: version,
model, resolved config, cache layout, launch command and the environment
variables that steer kernels (``VLLM_*``, ``HIP_*``, ``ROCM_*``, ``NCCL_*``,
``AITER*``, ``TRITON*``, ``CUDA_*``). ``/server_info`` has the full config but
only in dev mode (404 otherwise); without it ``/version``, ``/v1/models`` and
the ``vllm:cache_config_info`` labels from ``/metrics`` still say most of it.

Secrets never leave: variables whose name contains KEY, TOKEN, SECRET or
PASSWORD are dropped, and values of such flags and assignments in commands
are replaced by ``***``. Each endpoint that could not be read is recorded in
``missing`` with the reason; gathering facts never fails a trial.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

ENV_PREFIXES = ("VLLM_", "HIP_", "ROCM_", "NCCL_", "AITER", "TRITON", "CUDA_")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
CACHE_CONFIG_METRIC = "vllm:cache_config_info"

_SECRET_FLAG = re.compile(
    r"(--?[\w-]*(?:key|token|secret|password)[\w-]*)(=|\s+)(\S+)", re.IGNORECASE
)
_SECRET_ASSIGN = re.compile(r"\b(\w*(?:KEY|TOKEN|SECRET|PASSWORD)\w*)=(\S+)", re.IGNORECASE)


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(w in upper for w in SECRET_WORDS)


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    """The kernel- and runtime-steering variables of ``env``, secrets dropped, sorted."""
    return {k: env[k] for k in sorted(env) if k.startswith(ENV_PREFIXES) and not is_secret(k)}


def redact_command(command: str) -> str:
    """``--api-key sk-1`` -> ``--api-key ***``; ``HF_TOKEN=x`` -> ``HF_TOKEN=***``."""
    s = _SECRET_FLAG.sub(lambda m: f"{m[1]}{m[2]}***", command)
    return _SECRET_ASSIGN.sub(lambda m: f"{m[1]}=***", s)


def cache_config_labels(exposition: str) -> dict[str, str] | None:
    """Labels of ``vllm:cache_config_info`` in a Prometheus text exposition."""
    try:
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                if sample.name == CACHE_CONFIG_METRIC:
                    return dict(sample.labels)
    except ValueError:
        return None
    return None


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What a repro bundle records about the target."""

    url: str
    version: str | None = None
    """``/version``."""
    models: tuple[dict[str, object], ...] = ()
    """``/v1/models`` ``data`` entries (id, root, max_model_len, ...)."""
    server_info: object | None = None
    """``/server_info?config_format=json`` (dev mode only)."""
    cache_config: dict[str, str] | None = None
    """``vllm:cache_config_info`` labels from ``/metrics``."""
    command: dict[str, object] = field(default_factory=dict)
    """How the target is held: launch/restart/log commands (redacted) and env."""
    missing: dict[str, str] = field(default_factory=dict)
    """Endpoint -> why it gave nothing (``/server_info``: 404 without dev mode)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "url": self.url,
            "version": self.version,
            "models": [dict(m) for m in self.models],
            "server_info": self.server_info,
            "cache_config": self.cache_config,
            "command": dict(self.command),
            "missing": dict(self.missing),
        }


async def _get_json(client: httpx.AsyncClient, path: str, missing: dict[str, str]) -> object:
    try:
        resp = await client.get(path)
    except httpx.TransportError as exc:
        missing[path] = f"{type(exc).__name__}: {exc}"
        return None
    if resp.status_code != 200:
        missing[path] = f"HTTP {resp.status_code}"
        if resp.status_code == 404 and path.startswith("/server_info"):
            missing[path] += " (dev mode off: VLLM_SERVER_DEV_MODE=1 enables it)"
        return None
    try:
        return resp.json()
    except ValueError:
        missing[path] = "not JSON"
        return None


async def gather_facts(
    client: httpx.AsyncClient, url: str, command: Mapping[str, object]
) -> ServerFacts:
    """Ask the server everything it will say about itself (best effort)."""
    missing: dict[str, str] = {}
    version = await _get_json(client, "/version", missing)
    models = await _get_json(client, "/v1/models", missing)
    info = await _get_json(client, "/server_info?config_format=json", missing)
    cache: dict[str, str] | None = None
    try:
        resp = await client.get("/metrics")
        if resp.status_code == 200:
            cache = cache_config_labels(resp.text)
            if cache is None:
                missing["/metrics"] = f"no {CACHE_CONFIG_METRIC}"
        else:
            missing["/metrics"] = f"HTTP {resp.status_code}"
    except httpx.TransportError as exc:
        missing["/metrics"] = f"{type(exc).__name__}: {exc}"
    data = models.get("data") if isinstance(models, dict) else None
    return ServerFacts(
        url=url,
        version=str(version["version"])
        if isinstance(version, dict) and "version" in version
        else None,
        models=tuple(m for m in data if isinstance(m, dict)) if isinstance(data, list) else (),
        server_info=info,
        cache_config=cache,
        command=dict(command),
        missing=missing,
    )
