"""What the analysis tests share: a replay into a run directory against
emulator endpoints (fast watchdog settings), and a copy of a run to change."""

from __future__ import annotations

import asyncio
import shutil

from replayer.monitor.watch import WatchConfig
from replayer.replay.plan import select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.run import replay_to_dir

MODEL = "moonshotai/Kimi-K3"
WATCH = WatchConfig(health_interval=0.1, scrape_interval=0.2, settle=1.0, grace=0.3)


def replay(trace, targets, out, *, save_output=True, timing=Timing.ASAP, max_inflight=None):
    out.mkdir(parents=True)
    policy = ReplayPolicy(timing=timing, save_output=save_output, max_inflight=max_inflight)
    return asyncio.run(
        replay_to_dir(
            trace, select(trace), policy, targets, out, command=["test"], progress=False,
            watch=WATCH,
        )
    )  # fmt: skip


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst
