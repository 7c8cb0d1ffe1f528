"""``replayer report``, ``compare`` and ``sweep`` as a user runs them: files
written, exit codes, one-line errors; the sweep against a real emulator."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from replayer.replay.results import Result, ResultsWriter, Status, read_results
from tests.helpers.cli import SAMPLE, assert_one_line_error, run

PLOTLY_JS = Path(__file__).resolve().parents[2] / "replayer/analysis/vendor/plotly.min.js"


def fake_run(path, scale, n=300, seed=1):
    """A finished run whose E2E/TTFT latencies are ``scale`` times a common law."""
    rng = random.Random(seed)
    path.mkdir()
    w = ResultsWriter(path / "results.arrow")
    for i in range(n):
        d = i * 10_000
        ttft = round(scale * rng.lognormvariate(11, 0.3))
        w.add(Result(
            target="t", row=i, request_id=f"r{i}", session_id=f"s{i % 10}", turn=i // 10,
            status=Status.OK, seq=i, scheduled_us=d, dispatched_us=d, first_token_us=d + ttft,
            done_us=d + 2 * ttft, completion_tokens=10, output_hash=f"{i:016x}",
            itl_mean_us=round(scale * rng.lognormvariate(9, 0.2)),
        ))  # fmt: skip
    w.close()
    (path / "run.json").write_bytes(orjson.dumps({"targets": [{"name": "t", "url": None}]}))
    return path


def test_report_writes_html(tmp_path):
    r = fake_run(tmp_path / "a", 1.0)
    res = run("report", r)
    assert res.returncode == 0, res.stderr
    html = (r / "report.html").read_text()
    assert html.startswith("<!doctype html>") and "plotly.js" in html
    assert PLOTLY_JS.read_text() in html  # inlined, from the vendored file
    assert "cdn" not in html.split("<script>", 1)[0].lower()
    out = tmp_path / "x.html"
    assert run("report", r, "-o", out).returncode == 0 and out.exists()
    again = run("report", r, "-o", out)
    assert again.returncode == 2
    assert_one_line_error(again, "already exists")
    assert run("report", r, "-o", out, "--force").returncode == 0


def test_report_and_compare_refuse_what_is_not_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    for args in (("report", tmp_path / "empty"), ("report", tmp_path / "missing"),
                 ("compare", tmp_path / "empty", tmp_path / "empty")):  # fmt: skip
        res = run(*args)
        assert res.returncode == 2, args
        assert res.stderr.count("\n") == 1 and res.stdout == "", args


def test_compare_text_json_and_regression_exit(tmp_path):
    a, b, c = (
        fake_run(tmp_path / "a", 1.0),
        fake_run(tmp_path / "b", 2.0, seed=2),
        fake_run(tmp_path / "c", 1.0, seed=3),
    )
    res = run("compare", a, b)
    assert res.returncode == 0, res.stderr
    lines = {ln.split("  ")[0].strip(): ln for ln in res.stdout.splitlines()}
    assert "slower" in lines["TTFT p50 ms"] and "slower" in lines["E2E p90 ms"]
    assert lines["E2E p99 ms"].endswith("(too few to judge)")  # 3 requests beyond p99
    js = orjson.loads(run("compare", a, b, "--json").stdout)
    (g,) = js["groups"]
    assert g["baseline"] == "a" and [c["label"] for c in g["configs"]] == ["a", "b"]
    ttft = next(r for r in g["rows"] if r["key"] == "ttft_p50_ms")["vs_baseline"]["b"]
    assert ttft["verdict"] == "slower" and 1.7 < ttft["low"] < ttft["ratio"] < ttft["high"] < 2.3
    assert run("compare", a, b, "--fail-on-regression").returncode == 1
    assert run("compare", a, c, "--fail-on-regression").returncode == 0
    slo = orjson.loads(run("compare", a, b, "--json", "--slo", "ttft=70ms").stdout)
    good = next(r for r in slo["groups"][0]["rows"] if r["key"] == "goodput_rps")["values"]
    thr = next(r for r in slo["groups"][0]["rows"] if r["key"] == "throughput_rps")["values"]
    assert 0 < good["b"] < good["a"] < thr["a"]
    bad = run("compare", a, b, "--slo", "ttft=fast")
    assert bad.returncode == 2
    assert_one_line_error(bad, "--slo")


def test_sweep_replays_each_limit_and_compares(emulator_factory, tmp_path):
    emu = emulator_factory(["--speed", "20"])
    out = tmp_path / "sweep"
    res = run("sweep", SAMPLE, "--target", f"e={emu.url}", "--max-inflight", "1,4",
              "--timing", "asap", "--limit", "16", "--out", out, "--json", "--quiet",
              "--grace", "0.2")  # fmt: skip
    assert res.returncode == 0, res.stderr
    result = orjson.loads(res.stdout)
    assert result == orjson.loads((out / "compare.json").read_bytes())
    (g,) = result["groups"]
    assert [c["label"] for c in g["configs"]] == ["inflight=1", "inflight=4"]
    sent = next(r for r in g["rows"] if r["key"] == "sent")["values"]
    assert sent == {"inflight=1": 16, "inflight=4": 16}
    for n in (1, 4):
        results = read_results(out / f"inflight-{n}" / "results.arrow")
        events = sorted(
            [(r["dispatched_us"], 1) for r in results] + [(r["done_us"], -1) for r in results],
            key=lambda e: (e[0], e[1]),
        )
        level = peak = 0
        for _, step in events:
            level += step
            peak = max(peak, level)
        assert peak <= n
        info = orjson.loads((out / f"inflight-{n}" / "run.json").read_bytes())
        assert info["policy"]["max_inflight"] == n
    bad = run("sweep", SAMPLE, "--target", emu.url, "--max-inflight", "4", "--out", tmp_path / "x")
    assert bad.returncode == 2
    assert_one_line_error(bad, "two or more")
