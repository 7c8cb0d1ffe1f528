"""Reading vLLM server logs: launches, records, tracebacks, scheduler dumps.

A vLLM log is several processes writing to one stream (VLLM.md §2.4): the
API server, the EngineCore and one worker per rank. Every line carries a
``(<proc> pid=<pid>)`` prefix and, for logger records, ``<LEVEL> <MM-DD
HH:MM:SS> [<file>:<line>]``; vLLM's ``NewLineFormatter`` repeats the prefix
on every line of a multi-line record, so a traceback can be rebuilt per
process even when other processes' lines interleave with it. Lines that some
runtime printed straight to stderr (the ROCm ``Memory access fault`` line, a
faulthandler dump, an older vLLM without prefixes) are kept with no process.

The log file of a launched target is appended to across restarts, one
:func:`launch_marker` line per launch; :func:`last_launch` returns the part
written by the latest launch, so a crash is never blamed on a previous run.

It also finds the evidence lines a crash detector greps for (VLLM.md §2.4):
GPU error strings (HIP/CUDA errors, ``Memory access fault by GPU``,
``HSA_STATUS_ERROR_*``, Triton HIP codes, NCCL watchdog, device-side asserts,
Xids) and engine lifecycle events (a worker died, start-up failed, the
engine stalled), each as one canonical string with only the volatile parts
(pids, addresses, node numbers, paths, timestamps) replaced; error codes
stay. Lines that may quote prompts (``--enable-log-requests``) or configs
(scheduler dumps) are never taken as evidence.

This module reads; deciding which traceback is the root cause, normalizing
messages and hashing is :mod:`replayer.monitor.signature`'s job.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

MARKER_PREFIX = "==> replayer launch "
_MARKER = re.compile(r"^==> replayer launch \d+ .*$", re.MULTILINE)

# `docker logs -t` timestamps and `docker compose` service prefixes come first.
_OUTER = re.compile(
    r"^(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+)?"
    r"(?:[\w.-]+\s+\|\s)?"
)
# `(EngineCore pid=12)`, `(Worker_TP6_EP6 pid=9)`, older `(VllmWorker rank=0 pid=9)`.
_PROC = re.compile(r"^\((?P<proc>[^\s()]+)(?:\s+rank=\d+)?\s+pid=(?P<pid>\d+)\)\s?")
_RECORD = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?:\d{4}-)?\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s+"
    r"\[(?P<where>[^\]]+)\]\s?(?P<msg>.*)$"
)
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:::[A-Za-z_]\w*)*)(?::\s?(?P<msg>.*))?$")

# Shared with :mod:`replayer.monitor.signature`'s normalization.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TIMESTAMP = re.compile(
    r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"|\b\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?"
    r"|\b\d\d:\d\d:\d\d(?:[.,]\d+)?"
)
PATH = re.compile(r"(?<![\w.])(?:~|\.{1,2})?(?:/[\w.@+\-]+){2,}/?")
SPACE = re.compile(r"\s+")
EVIDENCE_CHARS = 240

TRACEBACK_START = "Traceback (most recent call last):"
_CHAINS = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def launch_marker(n: int, command: str, at: float | None = None) -> str:
    """The line written to a target's log before launch ``n`` (newline included;
    newlines inside ``command`` are escaped so the marker stays one line)."""
    command = command.replace("\r", "\\r").replace("\n", "\\n")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if at is None else at))
    return f"{MARKER_PREFIX}{n} at {stamp}: {command}\n"


def last_launch(text: str) -> str:
    """The text after the last launch marker (all of it when there is none)."""
    marks = list(_MARKER.finditer(text))
    return text if not marks else text[marks[-1].end() + 1 :]


@dataclass(frozen=True, slots=True)
class LogLine:
    """One physical line of a server log, its prefix taken apart."""

    index: int
    """0-based line number in the text that was parsed."""
    proc: str | None
    """Process name from the prefix (``EngineCore``, ``Worker_TP6``); None for raw lines."""
    pid: int | None
    level: str | None
    """Logger level for logger records; None for uvicorn and raw lines."""
    where: str | None
    """``file.py:line`` of the logger call, for logger records."""
    msg: str
    """The line without any prefix or ANSI colour codes."""

    @property
    def stream(self) -> tuple[str | None, int | None]:
        """Which process wrote the line: tracebacks are rebuilt per stream."""
        return (self.proc, self.pid)


def parse_line(index: int, raw: str) -> LogLine:
    line = ANSI.sub("", raw.rstrip("\r\n"))
    outer = _OUTER.match(line)
    if outer is not None and outer.end():
        line = line[outer.end() :]
    proc: str | None = None
    pid: int | None = None
    m = _PROC.match(line)
    if m is not None:
        proc, pid = m["proc"], int(m["pid"])
        line = line[m.end() :]
    r = _RECORD.match(line)
    if r is not None:
        return LogLine(index, proc, pid, r["level"], r["where"], r["msg"])
    return LogLine(index, proc, pid, None, None, line)


def iter_lines(text: str) -> Iterator[LogLine]:
    for i, raw in enumerate(text.splitlines()):
        yield parse_line(i, raw)


@dataclass(frozen=True, slots=True)
class Frame:
    path: str
    line: int
    func: str


@dataclass(frozen=True, slots=True)
class Traceback:
    """A Python traceback rebuilt from one process's lines."""

    proc: str | None
    pid: int | None
    index: int
    """Line number of ``Traceback (most recent call last):``."""
    header: str | None
    """The record that introduced it (``EngineCore encountered a fatal error.``)."""
    frames: tuple[Frame, ...]
    """Outermost first, as Python prints them."""
    exc_type: str
    message: str
    """First line of the exception message (hint lines that follow are dropped)."""
    chained: bool
    """It follows ``The above exception was the direct cause ...`` (it is an effect)."""


