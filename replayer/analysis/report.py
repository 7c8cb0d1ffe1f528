"""``replayer report``: one self-contained HTML file per run or bisect directory.

What it shows: the run's facts (trace, policy, targets), a per-target summary
table, each failure with its class, message, in-flight requests and crash
signature; a session timeline per target (a Gantt chart of every request,
coloured by status, the failure marked); in-flight requests and the scraped
server gauges (KV cache usage, running, waiting, preemptions) over time; TTFT,
ITL and E2E distributions; schedule lag. A bisect directory (or a bundle) adds
the search: candidate size against trial, by outcome; and shows the first
crashing trial's run.

**The plotting library is plotly.js**, vendored minified in
``replayer/analysis/vendor/`` (MIT; its version, source and license beside
it) and inlined into the page, so ``pip install replayer`` brings it and the
report needs no CDN and no network: it opens from a mail attachment or an
air-gapped lab. The file comes from the ``plotly`` package on PyPI, which is
not a dependency: 64 MB installed for this one 4.8 MB file. Why plotly.js
over the alternatives:

* it is one of the most widely used and actively released browser charting
  libraries (plotly.js 4.x, Plotly Inc. and community), with hover, zoom,
  pan, legend toggling and PNG export built in: a reader can zoom into the
  second before the crash without us writing any interaction code;
* it draws histograms, multi-panel shared-axis time series, log axes and
  Gantt-style segments without plugins, in SVG (no WebGL, so headless
  browsers and remote desktops render it too).

The price is size: ~4.8 MB of JavaScript per report. uPlot (~50 KB) is
faster and smaller but has no histograms, subplots or Gantt drawing without
custom canvas code; for a file people attach to a bug
report, interactivity without extra code wins over bytes.

Large runs stay responsive through point budgets (see
:mod:`replayer.analysis.figures`) and progressive drawing: the tables show at
once, the charts draw one after another while the page scrolls. A
50,000-request report is about 10 MB and draws in a few seconds (7 s in
headless software rendering on the 2-core CI machine).

API for the service and other callers: :func:`render_report` (the HTML as a
string) and :func:`write_report` (atomically to a file). Both only read the
directory.
"""

from __future__ import annotations

import datetime as _dt
import html
from importlib import resources
from pathlib import Path
from typing import Any

from replayer._version import __version__
from replayer.analysis import figures as F
from replayer.analysis.rundir import (
    RunData,
    TargetResults,
    dist_ms,
    is_bisect_dir,
    is_bundle_dir,
    is_run_dir,
    load_manifest,
    load_run,
    load_trials,
    read_samples,
)
from replayer.errors import UsageError

_CSS = """
:root { --fg:#1d2731; --muted:#5f6b76; --line:#e3e8ec; --bad:#c1121f; --ok:#2a9d8f; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: var(--fg); background: #f6f8f9; }
header { background: #1d2731; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 4px; font-size: 20px; font-weight: 600; }
header .sub { color: #b9c4cc; font-size: 13px; word-break: break-all; }
main { padding: 8px 28px 40px; max-width: 1600px; margin: 0 auto; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px;
          margin: 16px 0; padding: 14px 16px; }
h2 { font-size: 16px; margin: 0 0 10px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: right; padding: 4px 8px; border-bottom: 1px solid var(--line);
         white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { color: var(--muted); font-weight: 500; font-size: 12px; }
.tablewrap { overflow-x: auto; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; font-size: 13px; }
.facts dt { color: var(--muted); } .facts dd { margin: 0; word-break: break-all; }
.failure { border-left: 4px solid var(--bad); }
.failure h2 { color: var(--bad); }
.pass { border-left: 4px solid var(--ok); }
code, pre { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
pre { background: #f3f5f7; padding: 8px; overflow-x: auto; white-space: pre-wrap; }
.chart { width: 100%; min-height: 300px; }
.bad { color: var(--bad); font-weight: 600; } .muted { color: var(--muted); }
footer { color: var(--muted); font-size: 12px; padding: 0 28px 24px; }
"""

