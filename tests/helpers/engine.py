"""The emulator's simulated engine, built and fed in-process (no server, no
simulated time): a sink for its two engine-level effects, an engine with
faults, and a request added by token ids."""

from __future__ import annotations

from replayer.emulator import tokenizer
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.engine import Engine
from replayer.emulator.faults import FaultPlan, parse_spec
from replayer.emulator.metrics import Metrics
from replayer.emulator.requestlog import RequestLog


class Sink:
    """The two engine-level effects, without the server around them."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.applied: list[tuple[str, int | None, list[str]]] = []

    def apply(self, rule, target, dump) -> None:
        assert self.engine is not None
        self.applied.append(
            (rule.effect, target.n if target else None, [r.req_id for r in dump.reqs])
        )
        if rule.effect == "error":
            self.engine.fail(target)
        elif rule.effect == "dead":
            self.engine.die()


def make(faults=(), log=None, **cfg) -> Engine:
    c = EmulatorConfig(speed=0.0, **cfg)
    plan = FaultPlan([parse_spec(s, i) for i, s in enumerate(faults)])
    sink = Sink()
    sink.engine = Engine(c, Metrics(c), plan, RequestLog(log), sink)
    return sink.engine


def add(e: Engine, ids: list[int], max_tokens: int = 4, session: str | None = None):
    stream = tokenizer.ids_stream(ids)
    return e.add(
        engine_id=f"r{e.arrivals + 1}",
        prompt_len=len(ids),
        hashes=tokenizer.block_hashes(stream, e.cfg.block_size),
        max_tokens=max_tokens,
        length_reason="length",
        params_max_tokens=max_tokens,
        session=session,
        log_fields={},
    )
