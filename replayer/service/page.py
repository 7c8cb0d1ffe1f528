"""The jobs page: one self-contained HTML table, no scripts, no CDN.

It lists every job (newest first) with its state, outcome and links to its
log, files, bundle and report; a bisect on a pool also what each of its
servers is doing (``2 running trial 12 · 3 restarting · 4 failed: reason``).
Everything interpolated is escaped; the page is served with a
Content-Security-Policy that forbids scripts entirely.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from replayer._version import __version__
from replayer.service.jobs import Job
from replayer.service.pools import servers_line

CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #ddd; }
th { background: #f4f4f4; }
.finished { color: #1a7f37; } .failed, .interrupted { color: #cf222e; }
.running, .cancelling { color: #9a6700; } .queued, .cancelled { color: #57606a; }
code { font-size: 12px; }
"""


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""


def render_jobs(
    jobs: Sequence[Job],
    has_file: Callable[[Job, str], bool],
    servers: Callable[[Job], Sequence[Mapping[str, Any]] | None] | None = None,
) -> str:
    """The page; ``servers(job)``: a pool bisect's servers (progress's
    ``servers``), None for any other job."""
    e = html.escape
    rows = []
    for j in jobs:
        links = [
            f'<a href="/api/jobs/{e(j.id)}">status</a>',
            f'<a href="/api/jobs/{e(j.id)}/log">log</a>',
        ]
        links.append(f'<a href="/api/jobs/{e(j.id)}/files">files</a>')
        if has_file(j, "bundle.tar.gz"):
            links.append(f'<a href="/api/jobs/{e(j.id)}/bundle">bundle</a>')
        if has_file(j, "report.html"):
            links.append(f'<a href="/api/jobs/{e(j.id)}/report">report</a>')
        what = j.inputs.get("trace") or j.inputs.get("bundle") or ""
        detail = j.outcome or j.message or ""
        held = ", ".join(j.targets)
        if j.pool is not None:
            held = ", ".join([f"pool {j.pool}", *j.targets])
            got = servers(j) if servers is not None else None
            if got:
                held += f" ({servers_line(got)})"
        rows.append(
            "<tr>"
            f"<td><code>{e(j.id)}</code></td><td>{e(j.kind)}</td>"
            f'<td class="{e(j.state.value)}">{e(j.state.value)}</td>'
            f"<td>{e(detail[:160])}</td><td>{e(held)}</td>"
            f"<td><code>{e(what)}</code></td><td>{e(j.label or '')}</td>"
            f"<td>{e(_when(j.created_at))}</td><td>{' · '.join(links)}</td>"
            "</tr>"
        )
    body = "\n".join(rows) or '<tr><td colspan="9">no jobs yet</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>replayer jobs</title>
<style>{_STYLE}</style></head>
<body><h1>replayer jobs</h1>
<p>{len(jobs)} job(s) · replayer {e(__version__)} · <a href="/metrics">metrics</a></p>
<table><thead><tr><th>id</th><th>kind</th><th>state</th><th>outcome</th><th>targets</th>
<th>input</th><th>label</th><th>submitted</th><th>links</th></tr></thead>
<tbody>
{body}
</tbody></table></body></html>
"""
