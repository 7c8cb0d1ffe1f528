"""Repro bundles: everything another team needs to reproduce a crash.

A bundle is a directory (and ``DIR.tar.gz``)::

    manifest.json     format and replayer versions, the source trace (path,
                      sha256, requests), the minimal repro's request ids in
                      order, prefix length, signature, reproduction rate,
                      control result, trial count, replay policy, target facts
    trace.arrow       the minimal trace (a replayer trace)
    requests.jsonl    its requests with full bodies, readable, in order
    repro.py          standard-library replay: ``python3 repro.py --url URL``
    server.log        the tail of the crashing server's log
    metrics-before-failure.txt   the last metrics scrape before the crash
    trials.jsonl      the whole search, one line per trial
    README.md         how a stranger reproduces it

No secrets: API keys are never in a trace or a run, and target facts keep
only environment variables whose names carry no KEY/TOKEN/SECRET/PASSWORD.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from replayer._files import output_error, write_atomic
from replayer._version import __version__
from replayer.bundle.diagnose import section as diagnosis_section
from replayer.bundle.files import MANIFEST
from replayer.errors import OutputError
from replayer.target.facts import redact_facts
from replayer.trace.export import jsonl_lines
from replayer.trace.model import RequestRecord
from replayer.trace.reader import Trace
from replayer.trace.subset import write_subset

BUNDLE_FORMAT_VERSION = MANIFEST.version
REPRO_SOURCE = Path(__file__).with_name("repro.py")
LOG_TAIL_BYTES = 256 << 10


def write_bundle(
    out: Path,
    *,
    trace: Trace,
    trace_sha256: str,
    rows: Sequence[int],
    manifest: dict[str, Any],
    server_log: str | None = None,
    metrics_snapshot: str | None = None,
    trials: Sequence[dict[str, Any]] = (),
    edit: Callable[[RequestRecord], RequestRecord] | None = None,
) -> Path:
    """Write (or rewrite) a bundle directory atomically and its tarball;
    ``edit`` rewrites the requests (what the bisect's shrink stage found).

    On a full disk the previous bundle (and tarball) stay as they were, the
    half-written copy is removed and one
    :class:`~replayer.errors.DiskFullError` names the bundle."""
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        _write_bundle(out, tmp, trace, trace_sha256, rows, manifest, server_log,
                      metrics_snapshot, trials, edit)  # fmt: skip
    except OutputError as exc:  # a file inside the copy: name the bundle
        raise type(exc)(out, exc.problem, "free space and rerun") from None
    except OSError as exc:
        raise output_error(exc, out) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_bundle(
    out: Path,
    tmp: Path,
    trace: Trace,
    trace_sha256: str,
    rows: Sequence[int],
    manifest: dict[str, Any],
    server_log: str | None,
    metrics_snapshot: str | None,
    trials: Sequence[dict[str, Any]],
    edit: Callable[[RequestRecord], RequestRecord] | None,
) -> None:
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write_subset(trace, rows, tmp / "trace.arrow", details={"bundle": True}, edit=edit)
    sub = Trace.open(tmp / "trace.arrow")
    with (tmp / "requests.jsonl").open("wb") as f:
        for line in jsonl_lines(sub, tokens=True):
            f.write(line + b"\n")
    ids = [sub.column("request_id")[r] for r in sub.order]
    full = {
        "format_version": BUNDLE_FORMAT_VERSION,
        "replayer_version": __version__,
        "source_trace": {"path": str(trace.path), "sha256": trace_sha256, "requests": len(trace)},
        "requests": ids,
        **manifest,
    }
    if isinstance(full.get("target"), dict):  # a launch's NAME=secret never ships
        full["target"] = redact_facts(full["target"])
    MANIFEST.write(tmp, full)
    shutil.copyfile(REPRO_SOURCE, tmp / "repro.py")
    os.chmod(tmp / "repro.py", 0o755)
    if server_log:
        data = server_log.encode(errors="replace")[-LOG_TAIL_BYTES:]
        (tmp / "server.log").write_bytes(data)
    if metrics_snapshot:
        (tmp / "metrics-before-failure.txt").write_text(metrics_snapshot)
    with (tmp / "trials.jsonl").open("wb") as f:
        for t in trials:
            f.write(orjson.dumps(t) + b"\n")
    rel = manifest.get("reliable")
    if rel:
        (tmp / "reliable").mkdir()
        (tmp / "reliable" / "requests.txt").write_text("".join(f"{r}\n" for r in rel["requests"]))
    (tmp / "README.md").write_text(readme(full))
    if out.exists():
        old = out.with_name(f".{out.name}.old{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)
    _tarball(out)


def refresh(bundle: Path, manifest: dict[str, Any]) -> Path:
    """Rewrite a bundle's manifest, README and tarball after a later step
    (``bundle diagnose``) added to its manifest; the other files stay."""
    MANIFEST.write(bundle, manifest)
    write_atomic(bundle / "README.md", readme(manifest).encode())
    return _tarball(bundle)


TARGET_PACKAGES = ("vllm", "torch", "triton", "amd-aiter", "aiter", "flashinfer-python", "lmcache")
"""Packages the README names first (the rest are in ``manifest.json``)."""


def target_lines(facts: dict[str, Any]) -> list[str]:
    """The README's *Target* facts: versions, container, packages, GPU lines,
    JIT caches and environment (everything else is in ``manifest.json``)."""
    cmd: dict[str, Any] = facts.get("command") or {}
    lines = []
    for key in ("version", "models"):
        if facts.get(key):
            val = facts[key]
            shown = orjson.dumps(val).decode() if not isinstance(val, str) else val
            lines.append(f"- {key}: `{shown[:500]}`")
    box = facts.get("container")
    if box:
        lines.append(
            f"- container ({box.get('runtime')}): `{box.get('image')}`"
            + (f", digest `{box['digest']}`" if box.get("digest") else ", no digest (a tag)")
        )
    pkgs = facts.get("packages") or {}
    if pkgs:
        low = {k.lower(): k for k in pkgs}
        first = [f"{low[n]}=={pkgs[low[n]]}" for n in TARGET_PACKAGES if n in low]
        lines.append(
            f"- packages ({len(pkgs)}, from {facts.get('packages_from')}): "
            + (f"`{', '.join(first)}`" if first else "see `manifest.json`")
        )
    env = facts.get("env") or cmd.get("env")
    if env:
        lines.append(f"- env: `{orjson.dumps(env).decode()[:2000]}`")
    caches = [c for c in facts.get("jit_caches") or [] if c.get("exists")]
    for c in caches:
        lines.append(
            f"- JIT cache {c['name']}: `{c['path']}`, {c.get('files')} files, "
            f"{c.get('bytes', 0) / 1e6:.1f} MB, newest {c.get('newest')}"
        )
    hw = facts.get("hardware") or []
    if hw:
        lines += ["", "What the server log says it runs on:", "", "```", *hw[:20], "```"]
    return lines


def _tarball(bundle: Path) -> Path:
    """``DIR.tar.gz`` next to the directory, written atomically."""
    target = bundle.with_name(bundle.name + ".tar.gz")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(bundle, arcname=bundle.name)
    write_atomic(target, buf.getvalue())
    return target


def bug_line(bug: dict[str, Any]) -> str:
    """One failure a bisect met that is not the one it chased (a journaled
    trial record): where it was met and what it looked like."""
    msg = str(bug.get("message") or "").strip().splitlines()
    return (
        f"trial {bug.get('trial')} ({bug.get('stage')}, {bug.get('size')} requests): "
        f"{bug.get('failure_class') or 'failure'}, signature {bug.get('signature') or '-'}"
        + (f": {msg[0][:200]}" if msg else "")
    )


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def variants_table(report: dict[str, Any] | None) -> list[str]:
    """What makes it go away (``--vary``): the table and its reading, first
    in the README because it is the first thing a kernel team asks."""
    if not report:
        return []
    lines = [
        "## What makes it go away",
        "",
        f"**{_cell(report.get('reading', ''))}**",
        "",
        "| variant | change | crashes/runs | 95% interval | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in [report["control"], *report.get("variants", [])]:
        runs = r.get("runs") or 0
        verdict = r.get("verdict", "")
        if r.get("skipped"):
            verdict = f"skipped: {r['skipped']}"
        elif r.get("error"):
            verdict = f"{verdict}: {str(r['error']).splitlines()[0][:120]}"
        elif r.get("settled"):
            verdict += f" (settled after {r['settled']} run(s))"
        change = f"`{_cell(r['change'])}`" if r.get("change") else "-"
        if r is report["control"]:
            change = "(as launched)"
        if r.get("note"):
            change += f" ({_cell(r['note'])})"
        lines.append(
            f"| {_cell(r['name'])} | {change} | "
            + (f"{r['crashes']}/{runs} | {r['low']:.0%}-{r['high']:.0%}" if runs else "- | -")
            + f" | {_cell(verdict)} |"
        )
    src = report["control"].get("source")
    lines += [
        "",
        f"Each variant ran {report.get('runs')} time(s), or stopped once it had crashed and "
        "no further passes could make it rarer (settled); the control row is the unmodified "
        + {"confirm": "launch's confirm runs", "verify": "launch's verify runs"}.get(
            src or "", "launch"
        )
        + ". *gone*: no crash, with the 95% upper bound below the control's lower bound; "
        "*quiet*: no crash, too few runs to say gone. Each launch is in `manifest.json`.",
        "",
    ]
    return lines


def _shrunk(report: dict[str, Any] | None) -> list[str]:
    """The threshold the shrink stage found: "at what context length?"."""
    if not report:
        return []
    return [
        f"The requests are shrunk inside (request `{report.get('request')}` crashes): "
        f"**{_cell(report.get('text', ''))}**. `requests.jsonl` holds the shrunk bodies.",
        "",
    ]


def reliability(m: dict[str, Any]) -> list[str]:
    """How often it crashes, against the floor, and which result to hand
    over: a kernel engineer decides from this how many runs to budget."""
    rep = m.get("reproduction") or {}
    if not rep.get("runs"):
        return []
    floor = m.get("floor")
    lines = ["## Reliability", "", f"- these requests: {rep.get('text')}"]
    if floor is not None:
        under = m.get("status") == "below_floor"
        lines.append(
            f"- floor: {floor:.0%}; "
            + ("**below it: not a reproducer**" if under else "above it: a reproducer")
        )
    rel = m.get("reliable")
    if rel:
        lines.append(
            f"- the smallest candidate seen crashing often: {rel['size']:,} requests, "
            f"{rel['reproduction']['text']} (`reliable/requests.txt` lists them)"
        )
    if m.get("hand_over"):
        lines.append(f"- hand over: {m['hand_over']}")
    return [*lines, ""]


def signature_line(e: dict[str, Any]) -> str:
    """``chased exit 3f9a…: ended 14 of 40 runs (35%); 6/10 confirm runs``."""
    what = f"{e.get('class') or 'failure'} {e.get('signature') or '-'}"
    line = (
        f"{'chased ' if e.get('chased') else ''}{what}: ended {e['runs']} of {e['of']} runs "
        f"({e['fraction']:.0%})"
    )
    c = e.get("confirm")
    if c:
        line += f"; {c['runs']}/{c['of']} confirm runs"
    if e.get("message"):
        line += f" — {e['message']}"
    return line


def signatures_seen(seen: list[dict[str, Any]] | None) -> list[str]:
    """Every failure the search met with the fraction of runs it ended:
    slippage (another crash taking over) shows here first."""
    if not seen:
        return []
    return ["## Signatures seen", "", *(f"- {_cell(signature_line(e))}" for e in seen), ""]


def readme(m: dict[str, Any]) -> str:
    """The bundle's README: what crashed, and how to see it crash."""
    sig = m.get("signature") or {}
    rep = m.get("reproduction") or {}
    ctl = m.get("control") or {}
    pol = m.get("policy") or {}
    facts = m.get("target") or {}
    below = m.get("status") == "below_floor"
    lines = [
        f"# Crash repro: {sig.get('class', 'server failure')}",
        "",
        *_shrunk(m.get("shrink")),
        *variants_table(m.get("variants")),
        *reliability(m),
        *signatures_seen(m.get("signatures_seen")),
        f"{len(m['requests'])} request(s) out of {m['source_trace']['requests']:,} in the "
        f"source trace "
        + (
            "crashed the server during the search, too rarely to call them a reproducer"
            if below
            else "reproduce this crash"
        )
        + (
            f" (the shortest crashing prefix is {m['prefix_length']:,} requests)."
            if m.get("prefix_length")
            else "."
        ),
        "",
        "## Reproduce it",
        "",
        "Start the server the way the target was started (see *Target* below), then, "
        "with any Python 3.9+ and nothing installed:",
        "",
        "```sh",
        "python3 repro.py --url http://HOST:PORT",
        "```",
        "",
        "It replays `requests.jsonl` in the recorded order and timing and exits 1 if the "
        "server failed, 0 if not. With replayer installed, "
        "`replayer bundle verify . --url http://HOST:PORT --runs 10` reports the rate.",
        "",
        "## What crashed",
        "",
        f"- class: `{sig.get('class', '?')}`",
        f"- signature: `{sig.get('hash', '?')}`",
    ]
    if sig.get("text"):
        lines += ["", "```", str(sig["text"]).strip(), "```"]
    if sig.get("suspects"):
        lines += [
            "",
            "Requests named in the crashing batch (vLLM's scheduler dump): "
            + ", ".join(f"`{s}`" for s in sig["suspects"]),
        ]
    if m.get("diagnosis"):
        lines += ["", *diagnosis_section(m["diagnosis"])]
    lines += [
        "",
        "## How often",
        "",
        f"- on the target: {rep.get('text', 'not measured')}",
    ]
    if ctl:
        lines.append(
            f"- on the control ({ctl.get('name', 'control')}): {ctl.get('text', 'not measured')}"
        )
    bugs = m.get("bugs") or []
    if bugs:
        lines += [
            "",
            "## Other failures met",
            "",
            f"The search also met {len(bugs)} failure(s) that are not this crash (a different "
            "class or signature); each may be a bug of its own. The trial's run directory "
            "has its evidence.",
            "",
            *(f"- {bug_line(b)}" for b in bugs),
        ]
    lines += [
        "",
        "## Replay policy",
        "",
        f"timing `{pol.get('timing', 'recorded')}`, speed {pol.get('speed', 1)}, order "
        f"`{pol.get('order', 'strict')}`, streaming forced: {pol.get('force_stream', True)}.",
        "",
        "## Target",
        "",
    ]
    if facts.get("launch"):
        lines += ["Launch command:", "", "```sh", str(facts["launch"]), "```", ""]
    lines += target_lines(facts)
    lines += [
        "",
        "## Files",
        "",
        "- `manifest.json`: everything above, machine-readable",
        "- `trace.arrow`: the minimal trace (`replayer replay trace.arrow --target URL`)",
        "- `requests.jsonl`: the same requests with full bodies",
        "- `server.log`: the tail of the crashing server's log",
        "- `trials.jsonl`: every trial of the search that found this",
        "",
    ]
    return "\n".join(lines)
