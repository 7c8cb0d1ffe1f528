"""Crash injection into a real vLLM: a ``vllm.general_plugins`` entry point.

A fire drill for the whole pipeline: arm it on the launch command of any vLLM
(the CPU build on a laptop, a GPU node before the expensive run) and the
*real* engine fails the way production engines do, under rules written like
the emulator's ``--fault`` specs::

    REPLAYER_VLLM_FAULTS='raise gpu=hip when prompt_tokens>=4000 and cached_tokens>=1024' \\
        vllm serve MODEL ...

It is inert unless ``REPLAYER_VLLM_FAULTS`` (rules, ``;``-separated) or
``REPLAYER_VLLM_ADMISSION_LOG`` is set: registering it costs one environment
lookup per vLLM process. Installing replayer into the vLLM environment
installs the entry point (``pip install replayer``).

Rules are evaluated in the worker, at every model step, on what the
scheduler hands the model runner (``SchedulerOutput``):

===================  ========================================================
``request``          arrival ordinal of a new request at the worker (1-based)
``prompt_tokens``    its prompt length
``cached_tokens``    its prefix-cache hit (``num_computed_tokens`` when first
                     scheduled)
``scheduled_tokens`` tokens scheduled in the step (all requests)
``batch``            requests in the step
``step``             the step's ordinal (1-based)
===================  ========================================================

A rule that names a request variable is evaluated once per new request in the
step; one that names only step variables, once per step.

A rule that names ``abort`` (or ``output_tokens``) fires on client aborts
instead, in EngineCore, where vLLM's scheduler finishes an aborted request
(``Scheduler.finish_requests`` with ``FINISHED_ABORTED``: what
``EngineCore.abort_requests`` does when the API server reports a client
gone, and where a KV connector's ``request_finished`` hook runs, the path
of LMCache's crash on abort). Its variables are the aborted request's:

===================  ========================================================
``abort``            cumulative aborts, this one included (1-based)
``prompt_tokens``    its prompt length
``cached_tokens``    its prefix-cache hit when first scheduled (0 if never)
``output_tokens``    tokens it had generated
``request``          not set (0)
===================  ========================================================

so ``raise when abort>=1 and cached_tokens>=256`` is "EngineCore dies when a
request with 256 cached tokens is aborted". Its effect comes at the abort:
``raise`` from inside the scheduler's abort (EngineCore's fatal-error path),
``exit`` and ``abort`` at once or after ``delay``, ``hang`` blocks EngineCore;
``slow`` is refused. vLLM sends the scheduler an abort for a request whose
stop string the API server matched too: with stop strings in play, not every
abort is a client's.

Effects:

* ``raise`` [gpu=hip|hsa|cuda]: the model runner raises the error a GPU
  kernel fault surfaces as (``Triton Error [HIP]: Code: 700``, an
  ``HSA_STATUS_ERROR_EXCEPTION`` or ``CUDA error: an illegal memory access``).
  vLLM dumps the scheduler output, the engine dies, streams end with an
  error event, the API server exits.
* ``abort`` [node=N]: the worker prints ROCm's ``Memory access fault by GPU
  node-N ...`` line and aborts (``Worker proc VllmWorker-0 died
  unexpectedly``).
* ``exit`` [code=N]: the worker calls ``os._exit(N)``.
* ``hang`` [timeout=S]: the step blocks for ``S`` seconds (default 3600):
  ``/health`` stays 200, no tokens come.
* ``slow`` [add=S steps=N]: every step sleeps ``S`` more seconds (``N``
  steps; 0 = for ever).

Options as in the emulator: ``p=P`` (a draw from this process's generator,
seeded by ``REPLAYER_VLLM_FAULT_SEED`` or at random per launch), ``delay=S``
(the effect comes at the first step ``S`` s later; ``exit`` and ``abort``
come from a timer even if no step runs), ``times=N`` (default 1; 0 =
unbounded), ``name=ID``. Every decision that held is a JSON line on stderr
(``replayer-fault: {...}``) and in ``REPLAYER_VLLM_FAULT_LOG`` when set.

``REPLAYER_VLLM_ADMISSION_LOG=PATH``: EngineCore appends one JSON line per
request it admits (``add_request``), in admission order, with a monotonic
nanosecond stamp: the server-side record of admission order.
:class:`ReceiptMiddleware` (``--middleware
replayer.testing.vllm_plugin.ReceiptMiddleware``) adds the API server's side
to the same file: when each request's headers arrived and when its response
headers left.

The module imports nothing heavy: vLLM's classes are patched when vLLM
imports them (an import hook), in whichever process does.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from replayer.emulator.faults import FaultRule, FaultSpecError, parse_spec

FAULTS_ENV = "REPLAYER_VLLM_FAULTS"
SEED_ENV = "REPLAYER_VLLM_FAULT_SEED"
FAULT_LOG_ENV = "REPLAYER_VLLM_FAULT_LOG"
ADMISSION_LOG_ENV = "REPLAYER_VLLM_ADMISSION_LOG"

REQUEST_VARS = ("request", "prompt_tokens", "cached_tokens")
STEP_VARS = ("scheduled_tokens", "batch", "step")
ABORT_VARS = ("abort", "output_tokens")
"""Naming one makes a rule fire on aborts (in EngineCore), not on steps."""
VARIABLES = REQUEST_VARS + STEP_VARS + ABORT_VARS
CACHED_MEMORY = 65536
"""Requests whose prefix-cache hit EngineCore remembers for abort rules."""
_GPU = ("hip", "hsa", "cuda")


def _gpu(v: str) -> str:
    if v not in _GPU:
        raise ValueError(f"expected one of {', '.join(_GPU)}, got {v!r}")
    return v


EFFECTS: dict[str, dict[str, tuple[Callable[[str], object], object]]] = {
    "raise": {"gpu": (_gpu, "hip")},
    "abort": {"node": (int, 2)},
    "exit": {"code": (int, 1)},
    "hang": {"timeout": (float, 3600.0)},
    "slow": {"add": (float, 0.5), "steps": (int, 0)},
}

GPU_ERRORS = {
    "hip": "Triton Error [HIP]: Code: 700, Messsage: an illegal memory access was encountered",
    "hsa": "HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception. "
    "code: 0x1016",
    "cuda": "CUDA error: an illegal memory access was encountered",
}


def parse_rules(text: str) -> list[FaultRule]:
    """``;``- or newline-separated rules in the emulator's grammar, with this
    plugin's variables and effects."""
    specs = [s.strip() for s in text.replace("\n", ";").split(";") if s.strip()]
    rules = [parse_spec(s, i, variables=VARIABLES, effects=EFFECTS) for i, s in enumerate(specs)]
    for r in rules:
        if not on_abort(r):
            continue
        if r.effect == "slow":
            raise FaultSpecError(f"bad fault rule {r.name}: slow cannot fire on an abort")
        if r.delay > 0 and r.effect not in ("exit", "abort"):
            raise FaultSpecError(
                f"bad fault rule {r.name}: on an abort, only exit and abort take a delay"
            )
        if any(c.var in STEP_VARS for c in r.conditions):
            raise FaultSpecError(f"bad fault rule {r.name}: no step variable at an abort")
    return rules


