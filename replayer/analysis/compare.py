"""``replayer compare``: MI355 against B300, or config A against config B, on one trace.

A *config* is one target of one run: ``compare RUN`` compares the targets of
a run replayed side by side (``--target mi355=... --target b300=...``);
``compare RUN_A RUN_B ...`` compares runs, target by target when they share
target names, or their single targets otherwise (A/B configurations of one
platform, a ``sweep``). The first config is the baseline; every other one is
put against it, row by row:

* counts: requests, sent, ok, errors (sent, not ok), not sent, the failure;
* rates over first dispatch to last completion: throughput (requests that
  finished, any status), goodput (``ok`` requests that met the ``--slo``
  bounds; all ``ok`` ones without bounds), output tokens per second;
* TTFT, ITL (mean per request) and E2E p50/p90/p99 of the ``ok`` requests,
  each ratio with a bootstrap confidence interval
  (:mod:`replayer.analysis.bootstrap`) and a verdict, ``slower``, ``faster``
  or ``same``: a difference is called only when the interval excludes 1 and
  lies outside the ``--min-effect`` band;
* speculative decoding, where a run's server had it (``summary.json``'s
  ``spec_decode``, from its ``vllm:spec_decode_*`` counters): draft and
  accepted tokens, acceptance rate and mean acceptance length, plain ratios;
* output divergence, meaningful at temperature 0: which requests answered
  ``ok`` on both sides with different output (by output hash), and where the
  texts first differ when both runs kept them (``--save-output``).

Rates and counts are one number per run: they get a ratio but no interval;
repeat runs to see their noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayer.analysis.bootstrap import percentile_ratio
from replayer.analysis.rundir import RunData, TargetResults, load_run
from replayer.errors import UsageError
from replayer.options.analysis import CompareOptions as CompareOptions
from replayer.options.analysis import Slo as Slo
from replayer.trace.stats import percentile

LATENCIES = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E"))
PERCENTILES = (50, 90, 99)
_VERDICT = {
    "higher": "slower",
    "lower": "faster",
    "same": "same",
    "too few": "too few",
    "n/a": "n/a",
}


@dataclass(frozen=True)
class Config:
    label: str
    target: TargetResults
    run: Path


def _label_runs(runs: Sequence[RunData]) -> list[str]:
    names = [r.path.name for r in runs]
    if len(set(names)) == len(names):
        return names
    return [str(r.path) for r in runs]


def group_configs(
    runs: Sequence[RunData], *, labels: Sequence[str] | None = None, baseline: str | None = None
) -> list[tuple[str, list[Config]]]:
    """(title, configs) to compare: see the module docstring."""
    if not runs:
        raise UsageError("nothing to compare")
    for r in runs:
        if not r.targets:
            why = (r.summary or {}).get("unreachable") or "no results"
            raise UsageError(f"{r.path}: nothing to compare ({why})")
    groups: list[tuple[str, list[Config]]] = []
    if len(runs) == 1:
        run = runs[0]
        if len(run.targets) < 2:
            raise UsageError(
                f"{run.path} has one target: give two or more runs, or a run with several targets"
            )
        groups.append(
            (f"targets of {run.path}", [Config(n, t, run.path) for n, t in run.targets.items()])
        )
    else:
        names = list(labels) if labels is not None else _label_runs(runs)
        common = [n for n in runs[0].targets if all(n in r.targets for r in runs[1:])]
        if common:
            for tname in common:
                configs = [
                    Config(label, r.targets[tname], r.path)
                    for label, r in zip(names, runs, strict=True)
                ]
                groups.append((f"target {tname}", configs))
        elif all(len(r.targets) == 1 for r in runs):
            configs = [
                Config(label, next(iter(r.targets.values())), r.path)
                for label, r in zip(names, runs, strict=True)
            ]
            groups.append(("runs", configs))
        else:
            raise UsageError(
                "the runs share no target name and do not have one target each: "
                "compare runs of the same targets, or single-target runs"
            )
    if baseline is not None:
        out = []
        for title, configs in groups:
            first = [c for c in configs if c.label == baseline or c.target.name == baseline]
            if not first:
                raise UsageError(f"--baseline {baseline!r}: no such config in {title}")
            out.append((title, first[:1] + [c for c in configs if c is not first[0]]))
        groups = out
    return groups


def config_stats(t: TargetResults, slo: Slo) -> dict[str, Any]:
    """Counts and rates of one config (latency samples are taken separately)."""
    c = t.cols
    sent = t.sent()
    ok = t.ok()
    span = t.span_s()
    d, ft, done, itl = c["dispatched_us"], c["first_token_us"], c["done_us"], c["itl_mean_us"]
    finished = sum(1 for i in sent if done[i] is not None)

    def ms(a: int | None, b: int | None) -> float | None:
        return None if a is None or b is None else (a - b) / 1000

    good = sum(
        1
        for i in ok
        if slo.met(ms(ft[i], d[i]), None if itl[i] is None else itl[i] / 1000, ms(done[i], d[i]))
    )
    f = t.failure
    return {
        "requests": len(t),
        "sent": len(sent),
        "ok": len(ok),
        "errors": len(sent) - len(ok),
        "not_sent": len(t) - len(sent),
        "failure": (f.get("class") or f.get("kind")) if f else None,
        "span_s": round(span, 6),
        "throughput_rps": finished / span if span else None,
        "goodput_rps": good / span if span else None,
        "output_tok_s": sum(c["completion_tokens"][i] or 0 for i in ok) / span if span else None,
    }


def _plain_ratio(b: float | None, a: float | None) -> dict[str, Any]:
    if a is None or b is None or a == 0:
        return {"ratio": None, "low": None, "high": None, "verdict": ""}
    return {"ratio": round(b / a, 4), "low": None, "high": None, "verdict": ""}


def divergence(base: TargetResults, other: TargetResults, listed: int = 20) -> dict[str, Any]:
    """Requests ``ok`` on both sides whose outputs differ (by hash, or by text
    when both kept it), with the first differing character position."""
    bi = {rid: i for i, rid in enumerate(base.cols["request_id"])}
    bt, ot = base.cols.get("output_text"), other.cols.get("output_text")
    compared = 0
    out: list[dict[str, Any]] = []
    for j, rid in enumerate(other.cols["request_id"]):
        i = bi.get(rid)
        if i is None or base.cols["status"][i] != "ok" or other.cols["status"][j] != "ok":
            continue
        ha, hb = base.cols["output_hash"][i], other.cols["output_hash"][j]
        ta = bt[i] if bt is not None else None
        tb = ot[j] if ot is not None else None
        have_hash = ha is not None and hb is not None
        have_text = ta is not None and tb is not None
        if not have_hash and not have_text:
            continue
        compared += 1
        if not ((have_text and ta != tb) or (have_hash and ha != hb)):
            continue
        entry: dict[str, Any] = {"request_id": rid, "position": None}
        if ta is not None and tb is not None and ta != tb:
            pos = next(
                (k for k, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y),
                min(len(ta), len(tb)),
            )
            entry["position"] = pos
            entry["baseline_excerpt"] = ta[max(0, pos - 20) : pos + 30]
            entry["excerpt"] = tb[max(0, pos - 20) : pos + 30]
        out.append(entry)
    return {
        "compared": compared,
        "identical": compared - len(out),
        "divergent": len(out),
        "texts": bt is not None and ot is not None and any(v is not None for v in bt),
        "requests": out[:listed],
    }


def _api_rows(configs: Sequence[Config], row: Callable[..., None]) -> None:
    """Rows per API when a run mixes them (chat, Messages, Responses): each
    API's requests, ok count and median TTFT from ``summary.json``'s
    ``by_api``, with plain ratios (the bootstrap rows are for the run as a
    whole)."""
    by = {c.label: (c.target.summary.get("by_api") or {}) for c in configs}
    apis = sorted({a for d in by.values() for a in d})
    if len(apis) < 2:
        return
    base = configs[0].label

    def figure(a: dict[str, Any], key: str) -> Any:
        if key == "ok":
            return (a.get("status") or {}).get("ok", 0)
        if key == "ttft_p50_ms":
            return (a.get("ttft_ms") or {}).get("p50")
        return a.get(key)

    for api in apis:
        for key, label, unit in (
            ("requests", "requests", ""),
            ("ok", "ok", ""),
            ("ttft_p50_ms", "TTFT p50", "ms"),
        ):
            values = {lab: figure(d[api], key) if api in d else None for lab, d in by.items()}
            vs = {c.label: _plain_ratio(values[c.label], values[base]) for c in configs[1:]}
            row(f"{api}_{key}", f"{api} {label}", unit, values, vs)


SPEC_DECODE_ROWS = (
    ("draft_tokens", "spec-decode draft tokens", ""),
    ("accepted_tokens", "spec-decode accepted tokens", ""),
    ("acceptance_rate", "spec-decode acceptance rate", ""),
    ("mean_acceptance_length", "spec-decode mean acceptance length", ""),
)


SPEC_DECODE_PER_REQUEST_ROWS = (
    ("requests", "spec-decode requests reporting", ""),
    ("acceptance_rate_p50", "spec-decode acceptance p50 over requests", ""),
    ("acceptance_rate_p10", "spec-decode acceptance p10 over requests", ""),
)
"""Rows from the figures requests reported themselves, where a server sent them."""


def _spec_decode_rows(configs: Sequence[Config], row: Callable[..., None]) -> None:
    """Speculative-decoding rows when any config's server had it; a config
    without it shows ``-`` (its acceptance is not zero, it did not draft)."""
    by = {c.label: c.target.summary.get("spec_decode") for c in configs}
    if not any(by.values()):
        return
    base = configs[0].label
    for key, label, unit in SPEC_DECODE_ROWS:
        values = {lab: (s or {}).get(key) for lab, s in by.items()}
        vs = {c.label: _plain_ratio(values[c.label], values[base]) for c in configs[1:]}
        row(f"spec_decode_{key}", label, unit, values, vs)
    per = {lab: (s or {}).get("per_request") for lab, s in by.items()}
    if not any(per.values()):
        return
    for key, label, unit in SPEC_DECODE_PER_REQUEST_ROWS:
        values = {lab: (p or {}).get(key) for lab, p in per.items()}
        vs = {c.label: _plain_ratio(values[c.label], values[base]) for c in configs[1:]}
        row(f"spec_decode_per_request_{key}", label, unit, values, vs)


def compare_group(title: str, configs: Sequence[Config], opts: CompareOptions) -> dict[str, Any]:
    """One table: every config against the first (see the module docstring)."""
    base = configs[0]
    stats = {c.label: config_stats(c.target, opts.slo) for c in configs}
    rows: list[dict[str, Any]] = []

    def row(key: str, label: str, unit: str, values: dict[str, Any], vs: dict[str, Any]) -> None:
        rows.append({"key": key, "label": label, "unit": unit, "values": values,
                     "vs_baseline": vs})  # fmt: skip

    for key, label, unit in (
        ("requests", "requests", ""),
        ("sent", "sent", ""),
        ("ok", "ok", ""),
        ("errors", "errors", ""),
        ("not_sent", "not sent", ""),
        ("throughput_rps", "throughput", "req/s"),
        ("goodput_rps", "goodput", "req/s"),
        ("output_tok_s", "output tokens", "tok/s"),
    ):
        values = {c.label: stats[c.label][key] for c in configs}
        vs = {c.label: _plain_ratio(values[c.label], values[base.label]) for c in configs[1:]}
        row(key, label, unit, values, vs)
    row(
        "failure",
        "failure",
        "",
        {c.label: stats[c.label]["failure"] for c in configs},
        {c.label: {"ratio": None, "low": None, "high": None, "verdict": ""} for c in configs[1:]},
    )
    _api_rows(configs, row)
    _spec_decode_rows(configs, row)
    samples = {
        c.label: {m: sorted(c.target.latencies_ms(m)) for m, _ in LATENCIES} for c in configs
    }
    for metric, name in LATENCIES:
        for p in PERCENTILES:
            values = {c.label: _round(percentile(samples[c.label][metric], p)) for c in configs}
            vs = {}
            for c in configs[1:]:
                ci = percentile_ratio(
                    samples[base.label][metric],
                    samples[c.label][metric],
                    p,
                    draws=opts.draws,
                    level=opts.level,
                    seed=opts.seed,
                    label=f"{title}/{c.label}/{metric}",
                    min_effect=opts.min_effect,
                    min_tail=opts.min_tail,
                )
                d = ci.to_dict()
                d["verdict"] = _VERDICT[ci.verdict]
                vs[c.label] = d
            row(f"{metric}_p{p}_ms", f"{name} p{p}", "ms", values, vs)
    return {
        "title": title,
        "baseline": base.label,
        "configs": [
            {"label": c.label, "target": c.target.name, "run": str(c.run)} for c in configs
        ],
        "rows": rows,
        "divergence": {
            c.label: divergence(base.target, c.target, opts.divergent_listed) for c in configs[1:]
        },
    }


def _round(v: float | int | None) -> float | None:
    return None if v is None else round(float(v), 3)


def compare_runs(
    paths: Sequence[Path],
    *,
    labels: Sequence[str] | None = None,
    baseline: str | None = None,
    opts: CompareOptions | None = None,
) -> dict[str, Any]:
    """Compare run directories (see the module docstring); JSON-ready."""
    opts = opts or CompareOptions()
    runs = [load_run(Path(p), with_text=True) for p in paths]
    groups = group_configs(runs, labels=labels, baseline=baseline)
    return {
        "runs": [str(p) for p in paths],
        "options": opts.to_dict(),
        "groups": [compare_group(title, configs, opts) for title, configs in groups],
    }


# -- text --------------------------------------------------------------------------------


def _num(v: Any, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if unit in ("", "tok/s") or (isinstance(v, int) and not isinstance(v, bool)):
        return f"{v:,.0f}" if unit == "tok/s" else f"{v:,}"
    if unit == "ms" and v >= 10_000:
        return f"{v / 1000:,.2f} s"
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:,.2f}"


def _vs(d: dict[str, Any]) -> str:
    r = d.get("ratio")
    if r is None:
        return ""
    text = f"x{r:.2f}"
    if d.get("low") is not None and d.get("high") is not None:
        text += f" [{d['low']:.2f}-{d['high']:.2f}] {d['verdict']}"
    elif d.get("verdict"):
        text += f" ({d['verdict']} to judge)" if d["verdict"] == "too few" else f" {d['verdict']}"
    return text


def render(result: dict[str, Any]) -> str:
    """The compare tables as text."""
    o = result["options"]
    lines = []
    for g in result["groups"]:
        labels = [c["label"] for c in g["configs"]]
        lines.append(
            f"== {g['title']}: baseline {labels[0]}; ratios are other / baseline with "
            f"{o['level']:.0%} bootstrap intervals ({o['draws']:,} draws, seed {o['seed']}"
            + (f", min effect {o['min_effect']:.0%}" if o["min_effect"] else "")
            + ")"
        )
        head = ["", labels[0]]
        for lab in labels[1:]:
            head += [lab, f"{lab} / {labels[0]}"]
        cells = [head]
        for r in g["rows"]:
            unit = f" {r['unit']}" if r["unit"] else ""
            cell = [f"{r['label']}{unit}", _num(r["values"][labels[0]], r["unit"])]
            for lab in labels[1:]:
                cell += [_num(r["values"][lab], r["unit"]), _vs(r["vs_baseline"][lab])]
            cells.append(cell)
        widths = [max(len(row[k]) for row in cells) for k in range(len(cells[0]))]
        for row in cells:
            out = []
            for k, (c, w) in enumerate(zip(row, widths, strict=True)):
                # metric names and ratio columns read left to right; numbers align right
                left = k == 0 or (k >= 3 and k % 2 == 1)
                out.append(c.ljust(w) if left else c.rjust(w))
            lines.append("  ".join(out).rstrip())
        for lab, d in g["divergence"].items():
            if not d["compared"]:
                lines.append(f"output divergence {lab}: no request answered ok on both sides")
                continue
            lines.append(
                f"output divergence {lab} vs {labels[0]}: {d['divergent']:,} of "
                f"{d['compared']:,} ok-on-both requests differ"
                + ("" if d["texts"] else " (by hash; --save-output keeps texts for positions)")
            )
            for e in d["requests"][:10]:
                where = f" at char {e['position']:,}" if e["position"] is not None else ""
                lines.append(f"  {e['request_id']}{where}")
                if e.get("excerpt") is not None:
                    lines.append(f"    {labels[0]}: {e['baseline_excerpt']!r}")
                    lines.append(f"    {lab}: {e['excerpt']!r}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def any_regression(result: dict[str, Any]) -> bool:
    """A latency called slower, or more errors or a failure, in any group."""
    for g in result["groups"]:
        for r in g["rows"]:
            for lab, d in r["vs_baseline"].items():
                if d.get("verdict") == "slower":
                    return True
                if r["key"] == "errors" and (r["values"][lab] or 0) > (
                    r["values"][g["baseline"]] or 0
                ):
                    return True
                if r["key"] == "failure" and r["values"][lab] and not r["values"][g["baseline"]]:
                    return True
    return False
