"""Facts about the server under test, for repro bundles (VLLM.md §6.2).

A crash report is only useful with the exact server that crashed: version,
model, resolved config, cache layout, launch command and the environment
variables that steer kernels, allocators and connectors (:data:`ENV_PREFIXES`:
``VLLM_*``, ``HIP_*``, ``HSA_*``, ``AMD_*``, ``ROCM_*``, ``PYTORCH_*``,
``NCCL_*``, ``LMCACHE_*``, ``MC_*``, ``AITER*``, ``TRITON*``, ``CUDA_*``): on
one MI355 stack a stale AITER JIT volume, an AITER ABI mismatch and
``PYTORCH_HIP_ALLOC_CONF`` each turned a crash on or off. ``/server_info``
has the full config but only in dev mode (404 otherwise); without it
``/version``, ``/v1/models`` and the ``vllm:cache_config_info`` labels from
``/metrics`` still say most of it.

Beside what the server says (:func:`gather_facts`):

- **container**: the image (and ``@sha256:`` digest) a ``docker``/``podman``
  ``run``, an ``apptainer``/``singularity`` ``exec``/``run`` or a Slurm
  ``--container-image`` in the launch command names (:func:`container_of`);
  no registry is asked, so a tag without a digest stays a tag.
- **packages**: the server's Python distributions and versions. For a launch
  replayer runs on this machine, outside a container, the server's own
  interpreter (the launch's ``python``, or the ``#!`` line of its script:
  ``vllm`` is one) lists every distribution with :mod:`importlib.metadata`;
  otherwise (Slurm, a remote server, a container) ``/server_info``'s
  ``system_env.pip_packages`` (vLLM's ``collect_env``: torch, triton, nccl,
  transformers, ... only, and only in dev mode). ``packages_from`` says which.
- **hardware**: lines of the server log naming the platform, the GPU, the
  driver, the firmware, NCCL/RCCL and the CUDA/HIP/ROCm versions
  (:data:`HARDWARE_PATTERNS`), each once, at most :data:`HARDWARE_LINES`.
- **jit_caches**: the identity (path, files, bytes, newest mtime) of the
  kernel caches a server reuses across launches: AITER's (``AITER_JIT_DIR``,
  else ``~/.aiter``), Triton's (``TRITON_CACHE_DIR``, else
  ``~/.triton/cache``), torch inductor's (``TORCHINDUCTOR_CACHE_DIR``, else
  ``/tmp/torchinductor_<user>``) and vLLM's (``VLLM_CACHE_ROOT``, else
  ``~/.cache/vllm``). Read on this machine, so for a local launch only.

Secrets never leave, by one rule on names: a variable whose name contains
KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL, AUTH or COOKIE (:data:`SECRET_WORDS`)
is dropped from ``env``, name and value; in commands the value of such a
flag or ``NAME=value`` assignment is replaced by ``***``. Each source that
could not be read is recorded in ``missing`` with the reason; gathering
facts never fails a trial.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ENV_PREFIXES = (
    "VLLM_",
    "HIP_",
    "HSA_",
    "AMD_",
    "ROCM_",
    "PYTORCH_",
    "NCCL_",
    "LMCACHE_",
    "MC_",
    "AITER",
    "TRITON",
    "CUDA_",
)
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH", "COOKIE")
CACHE_CONFIG_METRIC = "vllm:cache_config_info"
HARDWARE_LINES = 40
PACKAGES_TIMEOUT = 60.0
"""Seconds the server's interpreter may take to list its distributions."""
CACHE_WALK_LIMIT = 200_000
"""Files counted in one JIT cache before its figures are marked partial."""
SERVER_INFO = "/server_info?config_format=json"

