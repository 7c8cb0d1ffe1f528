"""The simulated engine: a vLLM-v1-shaped scheduler over a simulated KV cache.

Each *step* builds a batch under ``--max-num-batched-tokens``: running
requests first (one decode token each, or the next chunk of a chunked
prefill), then waiting requests in FIFO order while ``--max-num-seqs`` and
free blocks allow. With ``--no-enable-chunked-prefill`` a waiting prompt is
admitted only whole: it waits for a step with room for all of it, or runs
alone when it is longer than the budget (vLLM refuses such a launch; the
emulator does not check). A running request that cannot get a block preempts the
most recently admitted one (recompute preemption: its blocks are freed, it
goes back to the front of the queue and later re-prefills, reusing whatever
of its prompt is still cached); no new request is admitted in a step that
preempted. The step then "runs" for a simulated time::

    (decode_time * (1 + batch_slowdown * (decoders - 1)) + prefill_tokens / prefill_rate)
        * slow_factor / speed + slow_add

(zero with ``--speed instant``), after which every request whose tokens are
all computed samples one token. Full prompt blocks enter the prefix cache
once computed.

**Prefix-cache lookups happen when a request reaches the engine** (vLLM does
it at first scheduling): the hit blocks are pinned then, so the
``cached_tokens`` that the request log records, that fault triggers test and
that ``usage`` reports are one number. As in vLLM the hit stops one token
short of the whole prompt, at a block boundary.

**Fault hooks.** The engine evaluates the fault plan when a request arrives
and when it preempts one, logs each decision, and queues fired effects; a
queued effect is applied once the next batch is scheduled (a long simulated
step is cut short for it) by the :class:`EffectSink` the server supplies. The
engine offers the primitives those effects need: :meth:`die`,
:meth:`hang`, :meth:`fail`, :meth:`cut`, :meth:`slow_down`.

It is deterministic for a given arrival order and ``--seed``. It knows
nothing of HTTP, JSON bodies or the wire format.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from replayer._async import spawn
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.faults import FaultPlan, FaultRule, Value, env_values
from replayer.emulator.kvcache import Block, BlockPool
from replayer.emulator.logs import BatchDump, ReqDump
from replayer.emulator.metrics import Metrics
from replayer.emulator.request import DEAD, FINISHED, INTERNAL, RUNNING, WAITING, Request
from replayer.emulator.requestlog import RequestLog


class EffectSink(Protocol):
    """Applies a fired rule's effect (implemented by the server runtime)."""

    def apply(self, rule: FaultRule, target: Request | None, dump: BatchDump) -> None: ...


@dataclass(slots=True)
class _Pending:
    rule: FaultRule
    target: Request | None


