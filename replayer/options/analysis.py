"""How runs are compared (:class:`CompareOptions`, :class:`Slo`) and which
concurrency limits a sweep replays (:class:`SweepOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from replayer._declare import Declared, option


def duration_ms(text: str) -> float:
    """``2s``, ``50ms``, ``1m`` or bare seconds, in milliseconds."""
    t = text.strip().lower()
    for suffix, mult in (("ms", 1.0), ("min", 60_000.0), ("m", 60_000.0), ("s", 1000.0)):
        if t.endswith(suffix):
            return float(t[: -len(suffix)]) * mult
    return float(t) * 1000.0


@dataclass(frozen=True)
class Slo(Declared):
    """Bounds a request must meet to count towards goodput (ms; None: no bound)."""

    __verbs__ = frozenset({"compare", "sweep"})

    ttft_ms: float | None = option(None, "time to first token bound, ms", cli=False, ge=0)
    itl_ms: float | None = option(None, "inter-token latency bound, ms", cli=False, ge=0)
    e2e_ms: float | None = option(None, "end-to-end latency bound, ms", cli=False, ge=0)

    def met(self, ttft: float | None, itl: float | None, e2e: float | None) -> bool:
        for bound, v in ((self.ttft_ms, ttft), (self.itl_ms, itl), (self.e2e_ms, e2e)):
            if bound is not None and (v is None or v > bound):
                return False
        return True


def slo_value(text: str) -> Slo:
    """``ttft=2s,itl=50ms,e2e=60s`` (any of the three)."""
    bounds: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "itl", "e2e"):
            raise ValueError(f"wants ttft=2s,itl=50ms,e2e=60s, not {text!r}")
        try:
            bounds[f"{key}_ms"] = duration_ms(value)
        except ValueError:
            raise ValueError(f"{key}: not a duration: {value!r}") from None
    return Slo(**bounds)


@dataclass(frozen=True)
class CompareOptions(Declared):
    """How a difference between two configs is called (bootstrap intervals)."""

    __group__ = "comparison"
    __verbs__ = frozenset({"compare", "sweep"})

    draws: int = option(
        2000, "bootstrap draws per interval (default 2000)", metavar="N", ge=10, le=100_000
    )
    """Bootstrap draws per interval (bounded work, seeded)."""
    level: float = option(0.95, "confidence level (default 0.95)", metavar="L", gt=0, lt=1)
    seed: int = option(0, "bootstrap seed (default 0)")
    min_effect: float = option(
        0.10,
        "call a latency difference only when its interval excludes 1 and lies outside "
        "[1/(1+F), 1+F] (default 0.10: run-to-run wobbles under 10% are not called; 0: any "
        "that excludes 1)",
        metavar="F",
        ge=0,
    )
    """Call a latency difference only when its interval lies outside
    [1/(1+m), 1+m]: the interval must exclude 1 *and* every change under 10%,
    the run-to-run wobble of a replay (machine load, clocks, batch timing) that
    the per-request bootstrap cannot see: two runs of one config on one
    machine differ by that much at the percentiles. Lower it (0: whenever the
    interval excludes 1) when runs are known to be steadier."""
    slo: Slo = option(
        Slo(),
        "goodput counts ok requests within these bounds (default: every ok request)",
        metavar="ttft=2s,itl=50ms,e2e=60s",
        parse=slo_value,
    )
    min_tail: int = option(
        10, "requests beyond a percentile each side needs for an interval", cli=False, ge=1
    )
    """Requests beyond a percentile each side needs for an interval (see
    :mod:`replayer.analysis.bootstrap`): p99 is judged from 1,000 requests on."""
    divergent_listed: int = option(
        20, "divergent requests listed per config (all are counted)", cli=False, ge=0
    )
    """Divergent requests listed per config (all are counted)."""


def limits_value(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"wants N,N,..., not {text!r}") from None
    return values


def _limits_problem(values: tuple[int, ...]) -> str | None:
    if len(values) < 2 or any(v < 1 for v in values) or len(set(values)) != len(values):
        return "wants two or more distinct values >= 1, e.g. 1,2,4,8"
    return None


@dataclass(frozen=True)
class SweepOptions(Declared):
    """The concurrency limits a sweep replays, the first the baseline."""

    __group__ = "sweep"
    __verbs__ = frozenset({"sweep"})

    limits: tuple[int, ...] | None = option(
        None,
        "concurrency limits, e.g. 1,2,4,8,16 (the first is the baseline)",
        metavar="N,N,...",
        cli="--max-inflight",
        parse=limits_value,
        check=_limits_problem,
        required=True,
    )