HARDWARE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        # vLLM: "Automatically detected platform rocm." / "vLLM is using nccl==2.21.5"
        r"Automatically detected platform \w+",
        r"vLLM is using nccl==\S+",
        # the fused-MoE config lookup names the device: "...device_name=AMD_Instinct_MI300X.json"
        r"device_name=[\w.-]+",
        # NCCL/RCCL with NCCL_DEBUG=INFO: "NCCL INFO NCCL version 2.21.5+cuda12.4",
        # "NCCL INFO RCCL version 2.20.5+hip6.2", "NCCL INFO cudaDriverVersion 12040",
        # "NCCL INFO ROCr version 1.1", "NCCL INFO Kernel version: 5.15.0-105-generic"
        r"NCCL INFO (?:NCCL|RCCL) version",
        r"NCCL INFO (?:cudaDriverVersion|hipDriverVersion|ROCr version|Kernel version)",
        # the GPU by name: "NVIDIA H100 80GB HBM3", "AMD Instinct MI355X", "gfx950"
        r"\b(?:NVIDIA|Tesla) [A-Z][\w-]*\d",
        r"\bAMD (?:Instinct|Radeon)\b",
        r"\bgfx(?:9|10|11|12)\d{1,2}[a-z]?\b",
        # drivers, firmware, runtimes (as nvidia-smi, amd-smi, torch and HIP word them)
        r"(?i)\bdriver version\b",
        r"(?i)\bfirmware\b|\bVBIOS\b",
        r"(?i)\b(?:CUDA|HIP|ROCm) (?:runtime )?version\b",
    )
)
"""Lines of a server log that say what it runs on (:func:`hardware_lines`)."""
_LOG_PREFIX = re.compile(r"^\((?:[\w:-]+) pid=\d+\) (?:\w+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")

_FLAG_VALUE = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)(=|\s+)((?!--?[A-Za-z])\S+)")
_ASSIGN = re.compile(r"(?<![\w-])([A-Za-z_]\w*)=(\S+)")


def is_secret(name: str) -> bool:
    """Whether ``name`` (a variable or a flag) names a secret: one of its
    words (split at ``_``, ``-``, ``.``) ends with a word of
    :data:`SECRET_WORDS` (``HF_TOKEN``, ``--api-key``, ``OPENAI_APIKEY``), is
    a plural of one (``CREDENTIALS``) or starts with ``AUTH``
    (``AUTHORIZATION``). ``--max-num-batched-tokens`` and ``--tokenizer``
    are not secrets."""
    for word in re.split(r"[_.\-]+", name.upper()):
        stem = word[:-1] if word.endswith("S") and not word.endswith("TOKENS") else word
        if word.startswith("AUTH") or stem.endswith(SECRET_WORDS):
            return True
    return False


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    """The kernel- and runtime-steering variables of ``env``, secrets dropped, sorted."""
    return {k: env[k] for k in sorted(env) if k.startswith(ENV_PREFIXES) and not is_secret(k)}


def redact_command(command: str) -> str:
    """``--api-key sk-1`` -> ``--api-key ***``; ``HF_TOKEN=x`` -> ``HF_TOKEN=***``."""
    s = _FLAG_VALUE.sub(lambda m: f"{m[1]}{m[2]}***" if is_secret(m[1]) else m[0], command)
    return _ASSIGN.sub(lambda m: f"{m[1]}=***" if is_secret(m[1]) else m[0], s)


COMMAND_KEYS = ("launch", "restart_cmd", "log_cmd")


