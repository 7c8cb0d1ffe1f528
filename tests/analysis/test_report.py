"""The HTML report opened in real headless Chromium: no console errors, no
request leaves the file, and every chart holds the series and points the run
directory says it should (counted here from results.arrow and metrics.arrow,
not from the report's own code). A synthetic 50,000-request run stays within
the point budgets and renders; a bisect directory shows its search."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import orjson
import pytest

from replayer.analysis.figures import BINS, MAX_BARS, MAX_LAG_POINTS
from replayer.analysis.report import render_report, write_report
from replayer.monitor.metrics import read_metrics
from replayer.replay.results import Result, ResultsWriter, Status, read_results
from replayer.testing.browser import Chromium

FIGURES_JS = """JSON.stringify(window.replayerReport.figures.map(function (id) {
  var gd = document.getElementById(id);
  return {id: id,
          names: gd.data.map(function (t) { return t.name; }),
          points: gd.data.map(function (t) {
            return t.x.filter(function (v) { return v !== null; }).length; }),
          drawn: gd.querySelectorAll(".scatterlayer .trace, .barlayer .trace").length};
}))"""


async def render(chromium, html: Path, limit=120.0):
    async with Chromium(chromium) as browser:
        page = await browser.new_page()
        await page.goto(html.as_uri(), limit=limit)
        n = int(await page.wait_for("document.body.dataset.rendered", limit=limit))
        figs = {f["id"]: f for f in json.loads(await page.evaluate(FIGURES_JS))}
        assert len(figs) == n
        return page.errors, page.requests, figs


def by_target(results):
    out = {}
    for r in results:
        out.setdefault(r["target"], []).append(r)
    return out


def expected_timeline(rs, failure):
    sent = [r for r in rs if r["seq"] is not None]
    status = Counter(r["status"] for r in sent)
    prefill = sum(
        r["first_token_us"] is not None and r["first_token_us"] > r["dispatched_us"] for r in sent
    )
    want = {"waiting for the first token": 2 * prefill} if prefill else {}
    want.update({f"{s} ({n:,})": 2 * n for s, n in status.items()})
    if failure:
        want[f"failure: {failure['class']}"] = 1
    return want


def inflight_points(rs, failure_at_us):
    last = max(r["done_us"] for r in rs if r["done_us"] is not None)
    times = set()
    for r in rs:
        if r["dispatched_us"] is None:
            continue
        times.add(r["dispatched_us"])
        end = r["done_us"]
        if end is None:
            end = max(r["dispatched_us"], failure_at_us if failure_at_us is not None else last)
        times.add(end)
    return len(times) + (min(times) > 0)


async def test_two_target_crash_report_in_chromium(runs, chromium, tmp_path):
    run = runs["pair"]
    out = write_report(run, tmp_path / "report.html")
    errors, requests, figs = await render(chromium, out)
    assert errors == []
    assert {u.split(":", 1)[0] for u in requests} == {"file"}  # nothing left the machine
    summary = orjson.loads((run / "summary.json").read_bytes())["targets"]
    results = by_target(read_results(run / "results.arrow"))
    assert set(results) == {"mi355", "b300"}
    assert summary["mi355"]["failed"] and not summary["b300"]["failed"]
    metrics = read_metrics(run / "metrics.arrow")
    run_info = orjson.loads((run / "run.json").read_bytes())
    urls = {t["name"]: t["url"] + "/metrics" for t in run_info["targets"]}
    assert set(figs) == {"timeline-0", "timeline-1", "gauges", "latency", "lag"}
    for k, name in enumerate(["mi355", "b300"]):
        f = figs[f"timeline-{k}"]
        want = expected_timeline(results[name], summary[name]["failure"])
        assert dict(zip(f["names"], f["points"], strict=True)) == want
        assert f["drawn"] == len(want)
    # in flight from the results, server gauges one point per scrape
    g = figs["gauges"]
    got = dict(zip(g["names"], g["points"], strict=True))
    assert g["drawn"] == len(got) == 10
    for name in ("mi355", "b300"):
        fail = summary[name]["failure"]
        at = round(fail["at_s"] * 1e6) if fail else None
        assert got[f"{name} in flight"] == inflight_points(results[name], at)
        for label, metric in (("running", "vllm:num_requests_running"),
                              ("waiting", "vllm:num_requests_waiting"),
                              ("KV %", "vllm:kv_cache_usage_perc"),
                              ("preemptions", "vllm:num_preemptions_total")):  # fmt: skip
            scrapes = {m["t"] for m in metrics if m["source"] == urls[name] and m["name"] == metric}
            assert got[f"{name} {label}"] == len(scrapes) > 0, (name, label)
    lat = figs["latency"]
    assert lat["names"] == ["mi355", "b300"] * 3
    assert lat["points"] == [BINS] * 6 and lat["drawn"] == 6
    lag = figs["lag"]
    assert lag["names"] == ["mi355 lag", "b300 lag"]
    assert lag["points"] == [
        sum(r["seq"] is not None for r in results[n]) for n in ("mi355", "b300")
    ]
    # the page says what happened
    html = out.read_text()
    assert f"mi355 failed: {summary['mi355']['failure']['class']}</h2>" in html
    assert "<td>survived</td>" in html


def synthetic_run(out: Path, n: int, crash_at: int) -> Path:
    """A 50,000-request, 700-session run that fails at request ``crash_at``."""
    rng = random.Random(7)
    out.mkdir()
    w = ResultsWriter(out / "results.arrow")
    for i in range(n):
        d = i * 1000 + rng.randrange(500)
        sent = i <= crash_at
        st = Status.OK if i < crash_at and rng.random() > 0.005 else Status.HTTP_ERROR
        if not sent:
            st = Status.NOT_SENT_AFTER_CRASH
        w.add(Result(
            target="mi355", row=i, request_id=f"r{i:06d}", session_id=f"s{i % 700:04d}",
            turn=i // 700, status=st, seq=i if sent else None,
            scheduled_us=d - rng.randrange(300) if sent else None,
            dispatched_us=d if sent else None,
            first_token_us=d + rng.randrange(20_000, 900_000) if st is Status.OK else None,
            done_us=d + rng.randrange(1_000_000, 4_000_000) if sent else None,
            error_class=None if st is Status.OK else "http_500", prompt_tokens=100_000,
            completion_tokens=64, cached_tokens=0, output_hash="0" * 16,
            itl_mean_us=rng.randrange(5_000, 50_000) if st is Status.OK else None,
        ))  # fmt: skip
    w.close()
    failure = {"kind": "http_5xx", "class": "engine_dead", "at_s": (crash_at * 1000 + 3e6) / 1e6,
               "request_id": f"r{crash_at:06d}", "seq": crash_at, "message": "boom"}  # fmt: skip
    (out / "summary.json").write_bytes(
        orjson.dumps({"targets": {"mi355": {"failed": True, "failure": failure}}})
    )
    (out / "run.json").write_bytes(
        orjson.dumps({"targets": [{"name": "mi355", "url": "http://127.0.0.1:1"}]})
    )
    return out


async def test_fifty_thousand_requests_stay_within_budget(chromium, tmp_path):
    run = synthetic_run(tmp_path / "big", 50_000, crash_at=45_000)
    results = read_results(run / "results.arrow")
    bad = {r["request_id"] for r in results if r["seq"] is not None and r["status"] != "ok"}
    html = render_report(run)
    assert len(html) < 12_000_000
    (tmp_path / "big.html").write_text(html)
    errors, _, figs = await render(chromium, tmp_path / "big.html")
    assert errors == []
    t = figs["timeline-0"]
    drawn = dict(zip(t["names"], t["points"], strict=True))
    bars = sum(v for k, v in drawn.items() if not k.startswith(("waiting", "failure"))) // 2
    assert bars <= MAX_BARS
    assert drawn[f"http_error ({len(bad):,})"] == 2 * len(bad)  # every failed one is drawn
    assert drawn["failure: engine_dead"] == 1
    assert figs["lag"]["points"] == [MAX_LAG_POINTS]
    assert figs["latency"]["points"] == [BINS] * 3
    assert all(p <= 2000 for p in figs["gauges"]["points"])
    data = json.loads(html.split('id="replayer-figures">', 1)[1].split("</script>", 1)[0])
    title = data["timeline-0"]["layout"]["title"]["text"]
    assert "45,001 requests sent, 4,999 not sent" in title and "1 in " in title


def bisect_dir(root: Path, trial_run: Path) -> tuple[Path, list[dict]]:
    """A bisect directory: a journal of 9 trials whose first is a real run."""
    root.mkdir()
    (root / "trials").mkdir()
    shutil.copytree(trial_run, root / "trials" / "0001")
    plan = [
        (48, "calibrate", "MATCH"), (48, "calibrate", "MATCH"), (30, "cut", "MATCH"),
        (15, "prefix", "PASS"), (22, "prefix", "MATCH"), (18, "prefix", "OTHER_FAILURE"),
        (20, "prefix", "MATCH"), (4, "sessions", "INFRA"), (6, "sessions", "MATCH"),
    ]  # fmt: skip
    records = []
    with (root / "journal.jsonl").open("wb") as f:
        for k, (size, stage, outcome) in enumerate(plan, 1):
            rec = {"trial": k, "key": f"k{k}", "size": size, "stage": stage, "outcome": outcome,
                   "failure_class": "process_exit" if outcome == "MATCH" else None,
                   "duration_s": 1.5, "run": f"trials/{k:04d}"}  # fmt: skip
            records.append(rec)
            entry = {"event": "trial", "positions": list(range(size)), "timing": "asap",
                     "speed": 1.0, "record": rec}  # fmt: skip
            f.write(orjson.dumps(entry) + b"\n")
            f.write(b'{"event":"time","spent_s":1.0}\n')
    return root, records


async def test_bisect_report_shows_the_search(runs, chromium, tmp_path):
    root, records = bisect_dir(tmp_path / "bisect", runs["pair"])
    out = write_report(root)
    assert out == root / "report.html"
    errors, _, figs = await render(chromium, out)
    assert errors == []
    s = figs["search"]
    outcomes = Counter(r["outcome"] for r in records)
    want = {f"{o} ({n})": n for o, n in outcomes.items()}
    want["best so far"] = len(records)  # defined from the first MATCH (trial 1) on
    assert dict(zip(s["names"], s["points"], strict=True)) == want
    assert s["drawn"] == len(want)
    # and the first crashing trial's run, in full
    assert {"trial-timeline-0", "trial-timeline-1", "trial-gauges", "trial-latency",
            "trial-lag"} <= set(figs)  # fmt: skip
    html = out.read_text()
    best = [y for y in json.loads(html.split('id="replayer-figures">', 1)[1].split("</script>")[0])[
        "search"]["data"][-1]["y"]]  # fmt: skip
    assert best == [48, 48, 30, 30, 22, 22, 20, 20, 6]


@pytest.mark.inprocess
def test_vendored_plotly_js_is_what_its_readme_says():
    vendor = Path(__file__).resolve().parents[2] / "replayer" / "analysis" / "vendor"
    js = (vendor / "plotly.min.js").read_bytes()
    readme = (vendor / "README.md").read_text()
    version = re.search(rb"plotly\.js v(\d+\.\d+\.\d+)", js[:100])
    assert version and f"plotly.js v{version[1].decode()}" in readme
    assert hashlib.sha256(js).hexdigest() in readme
    assert (vendor / "LICENSE.plotly.txt").read_text().startswith("MIT License")