def on_abort(rule: FaultRule) -> bool:
    """The rule fires on client aborts (it names an abort variable)."""
    return any(c.var in ABORT_VARS for c in rule.conditions)


@dataclass
class _Pending:
    rule: FaultRule
    due: float
    values: dict[str, float]


@dataclass
class Injector:
    """The rules and their state in one process (the worker)."""

    rules: list[FaultRule]
    rng: random.Random
    log_path: str | None = None
    fired: list[int] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    steps: int = 0
    pending: list[_Pending] = field(default_factory=list)
    slow_add: float = 0.0
    slow_left: int = 0
    aborts: int = 0
    cached: dict[str, int] = field(default_factory=dict)
    """Request id -> prefix-cache hit at its first schedule (EngineCore)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.fired = [0] * len(self.rules)

    def before_step(self, scheduler_output: Any) -> None:
        """Decide, then apply what is due (may raise, block or end the process)."""
        self.steps += 1
        new = list(getattr(scheduler_output, "scheduled_new_reqs", None) or ())
        step_vals = {
            "scheduled_tokens": float(getattr(scheduler_output, "total_num_scheduled_tokens", 0)),
            "batch": float(len(getattr(scheduler_output, "num_scheduled_tokens", None) or {})),
            "step": float(self.steps),
        }
        now = time.monotonic()
        for i, rule in enumerate(self.rules):
            if (rule.times and self.fired[i] >= rule.times) or on_abort(rule):
                continue
            per_request = any(c.var in REQUEST_VARS for c in rule.conditions)
            if per_request:
                for req in new:
                    rid = str(getattr(req, "req_id", ""))
                    if rid in self.seen:
                        continue
                    vals = {
                        **step_vals,
                        "request": float(len(self.seen) + 1 + new.index(req)),
                        "prompt_tokens": float(len(getattr(req, "prompt_token_ids", None) or ())),
                        "cached_tokens": float(getattr(req, "num_computed_tokens", 0) or 0),
                    }
                    if self._decide(i, rule, vals, now, rid):
                        break
            else:
                self._decide(i, rule, step_vals, now, None)
        for req in new:
            self.seen.add(str(getattr(req, "req_id", "")))
        self._apply_due(now)

    def scheduled(self, new_reqs: Sequence[Any]) -> None:
        """EngineCore's scheduler handed these out for the first time:
        remember their prefix-cache hits (bounded) for abort rules."""
        for req in new_reqs:
            self.cached[str(getattr(req, "req_id", ""))] = int(
                getattr(req, "num_computed_tokens", 0) or 0
            )
        while len(self.cached) > CACHED_MEMORY:
            del self.cached[next(iter(self.cached))]

    def aborted(self, requests: Sequence[Any]) -> None:
        """The scheduler finished these requests as aborted: evaluate the
        abort rules on each; a fired effect comes now (may raise or end the
        process)."""
        now = time.monotonic()
        for req in requests:
            rid = str(getattr(req, "request_id", ""))
            self.aborts += 1
            vals = {
                "abort": float(self.aborts),
                "request": 0.0,
                "prompt_tokens": float(getattr(req, "num_prompt_tokens", 0) or 0),
                "cached_tokens": float(self.cached.pop(rid, 0)),
                "output_tokens": float(getattr(req, "num_output_tokens", 0) or 0),
            }
            for i, rule in enumerate(self.rules):
                if on_abort(rule):
                    self._decide(i, rule, vals, now, rid)
        due = [p for p in self.pending if on_abort(p.rule)]
        self.pending = [p for p in self.pending if not on_abort(p.rule)]
        for p in due:
            _apply(p.rule)

    def _decide(
        self, i: int, rule: FaultRule, vals: dict[str, float], now: float, rid: str | None
    ) -> bool:
        if rule.times and self.fired[i] >= rule.times:
            return False
        if not all(c.holds(vals) for c in rule.conditions):
            return False
        draw = self.rng.random() if rule.probability < 1 else None
        fired = draw is None or draw < rule.probability
        named = {c.var: vals[c.var] for c in rule.conditions}
        self._log(
            {
                "rule": rule.name,
                "effect": rule.effect,
                "fired": fired,
                "draw": draw,
                "values": named,
                "request_id": rid,
                "step": self.steps,
            }
        )
        if not fired:
            return False
        self.fired[i] += 1
        if rule.delay > 0 and rule.effect in ("exit", "abort"):
            timer = threading.Timer(rule.delay, _apply, args=(rule,))
            timer.daemon = True
            timer.start()
        else:
            self.pending.append(_Pending(rule, now + rule.delay, named))
        return True

    def _apply_due(self, now: float) -> None:
        due = [p for p in self.pending if p.due <= now]
        self.pending = [p for p in self.pending if p.due > now]
        for p in due:
            if p.rule.effect == "slow":
                self.slow_add = p.rule.num("add")
                self.slow_left = int(p.rule.num("steps")) or -1
            else:
                _apply(p.rule)
        if self.slow_left:
            self.slow_left -= 1 if self.slow_left > 0 else 0
            time.sleep(self.slow_add)

    def _log(self, entry: Mapping[str, Any]) -> None:
        line = json.dumps(entry, sort_keys=True)
        print(f"replayer-fault: {line}", file=sys.stderr, flush=True)
        if self.log_path:
            with self.lock, open(self.log_path, "a") as f:
                f.write(line + "\n")


def _apply(rule: FaultRule) -> None:
    effect = rule.effect
    if effect == "raise":
        raise RuntimeError(GPU_ERRORS[str(rule.text("gpu"))])
    if effect == "abort":
        node = int(rule.num("node"))
        print(
            f"Memory access fault by GPU node-{node} (Agent handle: 0x5616f2a0c2f0) on address "
            "0x7f1c3e600000. Reason: Page not present or supervisor privilege.",
            file=sys.stderr,
            flush=True,
        )
        os.abort()
    if effect == "exit":
        sys.stderr.flush()
        os._exit(int(rule.num("code")))
    if effect == "hang":
        deadline = time.monotonic() + rule.num("timeout")
        while time.monotonic() < deadline:  # bounded: the step blocks, then goes on
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


# -- patching vLLM where it is imported ------------------------------------------------


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``patch(module)`` right after vLLM imports the named module."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.patches or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        inner = spec.loader
        patch = self.patches[fullname]

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return inner.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                inner.exec_module(module)
                patch(module)

        spec.loader = _Loader()
        return spec


def _patch_runner(injector: Injector) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        cls = getattr(module, "GPUModelRunner", None)
        if cls is None or getattr(cls.execute_model, "_replayer", False):
            return
        original = cls.execute_model

        def execute_model(self: Any, scheduler_output: Any, *args: Any, **kw: Any) -> Any:
            injector.before_step(scheduler_output)
            return original(self, scheduler_output, *args, **kw)

        execute_model._replayer = True  # type: ignore[attr-defined]
        cls.execute_model = execute_model

    return patch


def _patch_engine_core(path: str) -> Callable[[ModuleType], None]:
    lock = threading.Lock()

    def patch(module: ModuleType) -> None:
        cls = getattr(module, "EngineCore", None)
        if cls is None or getattr(cls.add_request, "_replayer", False):
            return
        original = cls.add_request

        def add_request(self: Any, request: Any, *args: Any, **kw: Any) -> Any:
            line = json.dumps(
                {"ev": "admit", "id": str(request.request_id), "t_ns": time.monotonic_ns()}
            )
            with lock, open(path, "a") as f:
                f.write(line + "\n")
            return original(self, request, *args, **kw)

        add_request._replayer = True  # type: ignore[attr-defined]
        cls.add_request = add_request

    return patch


def _patch_scheduler(injector: Injector) -> Callable[[ModuleType], None]:
    """EngineCore's scheduler: first schedules (cached tokens) and aborts."""

    def patch(module: ModuleType) -> None:
        cls = getattr(module, "Scheduler", None)
        if cls is None or getattr(cls.finish_requests, "_replayer", False):
            return
        schedule0, finish0 = cls.schedule, cls.finish_requests

        def schedule(self: Any, *args: Any, **kw: Any) -> Any:
            out = schedule0(self, *args, **kw)
            injector.scheduled(getattr(out, "scheduled_new_reqs", None) or ())
            return out

        def finish_requests(self: Any, request_ids: Any, finished_status: Any) -> Any:
            live: list[Any] = []
            if request_ids is not None and getattr(finished_status, "name", "") == (
                "FINISHED_ABORTED"
            ):  # None: every request (shutdown, pause), not a client's abort
                if not isinstance(request_ids, str):
                    request_ids = list(request_ids)
                ids = [request_ids] if isinstance(request_ids, str) else request_ids
                for rid in ids:
                    req = self.requests.get(rid)
                    if req is not None and not req.is_finished():
                        live.append(req)
            out = finish0(self, request_ids, finished_status)
            if live:
                injector.aborted(live)
            return out

        schedule._replayer = True  # type: ignore[attr-defined]
        finish_requests._replayer = True  # type: ignore[attr-defined]
        cls.schedule, cls.finish_requests = schedule, finish_requests

    return patch