class Engine:
    """Scheduler, KV cache and fault hooks. Call :meth:`start` inside a loop.

    Usage::

        engine = Engine(cfg, metrics, plan, reqlog, sink)
        engine.start()                       # or drive it with engine.step() in tests
        req = engine.add(engine_id="chatcmpl-x-1", prompt_len=n, hashes=h, max_tokens=16,
                         length_reason="length", params_max_tokens=16, session=None,
                         log_fields={"seq": 1})
        out = await req.next()
    """

    def __init__(
        self,
        cfg: EmulatorConfig,
        metrics: Metrics,
        plan: FaultPlan,
        reqlog: RequestLog,
        sink: EffectSink | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.plan = plan
        self.reqlog = reqlog
        self.sink = sink
        # launch settings and environment: fixed, so read once for every decision
        self._launch: dict[str, Value] = {
            **cfg.launch_values(),
            **env_values(plan.rules, cfg.env),
        }
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.block_size, caching=cfg.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.dead = False
        self.hung = False
        self.slow_factor = 1.0
        self.slow_add = 0.0
        self.arrivals = 0
        self.preemptions = 0
        self.aborts = 0
        """Requests the client abandoned (the ``abort`` fault variable)."""
        self.queries = 0
        self.hits = 0
        self.prompt_tokens_done = 0
        self.generated = 0
        self._sessions: dict[str, int] = {}
        self._turns: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._effect = asyncio.Event()
        self._pending: list[_Pending] = []
        self._batch: list[tuple[Request, int]] = []
        self._admitted: dict[int, bool] = {}  # admitted this step: n -> resumed?
        self._task: asyncio.Task[None] | None = None
        self._timers: list[asyncio.TimerHandle] = []

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = spawn(self._run(), name="emulator-engine")

    async def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- requests -----------------------------------------------------------------

    def add(
        self,
        *,
        engine_id: str,
        prompt_len: int,
        hashes: list[bytes],
        max_tokens: int,
        length_reason: str,
        params_max_tokens: int,
        session: str | None,
        log_fields: dict[str, Any],
    ) -> Request:
        """Admit a request to the engine (vLLM's ``add_request``): look up and pin
        its cached prefix, log it, evaluate the fault plan, queue it."""
        self.arrivals += 1
        sidx = turn = 0
        if session is not None:
            sidx = self._sessions.setdefault(session, len(self._sessions) + 1)
            turn = self._turns[session] = self._turns.get(session, 0) + 1
        req = Request(
            n=self.arrivals,
            engine_id=engine_id,
            prompt_len=prompt_len,
            hashes=hashes,
            max_tokens=max_tokens,
            length_reason=length_reason,
            params_max_tokens=params_max_tokens,
            arrival=time.monotonic(),
            session_index=sidx,
            turn=turn,
            text_seed=self._text_seed(hashes, prompt_len),
        )
        values: dict[str, float] = {
            "request": req.n,
            "prompt_tokens": prompt_len,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv_usage": round(self.pool.usage, 6),
            "session": sidx,
            "turn": turn,
        }
        hit = self._lookup(req)
        self.pool.touch(hit)
        req.blocks = hit
        req.num_cached = req.num_computed = len(hit) * self.cfg.block_size
        req.registered = len(hit)
        values["cached_tokens"] = req.num_cached
        values["preemption"] = self.preemptions
        self.queries += prompt_len
        self.hits += req.num_cached
        self.metrics.prefix_queries.inc(prompt_len)
        self.metrics.prefix_hits.inc(req.num_cached)
        self.waiting.append(req)
        self._gauges()
        self.reqlog.write(
            "request",
            **log_fields,
            n=req.n,
            engine_id=engine_id,
            session=session,
            session_index=sidx,
            turn=turn,
            prompt_tokens=prompt_len,
            cached_tokens=req.num_cached,
            max_tokens=max_tokens,
            running=values["running"],
            waiting=values["waiting"],
            kv_usage=values["kv_usage"],
            preemptions=self.preemptions,
        )
        self._evaluate("request", req, values, log_fields.get("seq"))
        self._wake.set()
        return req

    def _text_seed(self, hashes: list[bytes], prompt_len: int) -> int:
        """The output text follows from the prompt (and ``--seed``), as a
        greedy vLLM's does: drawn in admission order, two replays whose
        requests were admitted in another order (strict order fixes what
        the host receives, not what the engine takes first) got different
        texts for the same requests."""
        key = b"%d:%d:%b" % (self.cfg.seed, prompt_len, hashes[-1] if hashes else b"")
        return int.from_bytes(hashlib.blake2b(key, digest_size=2).digest(), "big")

    def _lookup(self, req: Request) -> list[Block]:
        cap = (req.prompt_len - 1) // self.cfg.block_size
        return self.pool.lookup(req.hashes[:cap]) if cap > 0 else []

    def abort(self, req: Request) -> None:
        """The client went away: drop the request and its blocks (logged, with
        the output it had taken: where the client left), then evaluate the
        rules that fire on aborts with the request's values as they were."""
        if req.phase == FINISHED:
            return
        self.aborts += 1
        values = {**self._values(req), "abort": self.aborts}
        self._finish(req, "abort")
        self.reqlog.write(
            "abort",
            n=req.n,
            engine_id=req.engine_id,
            output_tokens=req.num_output,
            delivered=req.delivered,
            aborts=self.aborts,
        )
        self._evaluate("abort", req, values)

    def fail(self, req: Request) -> None:
        """Per-request internal error; the engine stays alive."""
        if req.phase == FINISHED:
            return
        self._finish(req, "error")
        req.error = INTERNAL
        req.event.set()

    def cut(self, req: Request | None) -> list[Request]:
        """Mark ``req`` (or every live request) to have its connection dropped."""
        victims = [req] if req is not None else [*self.running, *self.waiting]
        for r in victims:
            if r.phase != FINISHED:
                r.cut = True
                r.event.set()
        return victims

    def hang(self) -> None:
        """Stop stepping; running requests keep their blocks and produce nothing."""
        self.hung = True
        self._wake.set()

    def slow_down(self, factor: float, add: float, duration: float | None) -> None:
        self.slow_factor, self.slow_add = factor, add
        if duration is not None:
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(duration, self._recover))

    def _recover(self) -> None:
        self.slow_factor, self.slow_add = 1.0, 0.0

    def die(self) -> None:
        """Engine death: every in-flight request gets the dead-engine error."""
        if self.dead:
            return
        self.dead = True
        for r in [*self.running, *self.waiting]:
            r.error = DEAD
            r.event.set()
        self._wake.set()
        self._effect.set()

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset()

    # -- faults ---------------------------------------------------------------------

    def _values(self, req: Request) -> dict[str, float]:
        """The rule variables of a request as the engine holds it now (an
        abort and a preemption see the same ones)."""
        return {
            "request": req.n,
            "prompt_tokens": req.prompt_len,
            "cached_tokens": req.num_cached,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv_usage": round(self.pool.usage, 6),
            "session": req.session_index,
            "turn": req.turn,
            "preemption": self.preemptions,
        }

    def _evaluate(
        self, event: str, req: Request, values: dict[str, float], seq: object = None
    ) -> None:
        if not self.plan or self.dead:
            return
        for d in self.plan.evaluate(event, {**self._launch, **values}):
            self.reqlog.write(
                "trigger",
                seq=seq,
                n=req.n,
                on=event,
                rule=d.rule.name,
                effect=d.rule.effect,
                when=d.rule.when,
                values=d.values,
                holds=d.holds,
                p=d.rule.probability,
                draw=d.draw,
                fired=d.fired,
                delay=d.rule.delay,
            )
            if d.fired:
                self.arm(d.rule, req)

    def arm(self, rule: FaultRule, target: Request | None) -> None:
        """Queue ``rule``'s effect for the next step, after its delay."""
        if rule.delay > 0:
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(rule.delay, self._queue, rule, target))
        else:
            self._queue(rule, target)

    def _queue(self, rule: FaultRule, target: Request | None) -> None:
        self._pending.append(_Pending(rule, target))
        self._wake.set()
        self._effect.set()

    def _apply_pending(self) -> None:
        self._effect.clear()
        pending, self._pending = self._pending, []
        dump = self.dump()
        for p in pending:
            if self.dead:
                return
            self.reqlog.write(
                "effect",
                rule=p.rule.name,
                effect=p.rule.effect,
                params=dict(p.rule.params),
                n=p.target.n if p.target is not None else None,
            )
            if self.sink is not None:
                self.sink.apply(p.rule, p.target, dump)

    def dump(self) -> BatchDump:
        """The current batch and scheduler stats, for a crash report."""
        reqs = [
            ReqDump(
                req_id=r.engine_id,
                prompt_len=r.prompt_len,
                num_computed=r.num_computed,
                num_scheduled=n,
                num_output=r.num_output,
                max_tokens=r.params_max_tokens,
                new=self._admitted.get(r.n) is False,
                resumed=self._admitted.get(r.n) is True,
            )
            for r, n in self._batch
        ]
        return BatchDump(
            reqs=reqs,
            running=len(self.running),
            waiting=len(self.waiting),
            kv_usage=self.pool.usage,
            queries=self.queries,
            hits=self.hits,
            requests=self.arrivals,
        )

    # -- the step loop ----------------------------------------------------------------

    def step(self) -> list[tuple[Request, int]]:
        """One whole step with no simulated time: schedule, apply due effects,
        complete. The loop does the same around a sleep; tests drive it directly."""
        self._batch = batch = self._schedule()
        if self._pending:
            self._apply_pending()
        if batch and not self.dead and not self.hung:
            self._complete(batch)
        self._batch = []
        return batch

    async def _run(self) -> None:
        while not self.dead:
            if self.hung:
                if self._pending:
                    self._apply_pending()
                else:
                    self._wake.clear()
                    await self._wake.wait()
                continue
            self._batch = batch = self._schedule()
            if self._pending:
                self._apply_pending()  # the GPU fails while running this batch
                if self.dead or self.hung:
                    continue
            if not batch:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._execute(self._step_time(batch))
            if self.dead or self.hung:
                continue
            self._complete(batch)
            self._batch = []

    async def _execute(self, seconds: float) -> None:
        """Sleep through a step. A fault effect that comes due meanwhile ends the
        step early, so it applies to the next batch (which includes any request
        that just arrived - the one a trigger fired on)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._effect.wait(), seconds)

    def _step_time(self, batch: list[tuple[Request, int]]) -> float:
        cfg = self.cfg
        t = 0.0
        if not cfg.instant:
            decoders = sum(1 for r, _ in batch if r.num_computed >= r.prompt_len)
            prefill = sum(n for r, n in batch if r.num_computed < r.prompt_len)
            if decoders:
                t += cfg.decode_time * (1 + cfg.batch_slowdown * (decoders - 1))
            t += prefill / cfg.prefill_rate
            t = t * self.slow_factor / cfg.speed
        return t + self.slow_add

    def _schedule(self) -> list[tuple[Request, int]]:
        budget = self.cfg.max_num_batched_tokens
        batch: list[tuple[Request, int]] = []
        preempted = False
        self._admitted = {}
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            while not self._grow(req, req.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                batch.append((req, n))
                budget -= n
                i += 1
                continue
            break  # req preempted itself: it was the last running request
        now = time.monotonic()
        while self.waiting and budget > 0 and not preempted:
            if len(self.running) >= self.cfg.max_num_seqs:
                break
            req = self.waiting[0]
            if req.preemptions and not req.blocks:
                hit = self._lookup(req)
                self.pool.touch(hit)
                req.blocks = hit
                req.num_computed = len(hit) * self.cfg.block_size
                req.registered = len(hit)
            n = min(req.num_tokens - req.num_computed, budget)
            if not self.cfg.enable_chunked_prefill and n < req.num_tokens - req.num_computed:
                if batch:
                    break  # no chunking: it waits for a step with room for all of it
                n = req.num_tokens - req.num_computed  # longer than any step: alone, whole
            if not self._grow(req, req.num_computed + n):
                break
            self.waiting.popleft()
            req.phase = RUNNING
            self._admitted[req.n] = req.preemptions > 0
            if req.first_scheduled is None:
                req.first_scheduled = now
                self.metrics.queue_time.observe(now - req.arrival)
            self.running.append(req)
            batch.append((req, n))
            budget -= n
        if batch or preempted:
            self._gauges()
        return batch

    def _grow(self, req: Request, tokens: int) -> bool:
        need = -(-tokens // self.cfg.block_size) - len(req.blocks)
        if need <= 0:
            return True
        fresh = self.pool.allocate(need)
        if fresh is None:
            return False
        req.blocks.extend(fresh)
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.pool.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.registered = 0
        req.phase = WAITING
        req.preemptions += 1
        self.waiting.appendleft(req)
        self.preemptions += 1
        self.metrics.preemptions.inc()
        self.reqlog.write(
            "preemption", n=req.n, engine_id=req.engine_id, preemptions=self.preemptions
        )
        self._evaluate("preemption", req, self._values(req))

    def _complete(self, batch: list[tuple[Request, int]]) -> None:
        now = time.monotonic()
        bs = self.cfg.block_size
        scheduled = 0
        new_tokens = 0
        spec = self.metrics.spec_decode
        for req, n in batch:
            scheduled += n
            if req.phase != RUNNING:
                continue  # aborted or failed during the step
            req.num_computed += n
            full = min(req.num_computed, req.prompt_len) // bs
            for j in range(req.registered, min(full, len(req.hashes))):
                self.pool.register(req.blocks[j], req.hashes[j])
            req.registered = max(req.registered, full)
            if req.num_computed < req.num_tokens:
                continue  # mid-prefill chunk
            req.num_output += 1
            new_tokens += 1
            if spec is not None:  # drafts counted per request, in batch order
                if req.spec_steps is None:
                    req.spec_steps = []
                spec.observe(1, req.spec_steps)
            if req.first_token is None:
                req.first_token = now
                self.prompt_tokens_done += req.prompt_len
                self.metrics.prompt_admitted(req.prompt_len, req.num_cached)
                self.metrics.ttft.observe(now - req.arrival)
            elif req.last_token is not None:
                self.metrics.itl.observe(now - req.last_token)
            req.last_token = now
            if req.num_output >= req.max_tokens:
                self._finish(req, req.length_reason)
            req.event.set()
        self.generated += new_tokens
        self.metrics.generation_tokens.counter.inc(new_tokens)
        self.metrics.iteration.observe(scheduled)
        self._gauges()

    def _finish(self, req: Request, reason: str) -> None:
        if req.phase == RUNNING:
            self.running.remove(req)
        elif req.phase == WAITING:
            self.waiting.remove(req)
        req.phase = FINISHED
        self.pool.free(req.blocks)
        req.blocks = []
        m = self.metrics
        m.success[reason].inc()
        if reason != "abort":
            req.finish = reason
            now = time.monotonic()
            m.e2e.observe(now - req.arrival)
            m.req_prompt.observe(req.prompt_len)
            m.req_generation.observe(req.num_output)
            m.req_max_tokens.observe(req.params_max_tokens)
            m.req_max_generation.observe(req.params_max_tokens)
            m.req_params_n.observe(1)
            m.req_preemptions.observe(req.preemptions)
            if req.first_scheduled is not None:
                m.inference_time.observe(now - req.first_scheduled)
                if req.first_token is not None:
                    m.prefill_time.observe(req.first_token - req.first_scheduled)
                    m.decode_time.observe(now - req.first_token)
                    steps = req.num_output - 1
                    m.tpot.observe((now - req.first_token) / steps if steps > 0 else 0.0)
        self._gauges()
        self._wake.set()

    def _gauges(self) -> None:
        if self.dead:
            return
        m = self.metrics
        m.running.set(len(self.running))
        m.waiting.set(len(self.waiting))
        m.waiting_capacity.set(len(self.waiting))
        m.kv_usage.set(self.pool.usage)
