"""How the monitor watches a target while a replay runs (:class:`WatchConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from replayer._declare import Declared, option


def _urls_problem(urls: tuple[str, ...]) -> str | None:
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    return f"{bad[0]!r}: want an http(s) URL" if bad else None


@dataclass(frozen=True)
class WatchConfig(Declared):
    """Health probes, metrics scraping, the hang watchdog and the settle window."""

    __group__ = "monitor"
    __verbs__ = frozenset({"replay", "check", "bisect", "verify", "soak", "sweep"})

    health_interval: float = option(
        1.0, "poll /health every S seconds (default 1)", metavar="S", gt=0
    )
    health_timeout: float = option(
        2.0, "a /health probe unanswered after S seconds timed out (default 2)", metavar="S", gt=0
    )
    scrape_interval: float = option(
        2.0,
        "scrape /metrics every S seconds into RUN/metrics.arrow (default 2)",
        metavar="S",
        gt=0,
    )
    scrape: tuple[str, ...] = option(
        (),
        "also scrape this Prometheus endpoint (repeatable: node, GPU exporters)",
        metavar="URL",
        check=_urls_problem,
    )
    """Extra Prometheus endpoints (node, GPU exporters)."""
    scrape_target: bool = option(True, "scrape the target's own /metrics", cli=False)
    """Scrape the target's own ``/metrics``."""
    stall_timeout: float = option(
        60.0,
        "hang: no token progress for S seconds while /health stays 200 or stops answering "
        "(pending prefills get S + tokens / --min-prefill-rate)",
        metavar="S",
        gt=0,
    )
    min_prefill_rate: float = option(
        1000.0, "prefill tokens/s any healthy server beats (default 1000)", metavar="TOK_S", gt=0
    )
    """Prefill tokens per second a healthy server always beats (allowance)."""
    settle: float = option(
        10.0,
        "after a failure, watch S seconds more before classifying (default 10)",
        metavar="S",
        ge=0,
    )
    """Seconds to keep probing after a failure before classifying it."""
    health_failures: int = option(
        2, "consecutive 503/refused probes that fail the target", cli=False, ge=1
    )
    """Consecutive 503/refused probes that fail the target on their own."""
    grace: float = option(
        3.0,
        "after the last request, watch S seconds more for a late crash (default 3)",
        metavar="S",
        ge=0,
    )
    """After the last request, keep watching this long: a crash can come seconds
    after its trigger, when nothing is in flight any more."""
    enabled: bool = option(True, "no health polling, scraping or hang watchdog", cli="--no-monitor")
    """False: no monitor at all (the library's ``watch=None``)."""
