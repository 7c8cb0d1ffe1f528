"""A replay as a unit of work: trace + selection + policy + targets -> a run
directory. The CLI and bisection trials both go through here.

``RUN/`` holds ``run.json`` (the exact command, trace hash, options, target
facts, replayer version), ``results.arrow`` (streamed while running) and
``summary.json``. Exit codes: 0 every target survived, 1 a target failed,
3 a target was unreachable before the first request. An output file that
cannot be written (a full disk) stops the run at once with one
:class:`~replayer.errors.OutputError` (exit 2); ``results.arrow`` then ends
on its last whole batch and no ``summary.json`` is written.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import gc
import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer._async import spawn
from replayer._files import writing
from replayer._version import __version__
from replayer.errors import ModelNotServed, UsageError
from replayer.monitor.watch import ProcessProbe, WatchConfig
from replayer.replay.client import Endpoint, TargetUnreachable
from replayer.replay.engine import Replay
from replayer.replay.files import RUN, SUMMARY
from replayer.replay.plan import build_plan
from replayer.replay.policy import ReplayPolicy
from replayer.replay.progress import Progress
from replayer.replay.results import Result, ResultsWriter
from replayer.replay.stalls import LoopStalls
from replayer.replay.summary import summarize_target
from replayer.trace.reader import Trace
from replayer.trace.tokens import TokenSpace
from replayer.wire import api_for_path

if TYPE_CHECKING:
    from replayer.replay.observer import ReplayObserver

EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE, EXIT_NOT_EXERCISED = 0, 1, 3, 4
EXIT_INTERRUPTED = 130


@dataclass
class RunOutcome:
    exit_code: int
    summary: dict[str, Any]
    out: Path
    replay: Replay | None = field(default=None, repr=False)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def prepare_out(out: Path | None, force: bool) -> Path:
    """The run directory: new, or empty, or ``--force``; results are never clobbered."""
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / stamp
        n = 1
        while out.exists():
            n += 1
            out = Path("runs") / f"{stamp}-{n}"
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} exists and is not empty (use --force or another --out)")
    with writing(out):
        os.makedirs(out, exist_ok=True)  # a run directory of our own; instant
    return out


def as_replayed(trace: Trace, policy: ReplayPolicy) -> Trace:
    """``trace`` as a replay under ``policy`` reads it: a sibling in the
    policy's token range (with the trace's salt) and body cache bound, so
    the caller's trace keeps its own settings whatever the replay's."""
    tokens = None
    if policy.token_range is not None:
        lo, hi = policy.token_range
        tokens = TokenSpace(lo, hi, trace.tokens.salt)
    return trace.configured(tokens=tokens, body_cache_bytes=policy.body_cache_mb << 20)


def _check_models(trace: Trace, rows: list[int], policy: ReplayPolicy, replay: Replay) -> None:
    if policy.model:
        return
    models = trace.column("model")
    wanted = {models[r] for r in rows if models[r] is not None}
    for name, facts in replay.facts.items():
        missing = sorted(wanted - set(facts.models))
        if missing and facts.models:
            raise ModelNotServed(name, missing, facts.models)


async def replay_to_dir(
    trace: Trace,
    rows: list[int],
    policy: ReplayPolicy,
    targets: list[Endpoint],
    out: Path,
    *,
    command: list[str] | None = None,
    selection: dict[str, Any] | None = None,
    progress: bool = True,
    watch: WatchConfig | None = None,
    processes: dict[str, ProcessProbe] | None = None,
    live: ReplayObserver | None = None,
    server: dict[str, Any] | None = None,
) -> RunOutcome:
    """Replay ``rows`` of ``trace`` into the run directory ``out``.

    ``live`` (``--metrics-port``) sees every result as it is written and the
    replay's state while it runs; without it no metrics code runs. ``server``
    is what run.json records of a server replayer holds (its launch command,
    secrets masked: ``--from-run`` relaunches it)."""
    if not rows:
        raise UsageError("the selection is empty: nothing to replay")
    trace = as_replayed(trace, policy)
    plan = build_plan(trace, rows, policy)
    interrupted = False
    with writing(out):
        os.makedirs(out, exist_ok=True)  # a run directory of our own; instant
    writer = ResultsWriter(out / "results.arrow", on_add=live.observe if live else None)
    prog = Progress(sys.stderr, len(rows)) if progress else None
    replay = Replay(
        trace,
        plan,
        policy,
        targets,
        writer,
        on_tick=prog.update if prog else None,
        watch=watch,
        out=out,
        processes=processes,
    )
    started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")
    run_info: dict[str, Any] = {
        "replayer_version": __version__,
        "command": command if command is not None else sys.argv,
        "started_at": started_at,
        "trace": {
            "path": str(trace.path),
            "requests": len(trace),
            "schema_version": trace.schema_version,
            "provenance": trace.provenance,
        },
        "selection": {**(selection or {}), "count": len(rows)},
        "policy": policy.to_dict(),
        "targets": [{"name": t.name, "url": t.url} for t in targets],
        "watch": watch.to_dict() if watch is not None else None,
    }
    if server is not None:
        run_info["server"] = server
    # hashing a multi-GB trace takes seconds: do it beside the replay
    hashing = spawn(asyncio.to_thread(sha256_file, trace.path), name="trace-sha256")
    try:
        try:
            facts = await replay.preflight()
        except TargetUnreachable as exc:
            run_info["unreachable"] = str(exc)
            run_info["trace"]["sha256"] = await hashing
            RUN.write(out, run_info)
            summary = {"exit_code": EXIT_UNREACHABLE, "unreachable": str(exc), "targets": {}}
            SUMMARY.write(out, summary)
            return RunOutcome(EXIT_UNREACHABLE, summary, out)
        run_info["target_facts"] = {
            n: {"models": f.models, "max_model_len": f.max_model_len} for n, f in facts.items()
        }
        _check_models(trace, rows, policy, replay)
        RUN.write(out, run_info)
        if live is not None:
            live.attach(replay)
        stalls = LoopStalls()
        stalls.start()
        # The trace's columns and the plan are millions of long-lived objects:
        # a full collection walking them stalled the event loop ~50 ms at a
        # time. Frozen for the replay (they are never garbage), thawed after.
        gc.freeze()
        try:
            await replay.run()
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if replay.stopped_for_output and me is not None:
                me.uncancel()  # our own stop, for the output error raised below
            else:
                interrupted = True  # Ctrl-C or SIGTERM: write what was measured, then stop
        finally:
            gc.unfreeze()
            stalls.stop()
    finally:
        writer.close()
        if live is not None:
            live.detach(replay)
        if not hashing.done():
            await hashing
    if replay.output_error is not None:
        # a full disk: the run stopped on it; writing more would only fail again
        raise replay.output_error
    run_info["trace"]["sha256"] = hashing.result()
    run_info["t0_offset_note"] = "result times are microseconds after T0"
    RUN.write(out, run_info)
    paths = trace.column("path")

    def api_of(r: Result) -> str:
        api = api_for_path(paths[r.row])
        return api.value if api is not None else "other"

    targets_summary = {
        name: summarize_target(
            run.results,
            run.failure,
            run.report,
            run.prefix_cache,
            api_of=api_of,
            spec_decode=run.spec_decode,
        )
        for name, run in replay.runs.items()
    }
    for name, t in targets_summary.items():
        _hint_rejection(trace, t)
        run = replay.runs[name]
        t["connections"] = {"opened": run.transport.opened, "before_t0": run.preopened}
    failed = any(t["failed"] for t in targets_summary.values())
    unexercised = [n for n, t in targets_summary.items() if not t["exercised"]]
    code = EXIT_FAILED if failed else EXIT_NOT_EXERCISED if unexercised else EXIT_OK
    if failed and all(
        (t["failure"] or {}).get("class") == "network"
        for t in targets_summary.values()
        if t["failed"]
    ):
        code = EXIT_UNREACHABLE  # the way to a healthy server failed: not a crash
    summary = {"exit_code": EXIT_INTERRUPTED if interrupted else code, "targets": targets_summary}
    summary["exercised"] = not unexercised
    summary["loop_stall_ms"] = stalls.summary()
    workers = replay.body_workers()
    if workers is not None:
        summary["body_workers"] = workers
    if interrupted:
        summary["interrupted"] = True
    SUMMARY.write(out, summary)
    if interrupted:
        raise asyncio.CancelledError
    return RunOutcome(code, summary, out, replay)


def _hint_rejection(trace: Trace, t: dict[str, Any]) -> None:
    """An out-of-vocabulary rejection of a blocks request names the token
    range that made its ids (the trace's default fits no small vocabulary)."""
    f = t.get("first_rejection")
    if not f or "vocabulary" not in (f.get("message") or "").lower():
        return
    if trace.column("kind")[trace.row_of(f["request_id"])] != "blocks":
        return
    lo, hi = trace.tokens.lo, trace.tokens.hi  # policy.token_range is applied already
    f["hint"] = (
        f"blocks requests carry token ids from --token-range {lo}:{hi}; pass a range "
        "inside the model's vocabulary, e.g. --token-range 100:VOCAB_SIZE"
    )
