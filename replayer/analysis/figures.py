"""The report's charts, as plotly.js figure specs (plain ``{"data", "layout"}`` dicts).

Built here, in Python, as JSON-ready dicts rather than through plotly's
Python figure classes: the report only needs plotly.js in the browser, and
validating 50,000-point traces through the Python layer would cost seconds.

**Staying responsive on 50,000 requests.** Every figure has a point budget,
and data over it is reduced so that what matters survives:

* the session timeline draws at most :data:`MAX_BARS` requests per target:
  every request that did not end ``ok`` and every one in flight at the
  failure is kept, the ``ok`` ones are thinned evenly in dispatch order (the
  figure's title says so);
* time series (in flight, scraped gauges) keep at most :data:`MAX_POINTS`
  points per series: the maximum of each time bucket, so peaks survive;
* the schedule-lag scatter keeps at most :data:`MAX_LAG_POINTS` per target,
  the latest-dispatched worst lag per time bucket;
* latency distributions are histograms of :data:`BINS` log-spaced bins
  computed here, whatever the number of requests.

Each bar of the timeline is a line segment in one ``scatter`` trace per
status (``null`` separates segments): one SVG path per status instead of a
shape per request, and no WebGL, so it renders in any browser, headless ones
included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from replayer.analysis.rundir import RunData, TargetResults

Figure = dict[str, Any]

MAX_BARS = 10_000
MAX_POINTS = 2_000
MAX_LAG_POINTS = 5_000
BINS = 40

STATUS_COLORS = {
    "ok": "#2a9d8f",
    "http_error": "#e76f51",
    "transport_error": "#c1121f",
    "timeout": "#7b2cbf",
    "skipped": "#adb5bd",
    "not_sent_after_crash": "#ced4da",
}
OUTCOME_COLORS = {
    "MATCH": "#c1121f",
    "OTHER_FAILURE": "#f4a261",
    "PASS": "#2a9d8f",
    "INVALID": "#8d99ae",
    "INFRA": "#343a40",
}
TARGET_COLORS = ("#264653", "#e76f51", "#2a9d8f", "#8338ec", "#f4a261", "#3a86ff", "#6c757d")
PREFILL_COLOR = "#c9d3dd"
FAIL_COLOR = "#c1121f"

# Scraped vLLM series shown over time (a name, or names tried in order).
KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
PREEMPT_NAMES = ("vllm:num_preemptions_total",)


def _layout(title: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "title": {
            "text": title,
            "x": 0.01,
            "xanchor": "left",
            "y": 0.99,
            "yanchor": "top",
            "yref": "container",
            "font": {"size": 15},
        },
        "margin": {"l": 64, "r": 24, "t": 84, "b": 48},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12},
        "legend": {"orientation": "h", "x": 0, "y": 1.01, "yanchor": "bottom"},
        "hovermode": "closest",
    }
    base.update(kw)
    return base


def _axis(title: str, **kw: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "gridcolor": "#eceff1",
        "zeroline": False,
        "showline": True,
        "linecolor": "#b0bec5",
        "automargin": True,
        **kw,
    }


def target_color(i: int) -> str:
    return TARGET_COLORS[i % len(TARGET_COLORS)]


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:,.2f} s" if v >= 10_000 else f"{v:,.1f} ms"


# -- session timeline --------------------------------------------------------------


def _failure_time_us(t: TargetResults) -> int | None:
    f = t.failure
    return round(f["at_s"] * 1e6) if f and f.get("at_s") is not None else None


def _ends(t: TargetResults) -> list[int | None]:
    """When each sent request stopped occupying the server (its completion; the
    failure, or the last event, for one that never completed)."""
    c = t.cols
    fail = _failure_time_us(t)
    last = max((v for v in c["done_us"] if v is not None), default=None)
    out: list[int | None] = []
    for d, e in zip(c["dispatched_us"], c["done_us"], strict=True):
        if d is None:
            out.append(None)
        elif e is not None:
            out.append(e)
        else:
            out.append(max(d, fail if fail is not None else (last or d)))
    return out


def gantt_sample(t: TargetResults, budget: int = MAX_BARS) -> tuple[list[int], int]:
    """(indexes of the sent requests to draw, thinning step of the ``ok`` ones: 1 = all)."""
    c = t.cols
    sent = sorted(t.sent(), key=lambda i: (c["dispatched_us"][i], i))
    if len(sent) <= budget:
        return sent, 1
    fail = _failure_time_us(t)
    ends = _ends(t)
    must = [
        i
        for i in sent
        if c["status"][i] != "ok"
        or (fail is not None and c["dispatched_us"][i] <= fail <= (ends[i] or fail))
    ]
    must_set = set(must)
    rest = [i for i in sent if i not in must_set]
    room = max(1, budget - len(must))
    step = math.ceil(len(rest) / room)
    keep = must_set | set(rest[::step])
    return [i for i in sent if i in keep], step


def gantt(t: TargetResults, color_index: int = 0) -> Figure:
    """Every request as a bar on its session's lane, coloured by status; the part
    before the first token drawn pale; the failure marked."""
    c = t.cols
    sid, disp, ft = c["session_id"], c["dispatched_us"], c["first_token_us"]
    ends = _ends(t)
    keep, step = gantt_sample(t)
    lanes: dict[str, int] = {}
    for i in sorted(t.sent(), key=lambda i: (disp[i], i)):
        lanes.setdefault(sid[i], len(lanes))
    by_status: dict[str, list[int]] = {}
    for i in keep:
        by_status.setdefault(c["status"][i], []).append(i)

    def hover(i: int) -> str:
        ttft = (ft[i] - disp[i]) / 1000 if ft[i] is not None else None
        e2e = ((ends[i] or disp[i]) - disp[i]) / 1000
        err = f" {c['error_class'][i]}" if c["error_class"][i] else ""
        return (
            f"{c['request_id'][i]} (turn {c['turn'][i]})<br>{c['status'][i]}{err}"
            f" · ttft {_fmt_ms(ttft)} · e2e {_fmt_ms(e2e)}"
            f"<br>{c['prompt_tokens'][i] or 0:,} prompt tokens, {c['cached_tokens'][i] or 0:,}"
            " cached"
        )

    def segments(
        idx: Iterable[int],
        start: Sequence[int | None],
        end: Sequence[int | None],
        text_at: tuple[bool, bool],
    ) -> tuple[list[float | None], list[int | None], list[str | None]]:
        """x, y, hover text of bars (``None`` between them); the text sits on
        the (start, end) points ``text_at`` says: hover works at a request's
        two ends, and the file holds each text at most twice."""
        xs: list[float | None] = []
        ys: list[int | None] = []
        texts: list[str | None] = []
        for i in idx:
            a, b = start[i], end[i]
            if a is None or b is None:
                continue
            h = hover(i)
            xs += [round(a / 1e6, 4), round(b / 1e6, 4), None]
            ys += [lanes[sid[i]], lanes[sid[i]], None]
            texts += [h if text_at[0] else None, h if text_at[1] else None, None]
        return xs, ys, texts

    n_lanes = max(1, len(lanes))
    width = max(1.0, min(10.0, 360 / n_lanes))
    data: list[dict[str, Any]] = []
    with_ft = [i for i in keep if ft[i] is not None and ft[i] > disp[i]]
    if with_ft:
        xs, ys, texts = segments(with_ft, disp, ft, (True, False))
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "waiting for the first token",
                "x": xs,
                "y": ys,
                "text": texts,
                "hoverinfo": "text",
                "line": {"color": PREFILL_COLOR, "width": width},
            }
        )
    body_start = [
        f if f is not None and d is not None and f > d else d for d, f in zip(disp, ft, strict=True)
    ]
    with_ft_set = set(with_ft)
    for status in sorted(by_status, key=lambda s: (s != "ok", s)):
        idx = by_status[status]
        xs, ys, texts = [], [], []
        for part, at_start in (
            ([i for i in idx if i in with_ft_set], False),
            ([i for i in idx if i not in with_ft_set], True),
        ):
            x, y, tx = segments(part, body_start, ends, (at_start, True))
            xs += x
            ys += y
            texts += tx
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"{status} ({len(idx):,})",
                "x": xs,
                "y": ys,
                "text": texts,
                "hoverinfo": "text",
                "line": {"color": STATUS_COLORS.get(status, "#6c757d"), "width": width},
            }
        )
    shapes, annotations = [], []
    f = t.failure
    if f is not None and f.get("at_s") is not None:
        at = float(f["at_s"])
        cls = f.get("class") or f.get("kind") or "failure"
        rid = f.get("request_id")
        lane = next((lanes[sid[i]] for i in t.sent() if c["request_id"][i] == rid), 0)
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"failure: {cls}",
                "x": [at],
                "y": [lane],
                "text": [f"{cls} at {at:.3f} s<br>{rid or '(no request)'}: "
                         f"{(f.get('message') or '')[:160]}"],
                "hoverinfo": "text",
                "marker": {"symbol": "x", "size": 14, "color": FAIL_COLOR,
                           "line": {"width": 2, "color": FAIL_COLOR}},
            }
        )  # fmt: skip
        shapes.append(_vline(at))
        annotations.append(_vlabel(at, f"{cls} @ {at:.2f} s"))
    not_sent = len(t) - len(t.sent())
    title = f"Session timeline: {t.name} ({len(t.sent()):,} requests sent"
    title += f", {not_sent:,} not sent)" if not_sent else ")"
    if step > 1:
        title += f" - showing {len(keep):,}: every non-ok one, 1 in {step} ok"
    ticks: dict[str, Any] = {"showticklabels": False}
    if len(lanes) <= 40:
        ticks = {"tickvals": list(lanes.values()), "ticktext": [s[-18:] for s in lanes]}
    layout = _layout(
        title,
        height=int(max(320, min(900, 140 + 14 * n_lanes))),
        xaxis=_axis("seconds after T0"),
        yaxis=_axis("session", autorange="reversed", **ticks),
        shapes=shapes,
        annotations=annotations,
    )
    return {"data": data, "layout": layout}


def _vline(x: float, yref: str = "paper") -> dict[str, Any]:
    return {
        "type": "line",
        "x0": x,
        "x1": x,
        "xref": "x",
        "y0": 0,
        "y1": 1,
        "yref": yref,
        "line": {"color": FAIL_COLOR, "width": 1.5, "dash": "dash"},
    }


def _vlabel(x: float, text: str) -> dict[str, Any]:
    return {
        "x": x,
        "y": 1,
        "xref": "x",
        "yref": "paper",
        "text": text,
        "showarrow": False,
        "xanchor": "left",
        "yanchor": "bottom",
        "font": {"color": FAIL_COLOR, "size": 11},
    }


# -- time series -------------------------------------------------------------------


def bucket_max(
    points: Sequence[tuple[float, float]], budget: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most ``budget`` points: the largest value of each of ``budget`` equal
    time buckets (at the bucket's first time), so peaks survive downsampling."""
    if len(points) <= budget:
        return list(points)
    t0, t1 = points[0][0], points[-1][0]
    width = (t1 - t0) / budget or 1.0
    out: dict[int, tuple[float, float]] = {}
    for t, v in points:
        k = min(budget - 1, int((t - t0) / width))
        cur = out.get(k)
        if cur is None:
            out[k] = (t, v)
        elif v > cur[1]:
            out[k] = (cur[0], v)
    return [out[k] for k in sorted(out)]