def redact_facts(facts: Mapping[str, object]) -> dict[str, object]:
    """``facts`` with every command in it (top level and under ``command``)
    through :func:`redact_command`: the one gate before facts are written."""

    def clean(d: Mapping[str, object]) -> dict[str, object]:
        return {
            k: redact_command(v) if k in COMMAND_KEYS and isinstance(v, str) else v
            for k, v in d.items()
        }

    out = clean(facts)
    cmd = out.get("command")
    if isinstance(cmd, Mapping):
        out["command"] = clean(cmd)
    return out


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
    packages: dict[str, str] | None = None
    """Distribution name -> version of the server's Python."""
    packages_from: str | None = None
    """``the server's interpreter (PATH)`` or ``/server_info``."""
    container: dict[str, object] | None = None
    """The image the launch runs (:func:`container_of`)."""
    hardware: tuple[str, ...] = ()
    """Server-log lines naming the GPU, driver, firmware, runtimes."""
    jit_caches: tuple[dict[str, object], ...] = ()
    """Kernel caches reused across launches (:func:`jit_caches`)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "url": self.url,
            "version": self.version,
            "models": [dict(m) for m in self.models],
            "server_info": self.server_info,
            "cache_config": self.cache_config,
            "command": dict(self.command),
            "missing": dict(self.missing),
            "packages": self.packages,
            "packages_from": self.packages_from,
            "container": self.container,
            "hardware": list(self.hardware),
            "jit_caches": [dict(c) for c in self.jit_caches],
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
    client: httpx.AsyncClient,
    url: str,
    command: Mapping[str, object],
    *,
    log: str = "",
) -> ServerFacts:
    """Ask the server everything it will say about itself, read what its
    launch, its log and (for a local launch) its machine say (best effort)."""
    missing: dict[str, str] = {}
    version = await _get_json(client, "/version", missing)
    models = await _get_json(client, "/v1/models", missing)
    info = await _get_json(client, SERVER_INFO, missing)
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
    launch = command.get("launch")
    launch_text = launch if isinstance(launch, str) else ""
    container = container_of(launch_text) if launch_text else None
    local = command.get("kind") == "launch" and container is None
    packages, source = await _packages(launch_text, info, local, missing)
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
        packages=packages,
        packages_from=source,
        container=container,
        hardware=tuple(hardware_lines(log)),
        jit_caches=tuple(jit_caches(_launch_env(launch_text))) if local else (),
    )


# -- the launch command ---------------------------------------------------------------

_NAME_VALUE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SHELLS = ("sh", "bash", "dash", "zsh")
_DOCKER_SWITCHES = frozenset(
    "-d -i -t -it -ti --rm --detach --interactive --tty --init --privileged --read-only "
    "--no-healthcheck --oom-kill-disable --sig-proxy --disable-content-trust".split()
)
_APPTAINER_SWITCHES = frozenset(
    "--nv --rocm --cleanenv -e --containall -c --contain --writable --writable-tmpfs "
    "--fakeroot -f --no-home --no-mount --nvccli -u --userns --compat".split()
)


def _words(command: str) -> list[str]:
    """``command`` split like a shell, through ``sh -c '...'``, ``env NAME=v``
    and ``env -u NAME`` (no shell runs it)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    for _ in range(4):  # sh -c 'sh -c ...' nests a bounded number of times
        if words and Path(words[0]).name in _SHELLS and "-c" in words[1:]:
            i = words.index("-c")
            try:
                words = shlex.split(words[i + 1]) if i + 1 < len(words) else []
            except ValueError:
                return []
    return words


def _launch_env(command: str) -> dict[str, str]:
    """The launch's leading ``NAME=value`` words over replayer's environment
    (what a local server inherits)."""
    env = dict(os.environ)
    for w in _words(command):
        if not _NAME_VALUE.match(w):
            break
        k, v = w.split("=", 1)
        env[k] = v
    return env


def _program(words: Sequence[str]) -> list[str]:
    """``words`` without leading assignments and ``env [-u NAME] [NAME=v]``."""
    i = 0
    while i < len(words):
        w = words[i]
        if _NAME_VALUE.match(w):
            i += 1
        elif Path(w).name == "env":
            i += 1
            while i < len(words) and (words[i].startswith("-") or _NAME_VALUE.match(words[i])):
                i += 2 if words[i] in ("-u", "--unset") else 1
        else:
            break
    return list(words[i:])


def _image(words: Sequence[str], switches: frozenset[str]) -> str | None:
    """The first word after the options (``-x v``, ``--x=v``, switches)."""
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("-"):
            return w
        i += 1 if ("=" in w or w in switches) else 2
    return None