# Charts are drawn one at a time in page order, yielding to the browser
# between them: the header and tables show at once and the page scrolls while
# a 50,000-request timeline is still being drawn. ``data-rendered`` (the
# number of charts) is set when the last one is done.
_BOOT = """
(function () {
  var figs = JSON.parse(document.getElementById("replayer-figures").textContent);
  var ids = Object.keys(figs);
  var config = {responsive: true, displaylogo: false, scrollZoom: false};
  window.replayerReport = {figures: ids, rendered: 0};
  function next(k) {
    if (k >= ids.length) {
      document.body.setAttribute("data-rendered", String(ids.length));
      return;
    }
    var f = figs[ids[k]];
    Plotly.newPlot(ids[k], f.data, f.layout, config).then(function () {
      window.replayerReport.rendered = k + 1;
      setTimeout(function () { next(k + 1); }, 0);
    });
  }
  next(0);
})();
"""


PLOTLY_JS = "vendor/plotly.min.js"
"""plotly.js, relative to this package (see ``vendor/README.md``)."""


def _plotly_js() -> str:
    return resources.files(__package__).joinpath(PLOTLY_JS).read_text(encoding="utf-8")


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _ms(v: float | int | None) -> str:
    if v is None:
        return "-"
    if v >= 10_000:
        return f"{v / 1000:,.2f} s"
    return f"{v:,.1f}"


def _facts(items: list[tuple[str, Any]]) -> str:
    rows = "".join(
        f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items if v not in (None, "", [], {})
    )
    return f'<dl class="facts">{rows}</dl>'