class _Stream:
    __slots__ = ("chain", "frames", "header", "last_msg", "start")

    def __init__(self) -> None:
        self.frames: list[Frame] | None = None
        self.start = 0
        self.header: str | None = None
        self.last_msg: str | None = None
        self.chain = False


def tracebacks(lines: list[LogLine]) -> list[Traceback]:
    """Every traceback in log order (by the line of its ``Traceback`` header)."""
    out: list[Traceback] = []
    streams: dict[tuple[str | None, int | None], _Stream] = {}
    for ln in lines:
        st = streams.get(ln.stream)
        if st is None:
            st = streams[ln.stream] = _Stream()
        msg = ln.msg
        if st.frames is None:
            stripped = msg.strip()
            if stripped == TRACEBACK_START:
                st.frames, st.start, st.header = [], ln.index, st.last_msg
            elif stripped in _CHAINS:
                st.chain = True
            elif stripped:
                st.last_msg = stripped
                st.chain = False
            continue
        f = _FRAME.match(msg)
        if f is not None:
            st.frames.append(Frame(f["path"], int(f["line"]), f["func"]))
            continue
        if not msg.strip() or msg[:1].isspace():
            continue  # source lines, ^^^^ markers, exception-group borders
        e = _EXC_LINE.match(msg)
        exc_type, message = (e["type"], e["msg"] or "") if e is not None else (msg.strip(), "")
        out.append(
            Traceback(
                ln.proc,
                ln.pid,
                st.start,
                st.header,
                tuple(st.frames),
                exc_type,
                message.strip(),
                st.chain,
            )
        )
        st.frames, st.chain, st.last_msg = None, False, None
    out.sort(key=lambda t: t.index)
    return out


# -- scheduler dumps (vllm/logging_utils/dump_input.py) ---------------------------------

DUMP_MARKER = "Dumping scheduler output for model execution:"
_NEW_ID = re.compile(r"""req_id=['"]?(?P<id>[^,\s'")]+)""")
_COMPUTED = re.compile(r"num_computed_tokens=(?P<n>\d+)")
_CACHED_IDS = re.compile(r"(?<![\w])req_ids=\[(?P<ids>[^\]]*)\]")
_CACHED_COMPUTED = re.compile(r"num_computed_tokens=\[(?P<ns>[^\]]*)\]")
_QUOTED = re.compile(r"""'([^']*)'|"([^"]*)\"""")
_SCHEDULED = re.compile(r"num_scheduled_tokens=\{(?P<body>[^}]*)\}")


@dataclass(frozen=True, slots=True)
class DumpedRequest:
    """One request of the failing batch, as the engine named it."""

    engine_id: str
    """``chatcmpl-<X-Request-Id>-<8 hex>`` in vLLM 0.33."""
    num_computed_tokens: int | None
    new: bool
    """In ``scheduled_new_reqs`` (first scheduled in this step) rather than cached."""


def _per_item(part: str, head: str) -> list[DumpedRequest]:
    out = []
    for chunk in part.split(head)[1:]:
        m = _NEW_ID.search(chunk)
        if m is None:
            continue
        c = _COMPUTED.search(chunk)
        out.append(DumpedRequest(m["id"], int(c["n"]) if c else None, head == "NewRequestData("))
    return out