def container_of(command: str) -> dict[str, object] | None:
    """The container a launch command runs its server in: ``runtime``,
    ``image``, ``digest`` (``sha256:...`` when the image is pinned by digest,
    else None). ``docker``/``podman``/``nerdctl`` ``run``,
    ``apptainer``/``singularity`` ``exec``/``run``, ``srun``/``sbatch``
    ``--container-image`` (pyxis) and ``enroot start``; None for none."""
    words = _program(_words(command))
    found: tuple[str, str] | None = None
    for i, w in enumerate(words):
        name = Path(w).name
        if name in ("docker", "podman", "nerdctl"):
            rest = words[i + 1 :]
            if rest[:2] == ["container", "run"]:
                rest = rest[1:]
            if rest[:1] in (["run"], ["create"]):
                image = _image(rest[1:], _DOCKER_SWITCHES)
                found = (name, image) if image else None
            break
        if name in ("apptainer", "singularity"):
            rest = words[i + 1 :]
            if rest[:1] in (["exec"], ["run"]):
                image = _image(rest[1:], _APPTAINER_SWITCHES)
                found = (name, image) if image else None
            break
        if name == "enroot" and words[i + 1 : i + 2] == ["start"]:
            image = _image(words[i + 2 :], frozenset({"--rw", "-w", "--root", "-r"}))
            found = (name, image) if image else None
            break
        if w.startswith("--container-image"):
            image = w.split("=", 1)[1] if "=" in w else words[i + 1] if i + 1 < len(words) else ""
            if image:
                found = (Path(words[0]).name if words else "slurm", image)
            break
    if found is None:
        return None
    runtime, image = found
    digest = image.split("@", 1)[1] if "@sha256:" in image else None
    return {"runtime": runtime, "image": image, "digest": digest}


# -- packages -------------------------------------------------------------------------

_LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json, sys\n"
    "d = {}\n"
    "for x in m.distributions():\n"
    "    n = x.metadata['Name']\n"
    "    if n: d.setdefault(n, x.version)\n"
    "json.dump(d, sys.stdout)\n"
)


