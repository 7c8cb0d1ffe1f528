"""Emulator configuration: one frozen value, and the command-line options that
build it.

Option names follow ``vllm serve`` wherever vLLM has the knob (so a launch
line reads like the real one); emulator-only knobs (speed model, faults, the
request log) are grouped separately in ``--help``. Both ``replayer emulate``
and ``python -m replayer.emulator`` use :func:`add_arguments` and
:func:`config_from_args`, so the two entry points cannot drift.

This module must stay import-light: the CLI imports it to build ``--help``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from replayer.errors import UsageError

DEFAULT_MODEL = "moonshotai/Kimi-K3"
DEFAULT_VERSION = "0.33.0"
DEFAULT_TOOL_PARSER = "kimi_k2"
NO_VOCAB_LIMIT = 1 << 64
"""Default ``--vocab-size``: every 64-bit id is in vocabulary (no check)."""


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """Everything the emulated server needs to know; built once at start-up.

    Usage::

        cfg = EmulatorConfig(max_model_len=32_768, speed=0.0, seed=7)
        app = create_app(cfg)
    """

    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 8000
    """Port to bind; 0 picks a free one (see ``port_file``)."""
    port_file: Path | None = None
    """Where the bound port is written as soon as the socket is bound."""
    model: str = DEFAULT_MODEL
    """Model path, reported as ``root`` in ``/v1/models``."""
    served_model_names: tuple[str, ...] = ()
    """Names clients may use; the first is the metrics ``model_name`` label."""
    api_key: str | None = None
    """When set, ``/v1/*`` requires ``Authorization: Bearer <key>``."""
    vllm_version: str = DEFAULT_VERSION
    """Version reported and used to pick wire variants (see ``profile``)."""
    load_time: float = 0.0
    """Seconds the port stays bound-but-not-listening before the server is ready."""
    max_model_len: int = 262_144
    """Context limit in tokens."""
    vocab_size: int = NO_VOCAB_LIMIT
    """Token ids at or above this are out of vocabulary (token-id prompts are
    rejected; ``/tokenize`` answers ids below it)."""
    enable_auto_tool_choice: bool = True
    """``--enable-auto-tool-choice``: allow tool choices (``auto``, ``required``,
    named) - with a parser. On by default, like the production agent
    deployments the defaults describe; off, a request with ``tools`` (and no
    ``tool_choice: "none"``) gets vLLM's 400, as from a bare ``vllm serve``."""
    tool_call_parser: str | None = DEFAULT_TOOL_PARSER
    """``--tool-call-parser``: the parser's name (the emulator never emits tool calls)."""
    max_num_seqs: int = 1024
    """Most sequences in the running batch."""
    max_num_batched_tokens: int = 16_384
    """Token budget of one engine step (chunked prefill granularity)."""
    block_size: int = 16
    """Tokens per KV block."""
    num_gpu_blocks: int = 65_536
    """KV-cache capacity in blocks."""
    enable_prefix_caching: bool = True
    """Reuse cached full blocks of earlier prompts."""
    enable_chunked_prefill: bool = True
    """Split a prompt over steps to fit ``max_num_batched_tokens``; off, a
    prompt waits for a step with room for all of it (alone if it is longer)."""
    enforce_eager: bool = False
    """``--enforce-eager``: reported and testable by fault rules (no graphs to skip here)."""
    speculative_config: str | None = None
    """``--speculative-config``: reported, testable by fault rules, and counted in
    the ``vllm:spec_decode_*`` metrics (no real drafting)."""
    per_request_spec_decode_metrics: str = "none"
    """``--per-request-spec-decode-metrics``: ``summary`` or ``detailed`` add
    vLLM's ``metrics.speculative_decoding`` to chat and completions responses
    (with speculative decoding only), consistent with the counters."""
    enable_fault_tolerance: bool = False
    """``--enable-fault-tolerance``: a faulting engine may be kept UNHEALTHY (the
    ``unhealthy`` fault) and ``GET /fault_tolerance/status`` exists, as in vLLM."""
    enable_prompt_tokens_details: bool = False
    """Report ``prompt_tokens_details.cached_tokens`` in usage."""
    enable_force_include_usage: bool = False
    """Send usage on every stream, as if ``include_usage`` and ``continuous_usage_stats``."""
    enable_server_load_tracking: bool = False
    """Make ``/load`` count in-flight generation requests."""
    enable_request_id_headers: bool = False
    """Echo ``X-Request-Id`` in responses."""
    access_log: bool = True
    """Write uvicorn-style access-log lines."""
    tensor_parallel_size: int = 8
    """Shown in the fingerprint, config dump and worker names of crash logs."""
    platform: str = "rocm"
    """``rocm`` or ``cuda``: the flavour of GPU errors in crash logs."""
    kv_cache_dtype: str = "auto"
    """Reported in ``vllm:cache_config_info`` and the config dump."""
    gpu_memory_utilization: float = 0.92
    """Reported in ``vllm:cache_config_info`` and the config dump."""
    seed: int = 0
    """Seeds ids, filler text and fault draws."""
    speed: float = 1.0
    """Multiplier on simulated time: 2 runs twice as fast; 0 (``instant``) removes delays."""
    decode_time: float = 0.02
    """Seconds of one decode step at batch size 1 (speed 1)."""
    prefill_rate: float = 20_000.0
    """Prefill tokens per second (speed 1)."""
    batch_slowdown: float = 0.01
    """Extra fraction of ``decode_time`` per additional running sequence."""
    default_max_tokens: int = 16
    """Output tokens when a request sets no ``max_tokens``."""
    eos_after: int | None = None
    """Natural answer length: stop (``finish_reason: stop``) here unless ``ignore_eos``."""
    stats_interval: float = 10.0
    """Seconds between ``Engine 000: Avg prompt throughput`` log lines (0: never)."""
    faults: tuple[str, ...] = ()
    """``--fault`` specs, in order."""
    fault_files: tuple[Path, ...] = ()
    """``--fault-file`` paths, read after the specs."""
    request_log: Path | None = None
    """JSON-lines ground truth: received requests and trigger decisions."""
    log_bodies: bool = False
    """Include each request body in the request log."""
    log_file: Path | None = None
    """Also append server log lines here."""
    dev_mode: bool = False
    """``VLLM_SERVER_DEV_MODE=1``: serve ``/server_info``, ``/reset_prefix_cache``, ..."""
    keep_alive_on_engine_death: bool = False
    """``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``: an ``exit`` fault leaves the API up."""
    responses_store: bool = False
    """``VLLM_ENABLE_RESPONSES_API_STORE=1``: keep ``/v1/responses`` answers in
    memory, so ``previous_response_id`` and ``GET /v1/responses/{id}`` work
    (off, as in vLLM: both answer 404)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """``VLLM_*`` environment seen at start (reported by ``/server_info``)."""
    kernel_sync: str = ""
    """Which GPU errors name their faulting kernel: ``rocm`` with
    ``AMD_SERIALIZE_KERNEL`` 2 or 3 (each dispatch waited for, so the fault
    surfaces at its launch), ``cuda`` with ``CUDA_LAUNCH_BLOCKING=1``; empty
    otherwise (the error is asynchronous and names no kernel)."""
    _profile: str = field(default="", init=False, repr=False, compare=False)
    _fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.served_model_names:
            object.__setattr__(self, "served_model_names", (self.model,))
        checks = [
            (self.max_model_len >= 1, "--max-model-len must be >= 1"),
            (self.max_num_seqs >= 1, "--max-num-seqs must be >= 1"),
            (self.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be >= 1"),
            (self.block_size >= 1, "--block-size must be >= 1"),
            (self.num_gpu_blocks >= 1, "--num-gpu-blocks-override must be >= 1"),
            (self.speed >= 0, "--speed must be 'instant' or a number > 0"),
            (self.decode_time >= 0, "--decode-time must be >= 0"),
            (self.prefill_rate > 0, "--prefill-rate must be > 0"),
            (self.batch_slowdown >= 0, "--batch-slowdown must be >= 0"),
            (self.default_max_tokens >= 1, "--default-max-tokens must be >= 1"),
            (self.eos_after is None or self.eos_after >= 1, "--eos-after must be >= 1"),
            (self.load_time >= 0, "--load-time must be >= 0"),
            (0 <= self.port <= 65535, "--port must be in 0..65535"),
            (self.platform in ("rocm", "cuda"), "--platform must be rocm or cuda"),
            (self.tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1"),
            (1 <= self.vocab_size <= NO_VOCAB_LIMIT, "--vocab-size must be in 1..2**64"),
            (
                not self.enable_auto_tool_choice or bool(self.tool_call_parser),
                "--enable-auto-tool-choice requires --tool-call-parser",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise UsageError(msg)
        # Derived once: both are read on every request.
        object.__setattr__(self, "_profile", self._compute_profile())
        object.__setattr__(self, "_fingerprint", self._compute_fingerprint())

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def instant(self) -> bool:
        return self.speed == 0

    @property
    def profile(self) -> str:
        return self._profile

    @property
    def system_fingerprint(self) -> str | None:
        return self._fingerprint

    def _compute_profile(self) -> str:
        """Wire-format generation: ``0.33`` (current, from sources), ``0.32``
        (measured on a real vLLM 0.32.0: the EngineCore message, in-stream
        errors as spaced JSON, the fingerprint, silent clamping of max_tokens),
        ``0.10`` (0.10.1 to 0.31, from sources and reports: no fingerprint,
        400 on max_tokens overflow, ``BadRequestError`` in-stream) or ``0.9``
        (before 0.10.1: the flat error object)."""
        nums = tuple(int(x) for x in re.findall(r"\d+", self.vllm_version)[:3])
        if nums >= (0, 33):
            return "0.33"
        if nums >= (0, 32):
            return "0.32"
        if nums >= (0, 10, 1):
            return "0.10"
        return "0.9"

    @property
    def modern(self) -> bool:
        """0.32 and later: fingerprint, clamping, the 0.33 validation wording."""
        return self._profile in ("0.33", "0.32")

    @property
    def config_hash(self) -> str:
        """Stable digest of the engine-relevant settings (fingerprint suffix)."""
        keep = (
            "model",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "num_gpu_blocks",
            "enable_prefix_caching",
            "tensor_parallel_size",
            "kv_cache_dtype",
            "seed",
        )
        text = repr([(f.name, getattr(self, f.name)) for f in fields(self) if f.name in keep])
        return hashlib.sha256(text.encode()).hexdigest()

    def launch_values(self) -> dict[str, float]:
        """The launch settings fault conditions test (``faults.LAUNCH_VARIABLES``),
        so a fault can need a setting that a ``--vary`` variant turns off."""
        return {
            "prefix_caching": float(self.enable_prefix_caching),
            "chunked_prefill": float(self.enable_chunked_prefill),
            "max_num_batched_tokens": float(self.max_num_batched_tokens),
            "max_num_seqs": float(self.max_num_seqs),
            "kv_fp8": float(self.kv_cache_dtype.lower().startswith("fp8")),
            "enforce_eager": float(self.enforce_eager),
            "spec_decode": float(self.speculative_config is not None),
        }

    def _compute_fingerprint(self) -> str | None:
        if self._profile not in ("0.33", "0.32"):
            return None
        tp = f"-tp{self.tensor_parallel_size}" if self.tensor_parallel_size > 1 else ""
        return f"vllm-{self.vllm_version}{tp}-{self.config_hash[:8]}"


_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def human_int(text: str) -> int:
    """vLLM's human-readable integers: ``1k`` = 1000, ``1K`` = 1024, ``25.6k``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    value = float(m.group(1)) * _SUFFIX.get(m.group(2), 1)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole number of tokens: {text!r}")
    return int(value)


def speed_value(text: str) -> float:
    """``instant`` -> 0.0; otherwise a positive multiplier."""
    if text == "instant":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'instant' or a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("speed must be > 0 (or 'instant')")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register every emulator option on ``p`` (shared by both entry points)."""
    d = EmulatorConfig()
    s = p.add_argument_group("server (vLLM names)")
    s.add_argument("--host", default=d.host, help="address to bind (default %(default)s)")
    s.add_argument("--port", type=int, default=d.port, help="port; 0 = any free port")
    s.add_argument("--port-file", type=Path, help="write the bound port here once bound")
    s.add_argument("--model", default=d.model, help="model path (default %(default)s)")
    s.add_argument("--served-model-name", nargs="+", metavar="NAME", help="served names")
    s.add_argument("--api-key", default=None, help="require this key on /v1 (or VLLM_API_KEY)")
    s.add_argument(
        "--vllm-version",
        default=d.vllm_version,
        help="version to report; < 0.33 and < 0.10.1 switch wire variants",
    )
    s.add_argument(
        "--max-model-len",
        type=human_int,
        default=d.max_model_len,
        help="context limit in tokens; accepts 32k, 1M (default %(default)s)",
    )
    s.add_argument(
        "--vocab-size",
        type=human_int,
        default=d.vocab_size,
        help="token ids >= this are out of vocabulary (vLLM reads it from the model; "
        "default 2**64: no check)",
    )
    s.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=d.enable_auto_tool_choice,
        help="accept tool choices (needs --tool-call-parser); default on, as in agent "
        "deployments: --no-enable-auto-tool-choice answers tools with vLLM's 400",
    )
    s.add_argument(
        "--tool-call-parser",
        default=d.tool_call_parser,
        metavar="NAME",
        help="tool-call parser name ('' for none; default %(default)s)",
    )
    s.add_argument(
        "--max-num-seqs",
        type=int,
        default=d.max_num_seqs,
        help="running-batch limit (default %(default)s)",
    )
    s.add_argument(
        "--max-num-batched-tokens",
        type=human_int,
        default=d.max_num_batched_tokens,
        help="tokens per engine step (default %(default)s)",
    )
    s.add_argument(
        "--block-size",
        type=int,
        default=d.block_size,
        help="tokens per KV block (default %(default)s)",
    )
    s.add_argument(
        "--num-gpu-blocks-override",
        type=human_int,
        default=d.num_gpu_blocks,
        dest="num_gpu_blocks",
        help="KV capacity in blocks (default %(default)s)",
    )
    s.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prefix caching over block hash chains (default on)",
    )
    s.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="split long prompts over steps (default on); off, a prompt is prefilled whole",
    )
    s.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="reported, and visible to fault rules as enforce_eager (default off)",
    )
    s.add_argument(
        "--enable-fault-tolerance",
        action="store_true",
        help="vLLM's fault tolerance: GET /fault_tolerance/status, and the unhealthy fault "
        "keeps a faulted engine UNHEALTHY instead of killing it",
    )
    s.add_argument(
        "--speculative-config",
        default=None,
        metavar="JSON",
        help="reported, visible to fault rules as spec_decode=1, and counted in vLLM's "
        "spec_decode metrics (no real drafting)",
    )
    s.add_argument(
        "--per-request-spec-decode-metrics",
        choices=("none", "summary", "detailed"),
        default="none",
        help="add each request's speculative-decoding figures to chat and completions "
        "responses (metrics.speculative_decoding), as vLLM does",
    )
    s.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report prompt_tokens_details.cached_tokens",
    )
    s.add_argument(
        "--enable-force-include-usage", action="store_true", help="usage on every stream"
    )
    s.add_argument(
        "--enable-server-load-tracking", action="store_true", help="/load counts in-flight requests"
    )
    s.add_argument(
        "--enable-request-id-headers", action="store_true", help="echo X-Request-Id in responses"
    )
    s.add_argument("--disable-uvicorn-access-log", action="store_true", help="no access-log lines")
    s.add_argument(
        "-tp",
        "--tensor-parallel-size",
        type=int,
        default=d.tensor_parallel_size,
        help="reported TP size (default %(default)s)",
    )
    s.add_argument(
        "--kv-cache-dtype",
        default=d.kv_cache_dtype,
        help="reported KV dtype; fp8* is kv_fp8=1 to fault rules (default %(default)s)",
    )
    s.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=d.gpu_memory_utilization,
        help="reported memory fraction",
    )
    s.add_argument("--seed", type=int, default=d.seed, help="seed for ids, text, fault draws")

    e = p.add_argument_group("emulation")
    e.add_argument(
        "--load-time",
        type=float,
        default=d.load_time,
        help="seconds bound-but-not-listening before ready (default 0)",
    )
    e.add_argument(
        "--platform",
        choices=("rocm", "cuda"),
        default=d.platform,
        help="GPU flavour of crash logs (default %(default)s)",
    )
    e.add_argument(
        "--speed",
        type=speed_value,
        default=d.speed,
        help="'instant' (no simulated delay) or a time multiplier (default 1)",
    )
    e.add_argument(
        "--decode-time",
        type=float,
        default=d.decode_time,
        help="seconds per decode step at batch 1 (default %(default)s)",
    )
    e.add_argument(
        "--prefill-rate",
        type=float,
        default=d.prefill_rate,
        help="prefill tokens per second (default %(default)s)",
    )
    e.add_argument(
        "--batch-slowdown",
        type=float,
        default=d.batch_slowdown,
        help="extra step time per extra running sequence, as a fraction",
    )
    e.add_argument(
        "--default-max-tokens",
        type=int,
        default=d.default_max_tokens,
        help="output tokens when max_tokens is unset (default %(default)s)",
    )
    e.add_argument(
        "--eos-after",
        type=int,
        default=None,
        help="stop after N tokens unless ignore_eos (default: follow max_tokens)",
    )
    e.add_argument(
        "--stats-interval",
        type=float,
        default=d.stats_interval,
        help="seconds between engine stats log lines; 0 = off",
    )

    f = p.add_argument_group("faults and ground truth")
    f.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="fault rule, repeatable: 'EFFECT [k=v ...] [when COND [and COND ...]] "
        "[p=P] [delay=S] [times=N] [name=ID]'; EFFECT is exit, dead, hang, cut, "
        "slow or error; COND is VAR OP NUMBER with VAR in request, prompt_tokens, "
        "cached_tokens, running, waiting, kv_usage, session, turn, preemption, or a "
        "launch setting: prefix_caching, chunked_prefill, max_num_batched_tokens, "
        "max_num_seqs, kv_fp8, enforce_eager, spec_decode; or env.VLLM_NAME OP VALUE",
    )
    f.add_argument(
        "--fault-file",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="JSON or TOML file of fault rules (repeatable)",
    )
    f.add_argument(
        "--request-log",
        type=Path,
        metavar="PATH",
        help="append one JSON line per request and per trigger decision",
    )
    f.add_argument("--log-bodies", action="store_true", help="include request bodies")
    f.add_argument("--log-file", type=Path, metavar="PATH", help="also write server log here")


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> EmulatorConfig:
    env = os.environ if environ is None else environ
    return EmulatorConfig(
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        model=args.model,
        served_model_names=tuple(args.served_model_name or ()),
        api_key=args.api_key or env.get("VLLM_API_KEY") or None,
        vllm_version=args.vllm_version,
        load_time=args.load_time,
        max_model_len=args.max_model_len,
        vocab_size=args.vocab_size,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser or None,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        enforce_eager=args.enforce_eager,
        speculative_config=args.speculative_config,
        per_request_spec_decode_metrics=args.per_request_spec_decode_metrics,
        enable_fault_tolerance=args.enable_fault_tolerance,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_force_include_usage=args.enable_force_include_usage,
        enable_server_load_tracking=args.enable_server_load_tracking,
        enable_request_id_headers=args.enable_request_id_headers,
        access_log=not args.disable_uvicorn_access_log,
        tensor_parallel_size=args.tensor_parallel_size,
        platform=args.platform,
        kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        seed=args.seed,
        speed=args.speed,
        decode_time=args.decode_time,
        prefill_rate=args.prefill_rate,
        batch_slowdown=args.batch_slowdown,
        default_max_tokens=args.default_max_tokens,
        eos_after=args.eos_after,
        stats_interval=args.stats_interval,
        faults=tuple(args.fault),
        fault_files=tuple(args.fault_file),
        request_log=args.request_log,
        log_bodies=args.log_bodies,
        log_file=args.log_file,
        dev_mode=env.get("VLLM_SERVER_DEV_MODE", "0") == "1",
        keep_alive_on_engine_death=env.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") == "1",
        responses_store=env.get("VLLM_ENABLE_RESPONSES_API_STORE", "0") == "1",
        env={k: v for k, v in env.items() if k.startswith("VLLM_") and "KEY" not in k},
        kernel_sync=",".join(
            name
            for name, on in (
                ("rocm", env.get("AMD_SERIALIZE_KERNEL", "0").strip() in ("2", "3")),
                ("cuda", env.get("CUDA_LAUNCH_BLOCKING", "0").strip() == "1"),
            )
            if on
        ),
    )