def parse_scheduler_dump(msg: str) -> list[DumpedRequest]:
    """The requests named in one ``Dumping scheduler output`` record, new ones
    first, each in dump order."""
    body = msg.split(DUMP_MARKER, 1)[-1]
    new_part, _, cached_part = body.partition("scheduled_cached_reqs=")
    cached_part = cached_part.split("num_scheduled_tokens=", 1)[0]
    reqs = _per_item(new_part, "NewRequestData(")
    if cached_part.lstrip().startswith("["):  # older: a list of per-request objects
        reqs += [
            DumpedRequest(r.engine_id, r.num_computed_tokens, False)
            for r in _per_item(cached_part, "CachedRequestData(")
        ]
    else:
        ids_m = _CACHED_IDS.search(cached_part)
        ids = [a or b for a, b in _QUOTED.findall(ids_m["ids"])] if ids_m else []
        nums_m = _CACHED_COMPUTED.search(cached_part)
        nums = [int(n) for n in re.findall(r"\d+", nums_m["ns"])] if nums_m else []
        for i, rid in enumerate(ids):
            reqs.append(DumpedRequest(rid, nums[i] if i < len(nums) else None, False))
    if not reqs:  # unknown layout: the scheduled-token map still names the batch
        s = _SCHEDULED.search(body)
        if s is not None:
            reqs = [DumpedRequest(a or b, None, False) for a, b in _QUOTED.findall(s["body"])]
    return reqs


def scheduler_dumps(lines: list[LogLine]) -> list[list[DumpedRequest]]:
    """Every scheduler dump in log order (one per failing engine, usually one)."""
    return [parse_scheduler_dump(ln.msg) for ln in lines if DUMP_MARKER in ln.msg]


_LONG_HEX = re.compile(r"\b0[xX][0-9a-fA-F]{6,}\b")
_PID = re.compile(r"\b(pid|tid)([:=]\s*)(?:0[xX])?[0-9a-fA-F]+")


def scrub(text: str) -> str:
    """Light normalization for evidence strings: timestamps, paths, pids and
    addresses go; error codes and other numbers stay (700 is not 719)."""
    s = ANSI.sub("", text)
    s = TIMESTAMP.sub("<TS>", s)
    s = PATH.sub("<PATH>", s)
    s = _PID.sub(r"\1\2<N>", s)
    s = _LONG_HEX.sub("<ADDR>", s)
    return SPACE.sub(" ", s).strip()[:EVIDENCE_CHARS]


def _tidy(text: str) -> str:
    """:func:`scrub`, and the quotes and full stops around a quoted message."""
    return scrub(text).strip(" '\".,;")


# -- evidence: GPU error strings and lifecycle events --------------------------------------

_Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _nccl_timeout(m: re.Match[str]) -> str:
    op = re.search(r"OpType=(\w+)", m["args"] or "")
    return "NCCL watchdog: collective operation timeout" + (f" ({op[1]})" if op else "")


def _triton(m: re.Match[str]) -> str:
    msg = f", Message: {_tidy(m['msg'])}" if m["msg"] else ""
    return f"Triton Error [{m['rt']}]: Code: {m['code']}{msg}"


def _hsa(m: re.Match[str]) -> str:
    rest = _tidy(m["rest"] or "")
    return m["name"] + (f": {rest}" if rest else "")


def _fault(m: re.Match[str]) -> str:
    reason = _tidy(m["reason"] or "")
    head = "Memory access fault by GPU node-<N> on address <ADDR>"
    return head + (f". Reason: {reason}" if reason else "")