def inflight_series(t: TargetResults) -> list[tuple[float, float]]:
    """(seconds, requests in flight) after every dispatch and completion."""
    ev: list[tuple[int, int]] = []
    for d, e in zip(t.cols["dispatched_us"], _ends(t), strict=True):
        if d is not None:
            ev.append((d, 1))
            ev.append((e if e is not None else d, -1))
    ev.sort(key=lambda x: (x[0], x[1]))  # completions first at equal times
    n = 0
    out: list[tuple[float, float]] = [(0.0, 0.0)] if ev and ev[0][0] > 0 else []
    for at, delta in ev:
        n += delta
        if out and out[-1][0] == at / 1e6:
            out[-1] = (at / 1e6, float(n))
        else:
            out.append((at / 1e6, float(n)))
    return out


GAUGE_NAMES = (*KV_NAMES, RUNNING, WAITING, *PREEMPT_NAMES)


def scraped_series(
    run: RunData, samples: dict[str, list[Any]]
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{target: {"kv", "running", "waiting", "preemptions": [(t, value)]}} from
    the scraped samples of :data:`GAUGE_NAMES` (``rundir.read_samples``);
    values summed over label sets (engines), KV usage in percent, preemptions
    counted from the first scrape of the run."""
    by_source = {
        (t.url or "").rstrip("/") + "/metrics": name for name, t in run.targets.items() if t.url
    }
    acc: dict[tuple[str, str, float], float] = {}
    cols = (samples.get(c, []) for c in ("t", "source", "name", "value"))
    for t, source, name, value in zip(*cols, strict=True):
        target = by_source.get(source)
        if target is None:
            continue
        key = (target, name, t)
        acc[key] = acc.get(key, 0.0) + value
    raw: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for (target, name, t), v in sorted(acc.items()):
        raw.setdefault(target, {}).setdefault(name, []).append((t, v))
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for target, series in raw.items():
        got: dict[str, list[tuple[float, float]]] = {}
        kv = next((series[n] for n in KV_NAMES if n in series), None)
        if kv is not None:
            got["kv"] = [(t, v * 100) for t, v in kv]
        for label, metric in (("running", RUNNING), ("waiting", WAITING)):
            if metric in series:
                got[label] = series[metric]
        pre = next((series[n] for n in PREEMPT_NAMES if n in series), None)
        if pre is not None:
            base = pre[0][1]
            got["preemptions"] = [(t, v - base) for t, v in pre]
        out[target] = got
    return out


def gauges(run: RunData, samples: dict[str, list[Any]]) -> Figure:
    """In flight (replayer's count) and the server's own gauges, one panel each,
    on one time axis; the failure marked on every panel."""
    scraped = scraped_series(run, samples)
    have = {k for series in scraped.values() for k in series}
    panels = [("in flight (replayer)", ("inflight",))] + [
        (title, keys)
        for title, keys in (
            ("running / waiting (server)", ("running", "waiting")),
            ("KV cache usage %", ("kv",)),
            ("preemptions", ("preemptions",)),
        )
        if have & set(keys)
    ]
    axis_of = {key: k + 1 for k, (_, keys) in enumerate(panels) for key in keys}
    n = len(panels)
    gap = 0.06
    h = (1 - gap * (n - 1)) / n
    layout = _layout(
        "In flight and server gauges over time",
        height=180 + 170 * n,
        xaxis=_axis("seconds after T0", anchor=f"y{n}" if n > 1 else "y"),
    )
    for k, (title, _) in enumerate(panels):
        top = 1 - k * (h + gap)
        name = "yaxis" if k == 0 else f"yaxis{k + 1}"
        layout[name] = _axis(title, domain=[max(0.0, top - h), top], rangemode="tozero")
    data: list[dict[str, Any]] = []
    labels = {
        "inflight": "in flight",
        "running": "running",
        "waiting": "waiting",
        "kv": "KV %",
        "preemptions": "preemptions",
    }
    for ti, (tname, t) in enumerate(run.targets.items()):
        series = {"inflight": inflight_series(t), **scraped.get(tname, {})}
        for key, points in series.items():
            pts = bucket_max(points)
            axis = axis_of[key]
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": f"{tname} {labels[key]}",
                    "x": [round(p[0], 6) for p in pts],
                    "y": [p[1] for p in pts],
                    "xaxis": "x",
                    "yaxis": "y" if axis == 1 else f"y{axis}",
                    "line": {
                        "color": target_color(ti),
                        "dash": "dot" if key == "waiting" else "solid",
                        "width": 1.6,
                        "shape": "hv",
                    },
                }
            )
    shapes, annotations = [], []
    for t in run.targets.values():
        f = t.failure
        if f is not None and f.get("at_s") is not None:
            shapes.append(_vline(float(f["at_s"])))
            cls = f.get("class") or f.get("kind")
            annotations.append(_vlabel(float(f["at_s"]), f"{t.name}: {cls}"))
    layout["shapes"] = shapes
    layout["annotations"] = annotations
    return {"data": data, "layout": layout}


# -- distributions -----------------------------------------------------------------

_NICE_MS = tuple(m * 10.0**e for e in range(-2, 7) for m in (1, 2, 5))


def _ms_label(v: float) -> str:
    if v >= 60_000:
        return f"{v / 60_000:g} min"
    if v >= 1_000:
        return f"{v / 1000:g} s"
    return f"{v:g} ms"


def log_histogram(
    values: Sequence[float], lo: float, hi: float, bins: int = BINS
) -> tuple[list[float], list[int]]:
    """(bin centres in log10 ms, counts) over ``bins`` equal log10 bins of [lo, hi]."""
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        x = math.log10(max(v, 1e-3))
        counts[min(bins - 1, max(0, int((x - lo) / width)))] += 1
    return [round(lo + (k + 0.5) * width, 6) for k in range(bins)], counts


def distributions(run: RunData) -> Figure:
    """TTFT, ITL and E2E of the ``ok`` requests: one histogram per target on a
    log time axis (long-context latencies span four decades)."""
    metrics = (("ttft", "TTFT"), ("itl", "ITL (mean per request)"), ("e2e", "E2E"))
    layout = _layout("Latency distributions (ok requests)", height=380, barmode="overlay")
    data: list[dict[str, Any]] = []
    gap = 0.07
    w = (1 - 2 * gap) / 3
    for k, (metric, title) in enumerate(metrics):
        values = {name: t.latencies_ms(metric) for name, t in run.targets.items()}
        flat = [math.log10(max(v, 1e-3)) for vs in values.values() for v in vs]
        lo, hi = (min(flat), max(flat)) if flat else (0.0, 1.0)
        while True:  # widen a narrow range until the axis has two labelled ticks
            ticks = [v for v in _NICE_MS if lo <= math.log10(v) <= hi]
            if len(ticks) >= 2 or hi - lo > 9:
                break
            lo, hi = lo - 0.1, hi + 0.1
        if len(ticks) > 7:
            ticks = [v for v in ticks if abs(math.log10(v) - round(math.log10(v))) < 1e-9]
        ax = "" if k == 0 else str(k + 1)
        layout[f"xaxis{ax}"] = _axis(
            title,
            domain=[k * (w + gap), k * (w + gap) + w],
            anchor=f"y{ax}",
            tickvals=[math.log10(v) for v in ticks],
            ticktext=[_ms_label(v) for v in ticks],
            range=[lo, hi],
        )
        layout[f"yaxis{ax}"] = _axis("requests" if k == 0 else "", anchor=f"x{ax}")
        width = (hi - lo) / BINS
        for ti, (name, vs) in enumerate(values.items()):
            if not vs:
                continue
            centres, counts = log_histogram(vs, lo, hi)
            data.append(
                {
                    "type": "bar",
                    "name": name,
                    "legendgroup": name,
                    "showlegend": k == 0,
                    "x": centres,
                    "y": counts,
                    "width": width,
                    "xaxis": f"x{ax}",
                    "yaxis": f"y{ax}",
                    "opacity": 0.65,
                    "marker": {"color": target_color(ti)},
                    "hovertemplate": f"{name}: %{{y}} requests<extra>{metric}</extra>",
                }
            )
    return {"data": data, "layout": layout}


def lag(run: RunData) -> Figure:
    """Schedule lag (dispatch minus schedule) of every sent request over time."""
    data: list[dict[str, Any]] = []
    thinned = False
    for ti, (name, t) in enumerate(run.targets.items()):
        c = t.cols
        pts = sorted(
            (c["dispatched_us"][i] / 1e6, (c["dispatched_us"][i] - c["scheduled_us"][i]) / 1000)
            for i in t.sent()
            if c["scheduled_us"][i] is not None
        )
        kept = bucket_max(pts, MAX_LAG_POINTS)
        thinned |= len(kept) < len(pts)
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{name} lag",
                "x": [round(p[0], 6) for p in kept],
                "y": [round(p[1], 3) for p in kept],
                "marker": {"color": target_color(ti), "size": 4, "opacity": 0.7},
                "hovertemplate": "%{y:.2f} ms at %{x:.3f} s<extra>" + name + "</extra>",
            }
        )
    title = "Schedule lag (dispatch minus schedule: the replayer's own lateness)"
    if thinned:
        title += f" - the worst of each of {MAX_LAG_POINTS:,} time buckets"
    layout = _layout(
        title,
        height=320,
        xaxis=_axis("seconds after T0"),
        yaxis=_axis("lag, ms", rangemode="tozero"),
    )
    return {"data": data, "layout": layout}


# -- bisect --------------------------------------------------------------------------


_NICE_COUNTS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5))


def search(trials: Sequence[dict[str, Any]]) -> Figure:
    """Candidate size against trial number, one series per outcome, and the
    best (smallest crashing) size so far."""
    data: list[dict[str, Any]] = []
    by_outcome: dict[str, list[dict[str, Any]]] = {}
    for r in trials:
        by_outcome.setdefault(str(r.get("outcome")), []).append(r)
    for outcome in [o for o in OUTCOME_COLORS if o in by_outcome] + sorted(
        set(by_outcome) - set(OUTCOME_COLORS)
    ):
        rs = by_outcome[outcome]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{outcome} ({len(rs)})",
                "x": [r["trial"] for r in rs],
                "y": [r["size"] for r in rs],
                "text": [
                    f"trial {r['trial']} [{r.get('stage')}] {r['size']:,} requests<br>{outcome}"
                    + (f" {r['failure_class']}" if r.get("failure_class") else "")
                    + f" in {r.get('duration_s', 0):.1f} s"
                    for r in rs
                ],
                "hoverinfo": "text",
                "marker": {"color": OUTCOME_COLORS.get(outcome, "#6c757d"), "size": 9},
            }
        )
    best_x: list[int] = []
    best_y: list[int] = []
    best: int | None = None
    for r in trials:
        if r.get("outcome") == "MATCH":
            best = r["size"] if best is None else min(best, r["size"])
        if best is not None:
            best_x.append(r["trial"])
            best_y.append(best)
    if best_x:
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "best so far",
                "x": best_x,
                "y": best_y,
                "line": {"color": "#264653", "shape": "hv", "width": 2},
                "hoverinfo": "skip",
            }
        )
    layout = _layout(
        f"Bisect search: candidate size by trial ({len(trials)} trials)",
        height=360,
        xaxis=_axis("trial", dtick=1 if len(trials) <= 30 else None),
        yaxis=_axis(
            "candidate size, requests",
            type="log",
            tickvals=[
                v for v in _NICE_COUNTS if v <= 2 * max((r["size"] for r in trials), default=1)
            ],
        ),
    )
    return {"data": data, "layout": layout}


def figure_json(figs: dict[str, Figure]) -> str:
    """The figures as JSON safe inside a ``<script>`` element."""
    text = orjson.dumps(figs).decode()
    return text.replace("</", "<\\/")
