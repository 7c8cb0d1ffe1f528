"""How long the event loop was kept from running, measured during a replay.

Everything time-critical in a replay shares one event loop: dispatch at the
scheduled instant, SSE reads (TTFT), health probes, the hang watchdog and
signal handling. A sampler sleeps ``INTERVAL`` and records how late it woke;
the lateness is time the loop spent on something else. ``summary.json``
reports its p99.9 and max, so a run whose timing figures were distorted by
the client says so.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

INTERVAL = 0.005
MAX_SAMPLES = 2_000_000
"""About 2.8 hours at 200 a second; later samples keep only the max."""


class LoopStalls:
    """**Usage**: ``stalls = LoopStalls(); task = stalls.start(); ...;
    stalls.stop(); stalls.summary()``."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-stalls")
        return self._task

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:  # ends by cancellation (stop), once per INTERVAL
            due = loop.time() + INTERVAL
            await asyncio.sleep(INTERVAL)
            late = max(0.0, loop.time() - due)
            self.worst = max(self.worst, late)
            if len(self.samples) < MAX_SAMPLES:
                self.samples.append(late)

    def summary(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        s = sorted(self.samples)

        def q(p: float) -> float:
            return round(1000 * s[min(len(s) - 1, math.ceil(p * len(s)) - 1)], 2)

        return {
            "samples": len(s),
            "interval_ms": INTERVAL * 1000,
            "p50": q(0.5),
            "p99": q(0.99),
            "p99_9": q(0.999),
            "max": round(1000 * self.worst, 2),
        }