def register() -> None:
    """The entry point vLLM calls in each of its processes."""
    faults = os.environ.get(FAULTS_ENV, "").strip()
    admission = os.environ.get(ADMISSION_LOG_ENV, "").strip()
    if not faults and not admission:
        return
    patches: dict[str, Callable[[ModuleType], None]] = {}
    if faults:
        try:
            rules = parse_rules(faults)
        except FaultSpecError as exc:
            raise SystemExit(f"{FAULTS_ENV}: {exc}") from None
        seed = os.environ.get(SEED_ENV)
        rng = random.Random(seed if seed is not None else os.urandom(16))
        injector = Injector(rules, rng, os.environ.get(FAULT_LOG_ENV) or None)
        patches["vllm.v1.worker.gpu_model_runner"] = _patch_runner(injector)
        if any(on_abort(r) for r in rules):
            patches["vllm.v1.core.sched.scheduler"] = _patch_scheduler(injector)
    if admission:
        patches["vllm.v1.engine.core"] = _patch_engine_core(admission)
    for name, patch in list(patches.items()):
        if name in sys.modules:  # already imported in this process
            patch(sys.modules[name])
            del patches[name]
    if patches and not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(patches))


class ReceiptMiddleware:
    """ASGI middleware (``--middleware``): when each request's headers arrived
    at the API server and when its response headers left, into
    ``REPLAYER_VLLM_ADMISSION_LOG``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.path = os.environ.get(ADMISSION_LOG_ENV) or None
        self.lock = threading.Lock()

    def _write(self, ev: str, rid: str) -> None:
        if self.path is None:
            return
        line = json.dumps({"ev": ev, "id": rid, "t_ns": time.monotonic_ns()})
        with self.lock, open(self.path, "a") as f:
            f.write(line + "\n")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not str(scope.get("path", "")).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        rid = headers.get(b"x-request-id", b"").decode(errors="replace")
        self._write("receipt", rid)

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                self._write("headers", rid)
            await send(message)

        await self.app(scope, receive, send_wrapper)
