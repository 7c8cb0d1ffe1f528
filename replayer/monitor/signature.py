"""Crash signatures: "is this the same crash?" from a server log.

Minimization keeps a candidate only when it fails *the same way* as the
original, so a signature must survive everything that changes between two
runs of the same bug (timestamps, pids, addresses, request ids, which TP rank
died first, how long the log is, whether the process had exited by the time
we looked) and still tell apart two different bugs, two crashes that end with
different exit statuses included (MINIMIZE.md §1.5, §5; VLLM.md §2, §7).

What a signature is made of:

* the **root-cause traceback**: the first traceback written by an engine or
  worker process that is not a consequence of another failure. vLLM's
  wrappers (``EngineDeadError: EngineCore encountered an issue``,
  ``AsyncEngineDeadError``, ``Engine loop has died``) are effects and come
  last; ``RuntimeError: Worker failed with error '...'``, ``Executor
  failed.`` and chained (``The above exception was the direct cause``)
  tracebacks are used only when nothing better exists (a worker killed by a
  HSA hard fault leaves no traceback of its own). API-server tracebacks count
  only when no engine or worker traceback exists; then, because a 400's
  traceback logged earlier says nothing about a later engine death, the
  dead-engine wrapper is preferred for crash classes and the latest cause
  for ``http_5xx_other``/``client_error``. From it: the exception
  type (last dotted part: ``torch.AcceleratorError`` -> ``AcceleratorError``),
  its first message line normalized, and the innermost :data:`TOP_FRAMES`
  frames as ``file.py:function`` (no directories, no line numbers; asyncio,
  concurrent.futures, threading and torch module-call plumbing skipped).
* **GPU error strings** anywhere in the log (found by
  :func:`replayer.monitor.logs.gpu_errors`), one canonical string per kind
  (``CUDA error: an illegal memory access was encountered``, ``Memory access
  fault by GPU node-<N> on address <ADDR>. Reason: Unknown``,
  ``HSA_STATUS_ERROR_EXCEPTION: ... code: 0x1016``, ``Triton Error [HIP]:
  Code: 700, ...``, NCCL watchdog, device-side asserts, ``NVRM Xid 31``).
  Error *codes* are kept here (700 is not 719); volatile parts are not.
* **events**: engine lifecycle lines (a worker died and with which code,
  start-up failed, ``Fatal Python error``) and, not hashed, hang warnings and
  per-request errors.
* the **exit** status and the **failure class** (given by the caller).
* the **suspects**: request ids of the failing batch in vLLM's scheduler
  dump, mapped back to the client's ``X-Request-Id``.
* the **failing request**: the one the server was processing when it
  failed, by the server's own evidence (:func:`failing_request`), which the
  client cannot give: every stream in flight sees an engine death at once,
  and the first to report it is a matter of timing.

What the hash covers, and why:

* :attr:`Signature.log_hash`, what the log says: :data:`LOG_HASH_VERSION`,
  failure class, exception type, normalized message, top frames, the *set* of
  GPU error kinds (their order depends on which rank logs first), the hashed
  events, and the exit status only when it is the sole evidence (no
  traceback, no GPU error, no hashed event; e.g. an API process SIGKILLed or a
  segfault without a log). These are properties of the bug: the same kernel
  fault gives the same ones run after run. It is, byte for byte, the hash of
  version-1 signatures, so a signature an older replayer wrote (a bundle's
  manifest, a journal) still names its crash.
* :attr:`Signature.hash`, a digest of :data:`SIGNATURE_VERSION`, the log
  hash and the exit text (``code 0``, ``signal SIGABRT``): users tell two
  crashes apart by how the process ended even when their logs agree. When the
  exit is unknown (the process had not exited yet, e.g. ``engine_dead`` with
  the API still up) it equals ``log_hash``. The price: a bug whose exit
  depends on timing (single-API-server vLLM exits 0 after engine death, a
  worker abort can end the same bug with -6) gets one hash per exit; their
  ``log_hash`` is still one.
* not covered: suspects and computed tokens (they name *where* the bug
  struck, which is what minimization changes), hang warnings (whether the 60 s
  warning appears depends on how long the stall was watched) and per-request
  errors (they can precede an unrelated crash).

:func:`matches` is what "the same crash" means: same class and same hash,
or same ``log_hash`` when one side's hash does not cover its exit (unknown, or
a version-1 signature). Timing decides whether the exit is caught at all, so
an unknown exit is no evidence of another crash; two *known* exits that differ
are.

:attr:`Signature.coarse_hash` drops message and frames (class, exception type,
GPU kinds, events; the exit only as sole evidence, as in ``log_hash``): CUDA
errors are reported asynchronously ("the stacktrace below might be
incorrect"), so a ``type`` match policy needs it.

Normalization (:func:`normalize`), in order: ANSI colours; the caller's known
request ids and engine ids (``chatcmpl-...``, ``cmpl-...``) -> ``<REQ>``;
UUIDs -> ``<UUID>``; timestamps -> ``<TS>``; URLs -> ``<URL>``; absolute
paths -> ``<PATH>``; ``0x...`` -> ``<ADDR>``; numbers in scientific
notation -> ``<N>``; long hex words (hashes, ids) -> ``<HEX>``; rank and
device handles (``TP6``, ``rank3``, ``GPU0``) -> ``TP<N>``...; every other
number not glued to a letter (pids, node numbers, ``VllmWorker-6``, sizes,
shapes, token counts, exit codes) -> ``<N>``;
whitespace collapsed; cut at 240 characters. Digits inside identifiers
(``fp8``, ``gfx950``, ``float16``) are kept.

This module reads text and computes values; it never touches the server.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal as _signal
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from replayer.errors import OptionError
from replayer.monitor.logs import (
    ANSI,
    HASHED_EVENTS,
    PATH,
    SPACE,
    TIMESTAMP,
    Frame,
    LogLine,
    Traceback,
    find_events,
    gpu_errors,
    iter_lines,
    last_launch,
    scheduler_dumps,
    tracebacks,
)

SIGNATURE_VERSION = 2
"""Bumped whenever a change would give an existing crash a different hash
(2: the hash covers the exit status)."""
LOG_HASH_VERSION = 1
"""The log hash's own version: still 1, so a version-1 hash is a log hash.
Bump it (and :data:`SIGNATURE_VERSION`) when what the log hash reads changes."""
TOP_FRAMES = 3
"""Innermost frames kept (ClusterFuzz's crash state uses three)."""
HASH_CHARS = 12
MESSAGE_CHARS = 240
FAILURE_CLASSES = (
    "process_exit",
    "engine_dead",
    "hang",
    "stream_cut",
    "http_5xx_other",
    "client_error",
    "unhealthy",
)

# -- normalization ---------------------------------------------------------------------

_ENGINE_ID = re.compile(r"\b(?:chatcmpl|cmpl|resp|embd)-[^\s,;'\"()\[\]{}]+")
_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
_SCIENTIFIC = re.compile(r"(?<![A-Za-z_\d.])\d+(?:\.\d+)?[eE][-+]?\d+(?!\w)")
_HEXADDR = re.compile(r"\b0[xX][0-9a-fA-F]+\b")
_HEXWORD = re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
_HANDLE = re.compile(r"(?<![A-Za-z])(TP|DP|EP|PP|rank|GPU|gpu|cuda|hip|device)(\d+)")
_NUMBER = re.compile(r"(?<![A-Za-z_\d.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _known_ids(text: str, request_ids: Collection[str]) -> str:
    for rid in sorted((r for r in request_ids if r), key=len, reverse=True):
        text = text.replace(rid, "<REQ>")
    return text


def normalize(text: str, *, request_ids: Collection[str] = ()) -> str:
    """A message with everything that varies between runs of the same bug
    replaced by placeholders (rules in the module docstring)."""
    s = ANSI.sub("", text)
    s = _known_ids(s, request_ids)
    s = _ENGINE_ID.sub("<REQ>", s)
    s = _UUID.sub("<UUID>", s)
    s = TIMESTAMP.sub("<TS>", s)
    s = _URL.sub("<URL>", s)
    s = PATH.sub("<PATH>", s)
    s = _HEXADDR.sub("<ADDR>", s)
    s = _SCIENTIFIC.sub("<N>", s)  # before hex words: 6.1035e-05 is not a hash
    s = _HEXWORD.sub("<HEX>", s)
    s = _HANDLE.sub(r"\1<N>", s)
    s = _NUMBER.sub("<N>", s)
    s = SPACE.sub(" ", s).strip()
    return s[:MESSAGE_CHARS]


def frame_key(frame: Frame) -> str:
    """``file.py:function``: stable across installs, versions' line numbers and ranks."""
    base = frame.path.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{base}:{frame.func}"


_PLUMBING = (
    "/asyncio/",
    "/concurrent/futures/",
    "/threading.py",
    "/multiprocessing/",
    "/contextlib.py",
    "/functools.py",
    "/runpy.py",
    "<frozen ",
    "torch/nn/modules/module.py",
    "torch/utils/_contextlib.py",
)


def top_frames(frames: Iterable[Frame], n: int = TOP_FRAMES) -> tuple[str, ...]:
    """The innermost ``n`` frames, innermost first, plumbing skipped (unless
    nothing else is left)."""
    inner = list(frames)[::-1]
    useful = [f for f in inner if not any(p in f.path for p in _PLUMBING)] or inner
    return tuple(frame_key(f) for f in useful[:n])


def short_type(exc_type: str) -> str:
    """``vllm.v1.engine.exceptions.EngineDeadError`` -> ``EngineDeadError``;
    ``c10::AcceleratorError`` -> ``AcceleratorError``."""
    return re.split(r"\.|::", exc_type)[-1]


# -- root cause --------------------------------------------------------------------------

_ENGINE_PROC = re.compile(r"^(?:EngineCore|Worker|VllmWorker|WorkerProc|RayWorker)")
_WRAPPER_TYPES = frozenset({"EngineDeadError", "AsyncEngineDeadError", "EngineGenerateError"})
_WRAPPER_MESSAGES = (
    "EngineCore encountered an issue",
    "Engine loop has died",
    "Background loop has errored already",
    "MQLLMEngine is already dead",
)
_EFFECT_TYPES = frozenset({"CancelledError", "KeyboardInterrupt", "SystemExit"})
_EFFECT_MESSAGE = re.compile(
    r"^(?:Worker failed with error|Executor failed|Engine core initialization failed)"
    r"|died unexpectedly|died with exit code"
)


_REQUEST_CLASSES = frozenset({"http_5xx_other", "client_error"})


def _category(tb: Traceback) -> int:
    """0: a cause; 1: an effect of another failure; 2: a dead-engine wrapper."""
    kind = short_type(tb.exc_type)
    if kind in _WRAPPER_TYPES or any(w in tb.message for w in _WRAPPER_MESSAGES):
        return 2
    if tb.chained or kind in _EFFECT_TYPES or _EFFECT_MESSAGE.search(tb.message):
        return 1
    return 0


def root_traceback(
    tbs: Iterable[Traceback], failure_class: str = "engine_dead"
) -> Traceback | None:
    """The traceback that best names the cause (rules in the module docstring)."""
    tbs = list(tbs)
    engine = [t for t in tbs if t.proc is None or _ENGINE_PROC.match(t.proc)]
    if engine:
        return min(engine, key=lambda t: (_category(t), t.index))
    # Only the API server spoke. Its per-request errors (a 400's traceback)
    # can precede an unrelated engine death: for an engine death the wrapper
    # says more than they do, for a per-request failure the latest cause does.
    roots = [t for t in tbs if _category(t) == 0][-1:]
    wrappers = [t for t in tbs if _category(t) == 2][:1]
    effects = [t for t in tbs if _category(t) == 1][:1]
    if failure_class in _REQUEST_CLASSES:
        order = roots + wrappers + effects
    else:
        order = wrappers + roots + effects
    return order[0] if order else None


# -- suspects ----------------------------------------------------------------------------

_ENGINE_PREFIXES = ("chatcmpl-", "cmpl-")
_ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")


def client_request_id(engine_id: str, known: Collection[str] | None = None) -> str:
    """The client's ``X-Request-Id`` behind an engine request id:
    ``chatcmpl-<id>-<8 hex>`` -> ``<id>`` (VLLM.md §1.2). With ``known`` ids,
    the candidate that is one of them wins (older vLLM adds no suffix)."""
    core = engine_id
    for prefix in _ENGINE_PREFIXES:
        if core.startswith(prefix):
            core = core[len(prefix) :]
            break
    stripped = _ENGINE_SUFFIX.sub("", core)
    if known:
        for cand in (stripped, core, engine_id):
            if cand in known:
                return cand
    return stripped


# -- the failing request -----------------------------------------------------------------

FAULT_MARKER = "replayer-fault: "
"""The crash plugin's decision lines (:mod:`replayer.testing.vllm_plugin`)."""
FAILING_EVIDENCE = {
    "fault": "the injected fault's own record",
    "scheduler dump": "the only request the failing step first scheduled (vLLM's scheduler dump)",
}
"""What can name the failing request, strongest first, and how to say it."""


def fired_faults(lines: Iterable[LogLine]) -> list[str]:
    """Engine request ids an injected fault fired on (the crash plugin's
    ``replayer-fault:`` lines with ``fired``), in log order; ``slow`` left
    out (it slows, it does not fail)."""
    out = []
    for ln in lines:
        _, marker, tail = ln.msg.partition(FAULT_MARKER)
        if not marker:
            continue
        try:
            rec = json.loads(tail)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("fired") is not True or rec.get("effect") == "slow":
            continue
        rid = rec.get("request_id")
        if isinstance(rid, str) and rid:
            out.append(rid)
    return out


def failing_request(
    lines: Sequence[LogLine], known: Collection[str] = ()
) -> tuple[str, str] | None:
    """(client request id, evidence) of the request the server was
    processing when it failed, or None when its log does not single one out.

    Strongest first: an injected fault's own record of the request it fired
    on (the last before the end: the one that failed the server); else the
    first scheduler dump (the step that failed), where exactly one request
    was scheduled for the first time (the others had run through earlier
    steps unharmed), or the batch was that one request. A batch of several
    new requests names none: they arrived together, and any could be it."""
    fired = fired_faults(lines)
    if fired:
        return client_request_id(fired[-1], known), "fault"
    dumps = scheduler_dumps(list(lines))
    if dumps:
        new = [r for r in dumps[0] if r.new] or list(dumps[0])
        if len(new) == 1:
            return client_request_id(new[0].engine_id, known), "scheduler dump"
    return None


# -- the signature ---------------------------------------------------------------------


def exit_text(exit_code: int | None, signal: int | None) -> str | None:
    """``code 0``, ``signal SIGABRT``; a negative ``exit_code`` is a signal
    (``subprocess`` convention)."""
    if signal is None and exit_code is not None and exit_code < 0:
        signal = -exit_code
    if signal is not None:
        try:
            return f"signal {_signal.Signals(signal).name}"
        except ValueError:
            return f"signal {signal}"
    return None if exit_code is None else f"code {exit_code}"


def _digest(parts: object) -> str:
    raw = json.dumps(parts, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:HASH_CHARS]


def exit_hash(log_hash: str, exit: str | None) -> str:
    """:attr:`Signature.hash` from its log hash and :func:`exit_text`: the log
    hash itself when the exit is unknown (so that it matches any exit)."""
    if exit is None:
        return log_hash
    return _digest({"v": SIGNATURE_VERSION, "log": log_hash, "exit": exit})


@dataclass(frozen=True, slots=True)
class Signature:
    """What a failure looked like, and a hash of its stable parts.

    Usage::

        sig = signature_from_log(log, failure_class="engine_dead", exit_code=0)
        if matches(sig, target_sig) or matches_regex(sig, r"Code: 700"):
            ...
        json.dumps(sig.to_dict())
    """

    hash: str
    """Stable short hex over the log's stable parts and the exit status (see
    the module docstring)."""
    failure_class: str
    exception: str | None
    """Root-cause exception type, last dotted part; None when no traceback."""
    message: str | None
    """Its first message line, normalized."""
    frames: tuple[str, ...]
    """Innermost first, ``file.py:function``."""
    gpu_errors: tuple[str, ...]
    """Canonical GPU error strings, first-seen order."""
    events: tuple[str, ...]
    """Canonical lifecycle events (hashed and not), first-seen order."""
    exit: str | None
    """``code N`` or ``signal NAME``; None when unknown."""
    suspects: tuple[str, ...]
    """Client request ids in the failing batch, in scheduler-dump order."""
    computed_tokens: dict[str, int] = field(default_factory=dict)
    """``num_computed_tokens`` per suspect, when the dump gave it."""
    coarse_hash: str = ""
    """Hash without message and frames (a ``type``-level match)."""
    text: str = ""
    """One readable paragraph; ``--signature REGEX`` is matched against it."""
    log_hash: str = ""
    """The hash without the exit status (a version-1 signature's hash); empty
    when built: taken to be :attr:`hash`."""
    failing: str | None = None
    """The client request id the server was processing when it failed
    (:func:`failing_request`); None when its log does not single one out."""
    failing_evidence: str | None = None
    """What named :attr:`failing` (:data:`FAILING_EVIDENCE`'s keys)."""

    def __post_init__(self) -> None:
        if not self.log_hash:
            object.__setattr__(self, "log_hash", self.hash)

    @property
    def exit_hashed(self) -> bool:
        """Whether :attr:`hash` tells this exit status from others: False when
        the exit is unknown or the signature predates version 2."""
        return self.hash != self.log_hash

    def __hash__(self) -> int:
        return hash((self.failure_class, self.hash))

    def to_dict(self) -> dict[str, object]:
        return {
            "version": SIGNATURE_VERSION,
            "hash": self.hash,
            "log_hash": self.log_hash,
            "coarse_hash": self.coarse_hash,
            "failure_class": self.failure_class,
            "exception": self.exception,
            "message": self.message,
            "frames": list(self.frames),
            "gpu_errors": list(self.gpu_errors),
            "events": list(self.events),
            "exit": self.exit,
            "suspects": list(self.suspects),
            "computed_tokens": dict(self.computed_tokens),
            "text": self.text,
            "failing_request": self.failing,
            "failing_evidence": self.failing_evidence,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Signature:
        """The inverse of :meth:`to_dict` (e.g. a bundle's ``signature.json``).
        A version-1 dict's hash is its log hash: it never covered the exit."""

        def strs(key: str) -> tuple[str, ...]:
            v = d.get(key) or []
            if not isinstance(v, list):
                raise ValueError(f"signature field {key!r} must be a list")
            return tuple(str(x) for x in v)

        def opt(key: str) -> str | None:
            v = d.get(key)
            return None if v is None else str(v)

        tokens = d.get("computed_tokens") or {}
        if not isinstance(tokens, dict):
            raise ValueError("signature field 'computed_tokens' must be an object")
        version = d.get("version", 1)
        if not isinstance(version, int):
            raise ValueError("signature field 'version' must be an integer")
        full = str(d["hash"])
        log = d.get("log_hash") if version >= 2 else None
        return cls(
            hash=full,
            log_hash=full if log is None else str(log),
            failure_class=str(d["failure_class"]),
            exception=opt("exception"),
            message=opt("message"),
            frames=strs("frames"),
            gpu_errors=strs("gpu_errors"),
            events=strs("events"),
            exit=opt("exit"),
            suspects=strs("suspects"),
            computed_tokens={str(k): int(v) for k, v in tokens.items()},
            coarse_hash=str(d.get("coarse_hash", "")),
            text=str(d.get("text", "")),
            failing=opt("failing_request"),
            failing_evidence=opt("failing_evidence"),
        )


def _text(
    failure_class: str,
    exception: str | None,
    message: str | None,
    frames: tuple[str, ...],
    gpu: tuple[str, ...],
    events: tuple[str, ...],
    exit: str | None,
) -> str:
    head = failure_class + ": "
    if exception is None:
        head += "no traceback"
    else:
        head += exception + (f": {message}" if message else "")
    parts = [head]
    if frames:
        parts.append("at " + " < ".join(frames))
    if gpu:
        parts.append("gpu: " + " | ".join(gpu))
    if events:
        parts.append("events: " + " | ".join(events))
    if exit:
        parts.append("exit: " + exit)
    return "; ".join(parts)


def signature_from_log(
    text: str,
    *,
    failure_class: str,
    exit_code: int | None = None,
    signal: int | None = None,
    request_ids: Collection[str] | None = None,
) -> Signature:
    """The signature of a failure from the server log (the text after the last
    launch marker is used). ``request_ids`` (the trace's ids, optional) are
    scrubbed from messages and used to map engine ids back exactly."""
    if not failure_class:
        raise ValueError("failure_class is required")
    failure_class = str(failure_class)
    known = frozenset(request_ids or ())
    lines = list(iter_lines(last_launch(text)))
    root = root_traceback(tracebacks(lines), failure_class)
    exception = None if root is None else short_type(root.exc_type)
    message = None if root is None else normalize(root.message, request_ids=known)
    frames = () if root is None else top_frames(root.frames)
    gpu = gpu_errors(lines)
    found = find_events(lines)
    events = tuple(found.values())
    hashed_events = sorted(v for k, v in found.items() if k in HASHED_EVENTS)
    exit = exit_text(exit_code, signal)

    suspects: dict[str, None] = {}
    computed: dict[str, int] = {}
    for dump in scheduler_dumps(lines):
        for req in dump:
            rid = client_request_id(req.engine_id, known)
            suspects.setdefault(rid, None)
            if req.num_computed_tokens is not None:
                computed.setdefault(rid, req.num_computed_tokens)

    failing = failing_request(lines, known)
    sole_evidence = root is None and not gpu and not hashed_events
    stable = {
        "v": LOG_HASH_VERSION,
        "class": failure_class,
        "exception": exception,
        "gpu": sorted(gpu),
        "events": hashed_events,
        "exit": exit if sole_evidence else None,
    }
    coarse = _digest(stable)
    log_hash = _digest({**stable, "message": message, "frames": list(frames)})
    return Signature(
        hash=exit_hash(log_hash, exit),
        log_hash=log_hash,
        failure_class=failure_class,
        exception=exception,
        message=message,
        frames=frames,
        gpu_errors=gpu,
        events=events,
        exit=exit,
        suspects=tuple(suspects),
        computed_tokens=computed,
        coarse_hash=coarse,
        text=_text(failure_class, exception, message, frames, gpu, events, exit),
        failing=failing[0] if failing else None,
        failing_evidence=failing[1] if failing else None,
    )


def matches(sig: Signature, other: Signature) -> bool:
    """The same crash: same failure class, and same hash, or same log hash
    when either hash leaves the exit out (unknown, or a version-1 signature)."""
    if sig.failure_class != other.failure_class:
        return False
    if sig.hash == other.hash:
        return True
    both_exits = sig.exit_hashed and other.exit_hashed
    return sig.log_hash == other.log_hash and not both_exits


def compile_signature_regex(pattern: str) -> re.Pattern[str]:
    """The chased signature's regex, checked before any trial runs."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise OptionError("signature", f"{pattern!r} is not a valid regex: {exc}") from None


def matches_regex(sig: Signature, pattern: str | re.Pattern[str]) -> bool:
    """The user's ``--signature REGEX`` searched in :attr:`Signature.text`."""
    rx = compile_signature_regex(pattern) if isinstance(pattern, str) else pattern
    return rx.search(sig.text) is not None