_GPU_RULES: tuple[_Rule, ...] = (
    (
        re.compile(r"[Ww]atchdog thread terminated with exception: (?P<rest>.+)"),
        lambda m: "NCCL watchdog terminated: " + _tidy(m["rest"]),
    ),
    (
        re.compile(r"Watchdog caught collective operation timeout(?:: WorkNCCL\((?P<args>.*)\))?"),
        _nccl_timeout,
    ),
    (
        re.compile(r"NCCL error(?: in: \S+)?,\s*(?P<why>[^(\n]+)"),
        lambda m: "NCCL error: " + scrub(m["why"]).strip(" ,."),
    ),
    (
        re.compile(
            r"Triton Error \[(?P<rt>\w+)\]: Code: (?P<code>\d+)(?:, Message: (?P<msg>[^'\"\n]*))?"
        ),
        _triton,
    ),
    (re.compile(r"(?P<name>HSA_STATUS_ERROR_\w+)(?::\s*(?P<rest>[^'\"\n]*))?"), _hsa),
    (
        re.compile(r"Memory access fault by GPU node-\d+.*?(?:Reason: (?P<reason>[^'\"\n]*))?$"),
        _fault,
    ),
    (
        re.compile(r"(?P<file>[\w.]+\.cu):\d+: .*?Assertion `(?P<cond>.*)` failed"),
        lambda m: f"device assertion {m['file']}: `{scrub(m['cond'])}` failed",
    ),
    (
        re.compile(r"\bXid\b(?: \([^)]*\))?:? (?P<code>\d+)"),
        lambda m: f"NVRM Xid {m['code']}",
    ),
    (
        re.compile(r"\b(?P<rt>CUDA|HIP) error: (?P<what>[A-Za-z][A-Za-z0-9 \-]*)"),
        lambda m: f"{m['rt']} error: {m['what'].strip()}",
    ),
    (re.compile(r"illegal memory access"), lambda m: "illegal memory access"),
    (re.compile(r"unspecified launch failure"), lambda m: "unspecified launch failure"),
    (re.compile(r"device-side assert triggered"), lambda m: "device-side assert triggered"),
)


def _echoes_input(msg: str) -> bool:
    """Records that may quote prompts or configs (``--enable-log-requests``,
    scheduler dumps): a prompt about CUDA errors is not a CUDA error."""
    return msg.startswith("Received request ") or DUMP_MARKER in msg or "Dumping input" in msg


def gpu_errors(lines: Iterable[LogLine]) -> tuple[str, ...]:
    """Canonical GPU error strings in first-seen order, each once; at most one
    per line (the most specific rule wins)."""
    seen: dict[str, None] = {}
    for ln in lines:
        if _echoes_input(ln.msg):
            continue
        for pattern, canon in _GPU_RULES:
            m = pattern.search(ln.msg)
            if m is not None:
                seen.setdefault(canon(m), None)
                break
    return tuple(seen)


# -- events ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _EventRule:
    kind: str
    pattern: re.Pattern[str]
    canon: Callable[[re.Match[str]], str]
    hashed: bool


def _worker_died(m: re.Match[str]) -> str:
    code = f" (exit code: {m['code']})" if m["code"] else ""
    return f"worker died unexpectedly{code}"


_EVENT_RULES = (
    _EventRule(
        "worker_died",
        re.compile(r"Worker proc \S+ died unexpectedly(?:.*?\(exit code: (?P<code>-?\d+)\))?"),
        _worker_died,
        True,
    ),
    _EventRule(
        "engine_died",
        re.compile(
            r"Engine core process \S+ died unexpectedly|engine core exited unexpectedly"
            r"|Process \S+ \(PID: \d+\) died with exit code"
        ),
        lambda m: "engine core process died",
        True,
    ),
    _EventRule(
        "fatal_python_error",
        re.compile(r"Fatal Python error: (?P<what>.+)"),
        lambda m: "Fatal Python error: " + _tidy(m["what"]),
        True,
    ),
    _EventRule(
        "startup_failed",
        re.compile(r"EngineCore failed to start|Engine core initialization failed"),
        lambda m: "engine start-up failed",
        True,
    ),
    _EventRule(
        "startup_timeout",
        re.compile(r"Timed out waiting for engine core processes to start"),
        lambda m: "engine start-up timed out",
        True,
    ),
    _EventRule(
        "rpc_timeout",
        re.compile(r"RPC call to (?P<what>\w+) timed out"),
        lambda m: f"RPC call to {m['what']} timed out",
        True,
    ),
    _EventRule(
        "hang_warning",
        re.compile(r"No available shared memory broadcast block found in"),
        lambda m: "no shared memory broadcast block (engine stalled)",
        False,
    ),
    _EventRule(
        "request_failed",
        re.compile(r"Request \S+ failed with an internal error during generation"),
        lambda m: "request failed with an internal error",
        False,
    ),
)
HASHED_EVENTS = frozenset(r.kind for r in _EVENT_RULES if r.hashed)


def find_events(lines: Iterable[LogLine]) -> dict[str, str]:
    """``kind -> canonical text`` of the first line of each event kind."""
    out: dict[str, str] = {}
    for ln in lines:
        if _echoes_input(ln.msg):
            continue
        for rule in _EVENT_RULES:
            if rule.kind in out:
                continue
            m = rule.pattern.search(ln.msg)
            if m is not None:
                out[rule.kind] = rule.canon(m)
    return out
