"""The bisect's bundle: its manifest (what crashed, how often, with what
policy, found how) and the evidence of the last matching run. Rewritten
after every improvement, so a stopped bisect leaves a usable bundle."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer.bisect.confirm import confirm_counts, control_counts
from replayer.bisect.edit import Edit
from replayer.bisect.oracle import Outcome
from replayer.bisect.reliability import hand_over as _hand_over
from replayer.bisect.reliability import signatures_seen
from replayer.bisect.shrink import threshold_line
from replayer.bisect.stats import fisher_one_sided, rate_dict
from replayer.bundle.export import write_bundle
from replayer.replay.run import as_replayed, sha256_file

if TYPE_CHECKING:
    from replayer.bisect.state import Search


def manifest(b: Search, status: str) -> dict[str, Any]:
    k, n = confirm_counts(b)
    m: dict[str, Any] = {
        "status": status,
        "prefix_length": b.prefix_length,
        "signature": signature_dict(b),
        "reproduction": rate_dict(k, n),
        "control": None,
        "trials": b.oracle.trials,
        "bugs": [r.to_json() for r in b.oracle.bugs.values()],
        "policy": {**b.policy.to_dict(), "timing": b.best.timing, "speed": b.best.speed},
        "target": b.facts,
        "stages": b.stages_done,
        "floor": b.opts.min_rate,
        "reliable": b.reliable,
        "hand_over": hand_over(b),
        "signatures_seen": signatures_seen(b),
    }
    cc = control_counts(b)
    if cc is not None and b.control is not None:
        m["control"] = {
            "name": b.control.name,
            **rate_dict(*cc),
            "p_value": fisher_one_sided(k, n, cc[0], cc[1]),
        }
    if b.variants is not None:
        m["variants"] = b.variants  # what makes it go away (--vary)
    if b.shrunk is not None:
        m["shrink"] = shrink_dict(b)
    return m


def hand_over(b: Search) -> str:
    """Which result to give a kernel engineer (empty before any confirm run)."""
    k, n = confirm_counts(b)
    return _hand_over((k, n), b.reliable, b.opts.min_rate) if n else ""


def shrink_dict(b: Search) -> dict[str, Any] | None:
    if b.shrunk is None:
        return None
    return {**b.shrunk, "text": threshold_line(b.shrunk), "edit": b.best.edit}


def signature_dict(b: Search) -> dict[str, Any] | None:
    c = b.chase
    if b.signature is not None:
        return {
            "hash": b.signature.hash,
            "log_hash": b.signature.log_hash,
            "exit": b.signature.exit,
            "class": b.signature.failure_class,
            "text": b.signature.text,
            "suspects": list(b.signature.suspects),
        }
    if c.failure_class or c.regex or c.signature:
        return {
            "hash": c.signature,
            "class": c.failure_class,
            "text": f"regex {c.regex.pattern}" if c.regex else None,
            "suspects": [],
        }
    return None


def write(b: Search, status: str) -> Path | None:
    """The bundle directory (and its tarball), or None with ``bundle=False``."""
    if not b.opts.bundle:
        return None
    log_text = metrics = None
    rec = next(
        (r for r in reversed(b.oracle.history()) if r.outcome is Outcome.MATCH and r.run),
        None,
    )
    if rec is not None:
        run = b.out / (rec.run or "")
        if (run / "server.log").exists():
            log_text = (run / "server.log").read_text(errors="replace")
        snaps = sorted(run.glob("metrics-before-failure-*.txt"))
        if snaps:
            metrics = snaps[0].read_text()
    if not b.trace_sha:
        b.trace_sha = sha256_file(b.trace.path)
    return write_bundle(
        b.out / "bundle",
        # the trials' token range: the bundle's bodies are the ones that crashed it
        trace=as_replayed(b.trace, b.policy),
        trace_sha256=b.trace_sha,
        rows=[b.rows[p] for p in b.best.positions],
        edit=Edit.parse(b.best.edit).apply if b.best.edit else None,
        manifest=manifest(b, status),
        server_log=log_text,
        metrics_snapshot=metrics,
        trials=[r.to_json() for r in b.oracle.history()],
    )