def summary_table(run: RunData) -> str:
    head = (
        "<tr><th>target</th><th>requests</th><th>sent</th><th>ok</th><th>errors</th>"
        "<th>not sent</th><th>failure</th><th>req/s</th><th>out tok/s</th>"
        "<th>TTFT p50</th><th>p90</th><th>p99</th><th>ITL p50</th><th>p99</th>"
        "<th>E2E p50</th><th>p99</th><th>lag p50</th><th>p99</th></tr>"
    )
    rows = []
    for name, t in run.targets.items():
        sent = t.sent()
        ok = t.ok()
        span = t.span_s()
        out_tok = sum(t.cols["completion_tokens"][i] or 0 for i in ok)
        d = {m: dist_ms(t.latencies_ms(m)) for m in ("ttft", "itl", "e2e", "lag")}
        f = t.failure
        fail = (
            f'<span class="bad">{_e(f.get("class") or f.get("kind"))}</span>' if f else "survived"
        )
        cells = [
            _e(name),
            f"{len(t):,}",
            f"{len(sent):,}",
            f"{len(ok):,}",
            f"{len(sent) - len(ok):,}",
            f"{len(t) - len(sent):,}",
            fail,
            f"{len(ok) / span:,.2f}" if span else "-",
            f"{out_tok / span:,.0f}" if span else "-",
            *(_ms(d["ttft"][p]) for p in ("p50", "p90", "p99")),
            *(_ms(d["itl"][p]) for p in ("p50", "p99")),
            *(_ms(d["e2e"][p]) for p in ("p50", "p99")),
            *(_ms(d["lag"][p]) for p in ("p50", "p99")),
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (
        '<section id="summary"><h2>Summary</h2><div class="tablewrap"><table>'
        f"{head}{''.join(rows)}</table></div>"
        '<p class="muted">Latencies in ms (s where marked), nearest-rank percentiles of the ok '
        "requests; throughput over first dispatch to last completion.</p></section>"
    )


def failure_section(t: TargetResults, signature: dict[str, Any] | None) -> str:
    f = t.failure
    if f is None:
        return ""
    items: list[tuple[str, Any]] = [
        ("class", f.get("class") or "-"),
        ("kind", f.get("kind")),
        ("at", f"{f.get('at_s', 0):.3f} s after T0"),
        ("first failing request", f.get("request_id") and f"{f['request_id']} (#{f.get('seq')})"),
        ("message", f.get("message")),
        ("in flight then", ", ".join(f.get("inflight") or [])),
        ("completed just before", ", ".join((f.get("recent") or [])[-5:])),
    ]
    sig = signature or f.get("signature")
    if isinstance(sig, dict):
        items.append(("signature", f"{sig.get('hash')}: {sig.get('text')}"))
        if sig.get("suspects"):
            items.append(("suspects (vLLM dump)", ", ".join(sig["suspects"])))
    return (
        f'<section class="failure"><h2>{_e(t.name)} failed: {_e(f.get("class") or f.get("kind"))}'
        f"</h2>{_facts(items)}</section>"
    )


def run_facts(run: RunData) -> str:
    info = run.info
    tr = info.get("trace") or {}
    pol = info.get("policy") or {}
    facts = info.get("target_facts") or {}
    targets = ", ".join(
        f"{t.name} = {t.url or '?'}"
        + (
            f" (max_model_len {facts[t.name].get('max_model_len')})"
            if isinstance(facts.get(t.name), dict) and facts[t.name].get("max_model_len")
            else ""
        )
        for t in run.targets.values()
    )
    policy = ", ".join(
        f"{k} {pol[k]}"
        for k in ("timing", "order", "speed", "max_inflight", "mode")
        if pol.get(k) is not None
    )
    cmd = info.get("command")
    return (
        '<section id="facts"><h2>Run</h2>'
        + _facts(
            [
                ("directory", str(run.path)),
                ("started", info.get("started_at")),
                ("command", " ".join(cmd) if isinstance(cmd, list) else cmd),
                ("trace", f"{tr.get('path')} ({tr.get('requests', '?')} requests)"),
                ("trace sha256", tr.get("sha256")),
                ("selection", (info.get("selection") or {}).get("count")),
                ("policy", policy),
                ("targets", targets),
            ]
        )
        + "</section>"
    )


def _chart(fig_id: str) -> str:
    return f'<section><div class="chart" id="{fig_id}"></div></section>'


def api_table(run: RunData) -> str:
    """Per API, when a run mixes them (from ``summary.json``'s ``by_api``):
    each API's framing has its own TTFT and usage."""
    rows = []
    for name, t in run.targets.items():
        by = t.summary.get("by_api") or {}
        if len(by) < 2:
            continue
        for api, a in by.items():
            st = a.get("status") or {}
            ttft, e2e = a.get("ttft_ms") or {}, a.get("e2e_ms") or {}
            cells = [
                _e(name),
                _e(api),
                f"{a.get('requests', 0):,}",
                f"{st.get('ok', 0):,}",
                _e(", ".join(f"{k} {v:,}" for k, v in st.items() if k != "ok")) or "-",
                _ms(ttft.get("p50")),
                _ms(ttft.get("p90")),
                _ms(e2e.get("p50")),
                f"{a.get('prompt_tokens', 0):,}",
                f"{a.get('cached_tokens', 0):,}",
            ]
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    head = (
        "<tr><th>target</th><th>API</th><th>requests</th><th>ok</th><th>other</th>"
        "<th>TTFT p50</th><th>p90</th><th>E2E p50</th><th>prompt tok</th><th>cached tok</th></tr>"
    )
    return (
        '<section id="by-api"><h2>By API</h2><div class="tablewrap"><table>'
        f"{head}{''.join(rows)}</table></div></section>"
    )


def spec_decode_table(run: RunData) -> str:
    """Speculative decoding per target whose server had it (``summary.json``'s
    ``spec_decode``, from the server's ``vllm:spec_decode_*`` counters)."""
    rows = []
    for name, t in run.targets.items():
        s = t.summary.get("spec_decode")
        if not s:
            continue
        rate, length = s.get("acceptance_rate"), s.get("mean_acceptance_length")
        cells = [
            _e(name),
            f"{s['drafts']:,}",
            f"{s['draft_tokens']:,}",
            f"{s['accepted_tokens']:,}",
            "-" if rate is None else f"{rate:.1%}",
            "-" if length is None else f"{length:.2f}",
            _e(", ".join(f"{n:,}" for n in s.get("accepted_per_position") or [])) or "-",
            _per_request_cell(s.get("per_request")),
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    head = (
        "<tr><th>target</th><th>drafts</th><th>draft tokens</th><th>accepted</th>"
        "<th>acceptance rate</th><th>mean acceptance length</th>"
        "<th>accepted by position</th><th>per request</th></tr>"
    )
    return (
        '<section id="spec-decode"><h2>Speculative decoding</h2><div class="tablewrap"><table>'
        f"{head}{''.join(rows)}</table></div>"
        '<p class="muted">From the server\'s own '
        "counters over the run (vLLM counts them per engine); per request: the requests that "
        "reported their own figures and the p50/p10 of their acceptance rates.</p></section>"
    )


def _per_request_cell(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"

    def pc(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    return (
        f"{p['requests']:,} requests, p50 {pc(p.get('acceptance_rate_p50'))}, "
        f"p10 {pc(p.get('acceptance_rate_p10'))}"
    )


def run_sections(run: RunData, figs: dict[str, F.Figure], prefix: str = "") -> str:
    """Every section of one run; its figures are added to ``figs``."""
    parts = [run_facts(run), summary_table(run), api_table(run), spec_decode_table(run)]
    for t in run.targets.values():
        parts.append(failure_section(t, run.signature))
    for ti, t in enumerate(run.targets.values()):
        fid = f"{prefix}timeline-{ti}"
        figs[fid] = F.gantt(t, ti)
        parts.append(_chart(fid))
    samples = read_samples(run.metrics_path, F.GAUGE_NAMES) if run.metrics_path else {}
    figs[f"{prefix}gauges"] = F.gauges(run, samples)
    figs[f"{prefix}latency"] = F.distributions(run)
    figs[f"{prefix}lag"] = F.lag(run)
    parts += [_chart(f"{prefix}gauges"), _chart(f"{prefix}latency"), _chart(f"{prefix}lag")]
    return "".join(parts)


def _bisect_lead(m: dict[str, Any]) -> str:
    """What a kernel team reads first, before any plot: the threshold, what
    makes it go away, how reliably it crashes, and every signature met
    (the bundle README's opening, the same lines)."""
    from replayer.bundle.export import reliability, signature_line

    parts = ['<section class="failure"><h2>In short</h2>']
    shrink = m.get("shrink") or {}
    if shrink.get("text"):
        parts.append(f"<p><b>{_e(shrink['text'])}</b></p>")
    var = m.get("variants")
    if var:
        parts.append(f"<p><b>{_e(var.get('reading', ''))}</b></p>")
        rows = [var["control"], *var.get("variants", [])]
        parts.append(
            "<table><tr><th>variant</th><th>change</th><th>crashes/runs</th><th>verdict</th></tr>"
            + "".join(
                f"<tr><td>{_e(r.get('name'))}</td><td>{_e(r.get('change') or '-')}</td>"
                f"<td>{_e(r.get('crashes', '-'))}/{_e(r.get('runs', '-'))}</td>"
                f"<td>{_e(r.get('skipped') or r.get('verdict', ''))}</td></tr>"
                for r in rows
            )
            + "</table>"
        )
    rel = [line[2:] for line in reliability(m) if line.startswith("- ")]
    if rel:
        parts.append(
            "<h3>Reliability</h3><ul>"
            + "".join(f"<li>{_e(x.replace('**', ''))}</li>" for x in rel)
            + "</ul>"
        )
    seen = m.get("signatures_seen") or []
    if seen:
        parts.append(
            "<h3>Signatures seen</h3><ul>"
            + "".join(f"<li>{_e(signature_line(e))}</li>" for e in seen)
            + "</ul>"
        )
    return "".join(parts) + "</section>"


def bisect_sections(path: Path, figs: dict[str, F.Figure]) -> tuple[str, str]:
    """(title, sections) of a bisect directory or a bundle."""
    trials = load_trials(path)
    manifest = load_manifest(path)
    parts = []
    if manifest is not None:
        parts.append(_bisect_lead(manifest))
        rep = manifest.get("reproduction") or {}
        ctl = manifest.get("control") or {}
        sig = manifest.get("signature") or {}
        src = manifest.get("source_trace") or {}
        parts.append(
            '<section class="failure"><h2>Bisect result</h2>'
            + _facts(
                [
                    ("status", manifest.get("status")),
                    (
                        "repro",
                        f"{len(manifest.get('requests') or [])} of {src.get('requests', '?')} "
                        f"requests: {', '.join((manifest.get('requests') or [])[:12])}",
                    ),
                    ("reproduction", rep.get("text")),
                    ("control", ctl and f"{ctl.get('name')}: {ctl.get('text')}"),
                    ("signature", sig and f"{sig.get('hash')}: {sig.get('text')}"),
                    ("trials", manifest.get("trials")),
                    ("stages", ", ".join(manifest.get("stages") or [])),
                ]
            )
            + "</section>"
        )
    figs["search"] = F.search(trials)
    parts.append(_chart("search"))
    shown = next(
        (
            r
            for r in trials
            if r.get("outcome") == "MATCH" and r.get("run") and is_run_dir(path / r["run"])
        ),
        None,
    )
    if shown is not None:
        parts.append(
            f'<h2 style="margin-top:28px">The first crashing trial ({_e(shown["run"])}, '
            f"{shown['size']:,} requests)</h2>"
        )
        parts.append(run_sections(load_run(path / shown["run"]), figs, prefix="trial-"))
    return f"bisect {path.name}", "".join(parts)


def render_report(run_dir: Path) -> str:
    """The report of a run directory, a bisect directory or a bundle, as one
    self-contained HTML document (plotly.js inlined; no network needed)."""
    path = Path(run_dir)
    figs: dict[str, F.Figure] = {}
    if is_run_dir(path):
        run = load_run(path)
        failed = [t.name for t in run.targets.values() if t.failure]
        title = f"run {path.name}" + (f" - {', '.join(failed)} failed" if failed else "")
        body = run_sections(run, figs)
    elif is_bisect_dir(path) or is_bundle_dir(path):
        title, body = bisect_sections(path, figs)
    else:
        raise UsageError(
            f"{path}: not a run directory (results.arrow), a bisect directory "
            "(journal.jsonl) or a bundle (manifest.json + trials.jsonl)"
        )
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>replayer: {_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>replayer report: {_e(title)}</h1>"
        f'<div class="sub">{_e(path.resolve())}</div></header>'
        f"<main>{body}</main>"
        f"<footer>replayer {__version__}, {now}; charts by plotly.js (MIT), inlined.</footer>"
        f'<script type="application/json" id="replayer-figures">{F.figure_json(figs)}</script>'
        # plotly.js last: the tables paint before 4.8 MB of script is compiled
        f"<script>{_plotly_js()}</script><script>{_BOOT}</script></body></html>\n"
    )


def write_report(run_dir: Path, out: Path | None = None, *, force: bool = True) -> Path:
    """Write the report (default ``RUN/report.html``) through a temporary file
    and an atomic rename; returns its path."""
    from replayer._files import atomic_output

    path = Path(run_dir)
    target = out if out is not None else path / "report.html"
    text = render_report(path)
    with atomic_output(target, force=force) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return target
