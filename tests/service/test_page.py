"""The jobs page: one table, newest first as given, links by what exists,
everything interpolated escaped, no script anywhere."""

from __future__ import annotations

import pytest

from replayer._version import __version__
from replayer.service.jobs import Job, JobState
from replayer.service.page import CSP, render_jobs

pytestmark = pytest.mark.inprocess


def job(job_id: str, **kw) -> Job:
    return Job(job_id, kw.pop("kind", "bisect"), [], kw.pop("targets", ["mi355"]), **kw)


def test_no_jobs_yet():
    page = render_jobs([], lambda j, name: False)
    assert '<tr><td colspan="9">no jobs yet</td></tr>' in page
    assert f"<p>0 job(s) · replayer {__version__} · " in page


def test_one_row_a_job_with_links_to_what_it_has():
    jobs = [
        job("j2", inputs={"bundle": "b"}, options={}, state=JobState.FAILED, message="no trace"),
        job("j1", inputs={"trace": "t.arrow"}, options={}, state=JobState.FINISHED,
            outcome="complete", label="mi355 night", targets=["mi355", "b300"], created_at=0),
    ]  # fmt: skip
    page = render_jobs(jobs, lambda j, name: (j.id, name) == ("j1", "bundle.tar.gz"))
    rows = [line for line in page.splitlines() if line.startswith("<tr><td><code>")]
    assert [r.split("</code>")[0].removeprefix("<tr><td><code>") for r in rows] == ["j2", "j1"]
    assert '<td class="failed">failed</td><td>no trace</td>' in rows[0]
    assert '<td class="finished">finished</td><td>complete</td>' in rows[1]
    assert "<td>mi355, b300</td><td><code>t.arrow</code></td><td>mi355 night</td>" in rows[1]
    assert '<a href="/api/jobs/j1/bundle">bundle</a>' in rows[1]
    assert "/bundle" not in rows[0] and "/report" not in page
    assert rows[1].endswith(
        '<a href="/api/jobs/j1">status</a> · <a href="/api/jobs/j1/log">log</a> · '
        '<a href="/api/jobs/j1/files">files</a> · '
        '<a href="/api/jobs/j1/bundle">bundle</a></td></tr>'
    )
    assert "<p>2 job(s) · " in page


def test_everything_interpolated_is_escaped_and_nothing_runs():
    evil = '<script>alert("x")</script>'
    page = render_jobs(
        [job("j1", inputs={"trace": evil}, options={}, label=evil, message=evil)],
        lambda j, name: True,
    )
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") == 3
    assert "script-src" not in CSP and CSP.startswith("default-src 'none'")


def test_a_long_outcome_is_cut_to_160_characters():
    page = render_jobs([job("j1", inputs={}, options={}, outcome="x" * 500)], lambda j, n: False)
    assert f"<td>{'x' * 160}</td>" in page and "x" * 161 not in page