def server_python(command: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The interpreter a local launch runs its server with: the launch's own
    ``python``, or its script's ``#!`` line (``vllm`` is a script); None when
    it cannot tell (a binary, a container, a program not on PATH)."""
    words = _program(_words(command))
    if not words:
        return None
    env = _launch_env(command) if env is None else env
    found = shutil.which(words[0], path=env.get("PATH"))
    if found is None:
        return None
    path = Path(found)
    if path.name.startswith("python"):
        return path
    try:
        with path.open("rb") as f:
            first = f.readline(512).decode(errors="replace")
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    shebang = first[2:].split()
    if not shebang:
        return None
    if Path(shebang[0]).name == "env" and len(shebang) > 1:
        hit = shutil.which(shebang[-1], path=env.get("PATH"))
        return Path(hit) if hit else None
    return Path(shebang[0]) if Path(shebang[0]).name.startswith("python") else None


async def local_packages(
    python: Path, env: Mapping[str, str], limit: float = PACKAGES_TIMEOUT
) -> dict[str, str]:
    """Every distribution ``python`` sees, ``{name: version}`` sorted by name
    (:mod:`importlib.metadata`: no pip needed). Raises ``OSError`` or
    ``ValueError`` when the interpreter cannot say."""
    import json

    proc = await asyncio.create_subprocess_exec(
        str(python),
        "-c",
        _LIST_DISTRIBUTIONS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env=dict(env),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ValueError(f"{python} did not list its packages in {limit:g} s") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:]
        raise ValueError(f"{python} exited {proc.returncode}: {' '.join(tail)[:200]}")
    got = json.loads(out)
    if not isinstance(got, dict):
        raise ValueError(f"{python} printed no package table")
    return {str(k): str(got[k]) for k in sorted(got, key=str.lower)}


def pip_packages(server_info: object) -> dict[str, str] | None:
    """``{name: version}`` from ``/server_info``'s ``system_env.pip_packages``
    (vLLM's ``collect_env``: ``name==version`` lines of a filtered ``pip list``)."""
    env = server_info.get("system_env") if isinstance(server_info, dict) else None
    text = env.get("pip_packages") if isinstance(env, dict) else None
    if not isinstance(text, str):
        return None
    out: dict[str, str] = {}
    for line in text.splitlines():
        # raw ``pip list --format=freeze`` lines; collect_env's printout adds "[pip3] "
        name, sep, version = re.sub(r"^\[[^\]]*\]\s*", "", line.strip()).partition("==")
        if sep and name and version:
            out[name.strip()] = version.strip()
    return out or None


async def _packages(
    launch: str, info: object, local: bool, missing: dict[str, str]
) -> tuple[dict[str, str] | None, str | None]:
    if local and launch:
        env = _launch_env(launch)
        python = server_python(launch, env)
        if python is None:
            missing["packages"] = "cannot tell the launch's Python interpreter"
        else:
            try:
                return await local_packages(python, env), f"the server's interpreter ({python})"
            except (OSError, ValueError) as exc:
                missing["packages"] = f"{python}: {exc}"[:300]
    got = pip_packages(info)
    if got is not None:
        missing.pop("packages", None)
        return got, "/server_info"
    missing.setdefault(
        "packages",
        "not a local launch, and no /server_info (VLLM_SERVER_DEV_MODE=1 enables it)",
    )
    return None, None


# -- the log and the machine ------------------------------------------------------------


def hardware_lines(log: str, limit: int = HARDWARE_LINES) -> list[str]:
    """Lines of ``log`` naming the platform, GPU, driver, firmware, NCCL/RCCL
    or the CUDA/HIP/ROCm versions (:data:`HARDWARE_PATTERNS`), each message
    once (without vLLM's ``(proc pid=N) LEVEL time [file:line]`` prefix), in
    order, at most ``limit``."""
    out: list[str] = []
    seen: set[str] = set()
    for raw in log.splitlines():
        if not any(p.search(raw) for p in HARDWARE_PATTERNS):
            continue
        text = _LOG_PREFIX.sub("", raw).strip()[:300]
        if text and text not in seen:
            seen.add(text)
            out.append(text)
            if len(out) >= limit:
                break
    return out


def cache_dirs(env: Mapping[str, str]) -> list[tuple[str, Path]]:
    """The JIT cache directories a server with ``env`` reuses (see the module doc)."""
    home = Path(env.get("HOME") or Path.home())
    user = env.get("USER") or env.get("LOGNAME")
    if not user:
        import getpass

        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "user"
    xdg = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    return [
        ("aiter", Path(env.get("AITER_JIT_DIR") or home / ".aiter")),
        ("triton", Path(env.get("TRITON_CACHE_DIR") or home / ".triton" / "cache")),
        (
            "torchinductor",
            Path(env.get("TORCHINDUCTOR_CACHE_DIR") or Path("/tmp") / f"torchinductor_{user}"),
        ),
        ("vllm", Path(env.get("VLLM_CACHE_ROOT") or xdg / "vllm")),
    ]


def cache_identity(path: Path, limit: int = CACHE_WALK_LIMIT) -> dict[str, object]:
    """``path``'s files, bytes and newest modification time (UTC, ISO 8601):
    enough to tell a stale cache from a fresh one without copying it."""
    if not path.is_dir():
        return {"path": str(path), "exists": False}
    files = size = 0
    newest = 0.0
    partial = False
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            files += 1
            size += st.st_size
            newest = max(newest, st.st_mtime)
            if files >= limit:
                partial, stack = True, []
                break
    out: dict[str, object] = {
        "path": str(path),
        "exists": True,
        "files": files,
        "bytes": size,
        "newest": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(newest)) if files else None,
    }
    if partial:
        out["partial"] = True
    return out


def jit_caches(env: Mapping[str, str]) -> list[dict[str, object]]:
    """:func:`cache_identity` of each of :func:`cache_dirs`, named."""
    return [{"name": name, **cache_identity(p)} for name, p in cache_dirs(env)]
