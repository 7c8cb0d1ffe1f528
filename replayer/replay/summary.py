"""``summary.json``: per target, what happened and how fast.

Latencies are in milliseconds, percentiles nearest-rank (values that really
occurred). TTFT is first token minus dispatch; E2E is done minus dispatch;
ITL is the mean inter-chunk gap of each request; lag is dispatch minus
schedule. Throughput counts completed (``ok``) requests over the span from
the first dispatch to the last completion.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from replayer.monitor.signature import FAILING_EVIDENCE, Signature
from replayer.monitor.watch import FailureReport
from replayer.replay.accounting import Failure
from replayer.replay.client import is_client_error
from replayer.replay.results import Result, Status
from replayer.trace.stats import percentile


def _dist_ms(values_us: Sequence[int]) -> dict[str, float | None]:
    s = sorted(values_us)

    def ms(v: int | float | None) -> float | None:
        return None if v is None else round(v / 1000, 3)

    return {
        "n": len(s),
        "p50": ms(percentile(s, 50)),
        "p90": ms(percentile(s, 90)),
        "p99": ms(percentile(s, 99)),
        "max": ms(s[-1] if s else None),
        "mean": ms(sum(s) / len(s)) if s else None,
    }


def by_api(results: Sequence[Result], api_of: Callable[[Result], str]) -> dict[str, Any]:
    """Per API (chat completions, Messages, Responses...), the figures a
    mixed trace needs apart: each API's framing has its own TTFT and usage."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(api_of(r), []).append(r)
    out: dict[str, Any] = {}
    for api, rs in sorted(groups.items()):
        ok = [r for r in rs if r.status is Status.OK]
        out[api] = {
            "requests": len(rs),
            "status": dict(sorted(Counter(r.status.value for r in rs).items())),
            "ttft_ms": _dist_ms(_span(ok, "first_token_us")),
            "e2e_ms": _dist_ms(_span(ok, "done_us")),
            "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
            "completion_tokens": sum(r.completion_tokens or 0 for r in ok),
            "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        }
    return out


def _span(ok: Sequence[Result], end: str) -> list[int]:
    out = []
    for r in ok:
        t = getattr(r, end)
        if t is not None and r.dispatched_us is not None:
            out.append(t - r.dispatched_us)
    return out


def summarize_target(
    results: Sequence[Result],
    failure: Failure | None,
    report: FailureReport | None = None,
    prefix_cache: dict[str, float] | None = None,
    api_of: Callable[[Result], str] | None = None,
    spec_decode: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``api_of`` (the API of a result's request) adds ``by_api``;
    ``spec_decode`` is the server's speculative-decoding figures over the run
    (:func:`replayer.monitor.metrics.spec_decode_figures`)."""
    counts = Counter(r.status.value for r in results)
    sent = [r for r in results if r.seq is not None]
    ok = [r for r in sent if r.status is Status.OK]
    rejected = [r for r in sent if is_client_error(r)]
    ttft = [
        r.first_token_us - r.dispatched_us
        for r in ok
        if r.first_token_us is not None and r.dispatched_us is not None
    ]
    e2e = [
        r.done_us - r.dispatched_us
        for r in ok
        if r.done_us is not None and r.dispatched_us is not None
    ]
    itl = [r.itl_mean_us for r in ok if r.itl_mean_us is not None]
    lag = [r.lag_us for r in sent if r.lag_us is not None]
    first = min((r.dispatched_us for r in sent if r.dispatched_us is not None), default=None)
    last = max((r.done_us for r in sent if r.done_us is not None), default=None)
    span = (last - first) / 1e6 if first is not None and last is not None and last > first else 0
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    errors = Counter(r.error_class for r in results if r.error_class)
    return {
        "requests": len(results),
        "sent": len(sent),
        "status": dict(sorted(counts.items())),
        "error_classes": dict(sorted(errors.items())),
        "failed": failure is not None,
        "failure": _failure(failure, report),
        "span_s": round(span, 6),
        "throughput_rps": round(len(ok) / span, 3) if span else None,
        "output_tokens_per_s": round(out_tokens / span, 1) if span else None,
        "ttft_ms": _dist_ms(ttft),
        "itl_ms": _dist_ms(itl),
        "e2e_ms": _dist_ms(e2e),
        "lag_ms": _dist_ms(lag),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        "completion_tokens": out_tokens,
        "client_errors": len(rejected),
        "exercised": exercised(len(sent), len(rejected)),
        "first_rejection": _rejection(min(rejected, key=_seq)) if rejected else None,
        **_cached(ok, prefix_cache, failed=failure is not None),
        "spec_decode": _spec_decode(spec_decode, results, failed=failure is not None),
        **({"by_api": by_api(results, api_of)} if api_of is not None else {}),
    }


def exercised(sent: int, rejected: int) -> bool:
    """A run whose requests were mostly rejected (4xx) did not exercise the
    target: it neither survived nor reproduced anything."""
    return not (sent and rejected * 2 > sent)


def _seq(r: Result) -> int:
    return r.seq if r.seq is not None else 1 << 62


def _rejection(r: Result) -> dict[str, Any]:
    return {
        "request_id": r.request_id,
        "seq": r.seq,
        "http_status": r.http_status,
        "error_class": r.error_class,
        "message": r.error,
    }


def _cached(
    ok: Sequence[Result], prefix_cache: dict[str, float] | None, *, failed: bool = False
) -> dict[str, Any]:
    """Cached prompt tokens: per request when the server reports them (vLLM:
    ``--enable-prompt-tokens-details``), else the run's prefix-cache counters
    (``metrics``; after a failure only up to the last scrape before it, since
    a dead server has none to give: ``metrics_before_failure``)."""
    reported = [r for r in ok if r.cached_tokens is not None]
    if reported:
        prompt = sum(r.prompt_tokens or 0 for r in reported)
        cached = sum(r.cached_tokens or 0 for r in reported)
        return {
            "cached_tokens": cached,
            "cached_tokens_source": "responses",
            "prefix_cache_hit_ratio": round(cached / prompt, 4) if prompt else None,
        }
    if prefix_cache is not None:
        q = prefix_cache["queries"]
        return {
            "cached_tokens": int(prefix_cache["hits"]),
            "cached_tokens_source": "metrics_before_failure" if failed else "metrics",
            "prefix_cache_hit_ratio": round(prefix_cache["hits"] / q, 4) if q else None,
        }
    return {"cached_tokens": None, "cached_tokens_source": None, "prefix_cache_hit_ratio": None}


def _spec_decode(
    figures: dict[str, Any] | None, results: Sequence[Result], *, failed: bool
) -> dict[str, Any] | None:
    """Drafts and acceptance from the server's ``vllm:spec_decode_*`` counters
    (per run: vLLM counts them per engine), with ``per_request`` where the
    server also sent each request's figures; the run's figures from those
    alone (``source: responses``) when it had no metrics. None when neither."""
    per = _spec_per_request(results)
    if figures is not None:
        source = "metrics_before_failure" if failed else "metrics"
        return {**figures, "source": source, "per_request": per}
    if per is None:
        return None
    drafts, drafted, accepted = per["drafts"], per["draft_tokens"], per["accepted_tokens"]
    return {
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": per["acceptance_rate"],
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "accepted_per_position": None,
        "source": "responses",
        "per_request": per,
    }


def _spec_per_request(results: Sequence[Result]) -> dict[str, Any] | None:
    """The figures requests reported themselves (vLLM
    ``--per-request-spec-decode-metrics``): how many, their totals, and the
    spread of their acceptance rates (nearest-rank p10/p50 over the requests
    that drafted; a request that drafted nothing has no rate)."""
    rep = [r for r in results if r.spec_draft_tokens is not None]
    if not rep:
        return None
    drafted = sum(r.spec_draft_tokens or 0 for r in rep)
    accepted = sum(r.spec_accepted_tokens or 0 for r in rep)
    rates = sorted(
        (r.spec_accepted_tokens or 0) / r.spec_draft_tokens for r in rep if r.spec_draft_tokens
    )

    def pct(q: float) -> float | None:
        v = percentile(rates, q)
        return None if v is None else round(v, 4)

    return {
        "requests": len(rep),
        "drafts": sum(r.spec_drafts or 0 for r in rep),
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "acceptance_rate_p50": pct(50),
        "acceptance_rate_p10": pct(10),
    }


def spec_decode_text(s: dict[str, Any]) -> str:
    """One line: draft and accepted tokens and the acceptance rate, then the
    spread over requests where they reported it."""
    rate = s.get("acceptance_rate")
    length = s.get("mean_acceptance_length")
    return (
        f"speculative decoding: {s['accepted_tokens']:,} of {s['draft_tokens']:,} draft tokens "
        f"accepted ({'-' if rate is None else f'{rate:.1%}'}) over {s['drafts']:,} drafts"
        + ("" if length is None else f", mean acceptance length {length:.2f}")
        + spec_per_request_text(s.get("per_request"))
    )


def spec_per_request_text(p: dict[str, Any] | None) -> str:
    """``; per request (N): acceptance p50 X, p10 Y`` or nothing."""
    if not p:
        return ""

    def pc(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    return (
        f"; per request ({p['requests']:,}): acceptance p50 {pc(p.get('acceptance_rate_p50'))}"
        f", p10 {pc(p.get('acceptance_rate_p10'))}"
    )


def _failure(failure: Failure | None, report: FailureReport | None) -> dict[str, Any] | None:
    if failure is None:
        return None
    out = failure.to_dict()
    if out["request_id"] is not None:
        out["request_from"] = "client"  # the first to see it: see name_failing
    if report is not None:
        r = report.to_dict()
        out["class"] = r.pop("class")
        if out["class"] == "network":
            out["message"] = r["message"]  # the request's error, and why it is not a crash
        out.update({k: v for k, v in r.items() if k not in out})
    return out


def name_failing(failure: dict[str, Any], sig: Signature, seqs: Mapping[str, int | None]) -> None:
    """Put the server's signature into a failure (``summary.json``'s), and
    name the failing request by the server's own evidence where its log gives
    it (:func:`~replayer.monitor.signature.failing_request`): every stream in
    flight sees an engine death at once, so the request the replay saw fail
    first (``request_from: client``) is often not the one the server was
    processing. That one is then listed in flight with the others, and
    ``first_seen_on`` keeps it. ``seqs``: the run's sent requests, by id."""
    failure["signature"] = sig.to_dict()
    rid = sig.failing
    if rid is None or rid not in seqs:
        return
    first = failure.get("request_id")
    failure["request_from"] = sig.failing_evidence
    if rid == first:
        return
    inflight = [r for r in failure.get("inflight") or () if r not in (rid, first)]
    failure.update(
        request_id=rid,
        seq=seqs[rid],
        first_seen_on=first,
        inflight=([first] if first is not None else []) + inflight,
    )


def _failing_text(f: dict[str, Any]) -> str:
    """The failure's request, and what named it."""
    rid = f.get("request_id")
    if not rid:
        return ""
    seq = f" (#{f['seq']})" if f.get("seq") is not None else ""
    why = FAILING_EVIDENCE.get(f.get("request_from") or "")
    if why is not None:
        return f" on request {rid}{seq}, by {why}"
    if f.get("inflight"):  # one of several: the client cannot tell which
        return f" first seen on request {rid}{seq}"
    return f" on request {rid}{seq}"


def render(summary: dict[str, Any]) -> str:
    """The human summary printed after a replay."""
    lines = []
    for name, t in summary["targets"].items():
        state = (
            "FAILED"
            if t["failed"]
            else "NOT EXERCISED"
            if not t.get("exercised", True)
            else "survived"
        )
        lines.append(
            f"{name}: {state}  sent {t['sent']:,}/{t['requests']:,}  "
            + "  ".join(f"{k} {v:,}" for k, v in t["status"].items())
        )
        if t["failure"]:
            f = t["failure"]
            cls = f" [{f['class']}]" if f.get("class") else ""
            on = _failing_text(f)
            lines.append(
                f"  failure{cls}: {f['kind']} at {f['at_s']:.3f} s{on}: {f['message'][:200]}"
            )
            if f.get("inflight"):
                more = " ..." if len(f["inflight"]) > 8 else ""
                lines.append(f"  in flight then: {', '.join(f['inflight'][:8])}{more}")
        if t.get("first_rejection"):
            lines.append("  " + rejection_text(t))
        if t.get("cached_tokens_source"):
            ratio = t["prefix_cache_hit_ratio"]
            lines.append(
                f"  cached {t['cached_tokens']:,} prompt tokens"
                + (f" ({ratio:.1%} hit ratio)" if ratio is not None else "")
                + {
                    "metrics": " from the server's /metrics",
                    "metrics_before_failure": " from the server's /metrics until its last "
                    "scrape before the failure",
                }.get(t["cached_tokens_source"], "")
            )
        if t.get("spec_decode"):
            lines.append("  " + spec_decode_text(t["spec_decode"]))
        lines.append(f"  ttft {_dist_text(t['ttft_ms'])}")
        lines.append(f"  e2e  {_dist_text(t['e2e_ms'])}")
        lines.append(f"  lag  {_dist_text(t['lag_ms'])}")
        if t["throughput_rps"]:
            lines.append(
                f"  throughput {t['throughput_rps']:,.1f} req/s, "
                f"{t['output_tokens_per_s']:,.0f} output tok/s over {t['span_s']:.2f} s"
            )
        if len(t.get("by_api") or {}) > 1:  # a mixed trace: each API apart
            for api, a in t["by_api"].items():
                lines.append(
                    f"  {api}: {a['requests']:,} requests ("
                    + ", ".join(f"{k} {v:,}" for k, v in a["status"].items())
                    + f"), ttft p50 {_ms_text(a['ttft_ms']['p50'])}"
                )
    return "\n".join(lines)


def _ms_text(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} ms"


def unexercised_text(summary: dict[str, Any]) -> str | None:
    """The loud line for a run that did not exercise a target, or None."""
    for name, t in summary.get("targets", {}).items():
        if not t.get("exercised", True) and not t.get("failed"):
            return f"target {name}: {rejection_text(t)}"
    return None


def rejection_text(t: dict[str, Any]) -> str:
    """One line: how many requests were rejected, and the first rejection."""
    f = t["first_rejection"]
    status = (
        f"HTTP {f['http_status']}"
        if f["error_class"].startswith("http_")
        else (f"an error event ({f['error_class']}) inside a 200 stream")
    )
    head = (
        f"{t['client_errors']:,} of {t['sent']:,} requests were rejected as client errors "
        + ("(the trace did not exercise the target)" if not t.get("exercised", True) else "")
    ).rstrip()
    text = f"{head}; first: {f['request_id']} got {status}: {(f['message'] or '')[:300]}"
    return text + (f" [{f['hint']}]" if f.get("hint") else "")


def _dist_text(v: dict[str, Any]) -> str:
    if not v["n"]:
        return "-"
    return f"p50 {v['p50']:.1f}  p99 {v['p99']:.1f}  max {v['max']:.1f} ms"
