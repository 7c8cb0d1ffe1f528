"""Reading what replayer wrote: run directories and bisect directories.

The report and ``compare`` read the same things, so they read them here: a
run directory's ``run.json``, ``summary.json``, ``signature.json`` and
``results.arrow`` split into per-target *columns* (plain lists in trace-row
order, times in µs after T0), and a bisect directory's trial journal.

Columns, not row dicts: a 50,000-request run is 50,000 rows per target, and
``Table.column(...).to_pylist()`` over the few columns an analysis needs is an
order of magnitude cheaper than a dict per row. ``output_text`` is read only
when asked for (it can be most of the file).

It must not write anything, and reads a run that is still being written or
was killed (a torn ``results.arrow`` tail is dropped, a missing
``summary.json`` is an empty summary).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from replayer._arrow import read_stream
from replayer._runfile import RunFileError
from replayer.bisect.files import JOURNAL_NAME, journal_trials
from replayer.bundle.files import MANIFEST
from replayer.errors import UsageError
from replayer.replay.files import RUN, read_summary
from replayer.trace.stats import percentile

COLUMNS = (
    "target", "row", "request_id", "session_id", "turn", "status", "seq", "scheduled_us",
    "dispatched_us", "first_token_us", "done_us", "http_status", "error_class", "error",
    "prompt_tokens", "completion_tokens", "cached_tokens", "output_hash", "itl_mean_us",
)  # fmt: skip
"""What an analysis reads of ``results.arrow`` (``output_text`` on request)."""


@dataclass
class TargetResults:
    """One target's results, as columns in trace-row order."""

    name: str
    cols: dict[str, list[Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    """This target's part of ``summary.json`` (empty for a killed run)."""
    url: str | None = None

    def __len__(self) -> int:
        return len(self.cols["row"])

    def col(self, name: str) -> list[Any]:
        return self.cols[name]

    @property
    def failure(self) -> dict[str, Any] | None:
        f = self.summary.get("failure")
        return f if isinstance(f, dict) else None

    def sent(self) -> list[int]:
        """Indexes of the requests that went on the wire."""
        return [i for i, s in enumerate(self.cols["seq"]) if s is not None]

    def ok(self) -> list[int]:
        return [i for i, s in enumerate(self.cols["status"]) if s == "ok"]

    def latencies_ms(self, metric: str) -> list[float]:
        """TTFT, ITL or E2E of the ``ok`` requests, in ms (as ``summary.json``)."""
        c = self.cols
        d = c["dispatched_us"]
        if metric == "ttft":
            ft = c["first_token_us"]
            idx = (i for i in self.ok() if ft[i] is not None and d[i] is not None)
            return [(ft[i] - d[i]) / 1000 for i in idx]
        if metric == "e2e":
            done = c["done_us"]
            idx = (i for i in self.ok() if done[i] is not None and d[i] is not None)
            return [(done[i] - d[i]) / 1000 for i in idx]
        if metric == "itl":
            itl = c["itl_mean_us"]
            return [itl[i] / 1000 for i in self.ok() if itl[i] is not None]
        if metric == "lag":
            s = c["scheduled_us"]
            idx = (i for i in self.sent() if d[i] is not None and s[i] is not None)
            return [(d[i] - s[i]) / 1000 for i in idx]
        raise ValueError(f"unknown metric {metric!r}")

    def span_s(self) -> float:
        """First dispatch to last completion, seconds (as ``summary.json``)."""
        d = [v for v in self.cols["dispatched_us"] if v is not None]
        e = [
            v
            for v, s in zip(self.cols["done_us"], self.cols["seq"], strict=True)
            if v is not None and s is not None
        ]
        if not d or not e or max(e) <= min(d):
            return 0.0
        return float(max(e) - min(d)) / 1e6


@dataclass
class RunData:
    """A run directory, read."""

    path: Path
    info: dict[str, Any]
    summary: dict[str, Any]
    targets: dict[str, TargetResults]
    signature: dict[str, Any] | None = None

    @property
    def metrics_path(self) -> Path | None:
        p = self.path / "metrics.arrow"
        return p if p.exists() else None


def read_columns(path: Path, columns: Sequence[str] = COLUMNS) -> dict[str, list[Any]]:
    """Columns of a ``results.arrow`` stream (a torn tail is dropped)."""
    table = read_stream(path)
    return {c: table.column(c).to_pylist() for c in columns if c in table.column_names}


def read_samples(path: Path, names: Sequence[str]) -> dict[str, list[Any]]:
    """``t``, ``source``, ``name``, ``value`` of the scraped samples named
    ``names`` in a ``metrics.arrow`` (filtered in Arrow: a long run holds
    millions of samples, and the report wants a handful of series)."""
    table = read_stream(path)
    if "name" not in table.column_names:  # killed before its first scrape
        return {c: [] for c in ("t", "source", "name", "value")}
    table = table.filter(pc.is_in(table.column("name"), value_set=pa.array(list(names))))
    return {c: table.column(c).to_pylist() for c in ("t", "source", "name", "value")}


def _json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UsageError(f"{path}: unreadable ({exc})") from None


def is_run_dir(path: Path) -> bool:
    return (path / "results.arrow").is_file()


def is_bisect_dir(path: Path) -> bool:
    return (path / "journal.jsonl").is_file()


def is_bundle_dir(path: Path) -> bool:
    return (path / "manifest.json").is_file() and (path / "trials.jsonl").is_file()


def load_run(path: Path, *, with_text: bool = False) -> RunData:
    """A run directory (``replay``, ``check``, a bisect trial)."""
    if not is_run_dir(path):
        raise UsageError(f"{path}: not a run directory (no results.arrow)")
    cols = read_columns(path / "results.arrow", (*COLUMNS, "output_text") if with_text else COLUMNS)
    info = RUN.load(path) if RUN.exists(path) else {}
    summary = read_summary(path) or {}
    urls = {t.get("name"): t.get("url") for t in info.get("targets", []) if isinstance(t, dict)}
    order = [t for t in urls if t] + sorted(set(cols.get("target", [])) - set(urls))
    rows_of: dict[str, list[int]] = {}
    for i, t in enumerate(cols.get("target", [])):
        rows_of.setdefault(t, []).append(i)
    targets: dict[str, TargetResults] = {}
    for name in order:
        idx = sorted(rows_of.get(name, []), key=lambda i: cols["row"][i])
        if not idx and name not in (summary.get("targets") or {}):
            continue
        targets[name] = TargetResults(
            name=name,
            cols={c: [v[i] for i in idx] for c, v in cols.items()},
            summary=(summary.get("targets") or {}).get(name) or {},
            url=urls.get(name),
        )
    return RunData(
        path=path,
        info=info,
        summary=summary,
        targets=targets,
        signature=_json(path / "signature.json"),
    )


def load_trials(path: Path) -> list[dict[str, Any]]:
    """Every trial of a bisect directory (its journal) or of a bundle
    (``trials.jsonl``), in trial order."""
    out: list[dict[str, Any]] = []
    journal = path / JOURNAL_NAME
    if journal.is_file():
        out = journal_trials(journal)
    elif (path / "trials.jsonl").is_file():
        for line in (path / "trials.jsonl").read_bytes().splitlines():
            if line.strip():
                out.append(orjson.loads(line))
    return sorted(out, key=lambda r: int(r.get("trial", 0)))


def load_manifest(path: Path) -> dict[str, Any] | None:
    for d in (path / "bundle", path):
        if MANIFEST.exists(d):
            try:
                return MANIFEST.load(d)
            except RunFileError as exc:
                raise UsageError(str(exc)) from None
    return None


def dist_ms(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p90, p99, max, mean (nearest-rank percentiles, as ``summary.json``)."""
    s = sorted(values)
    return {
        "n": len(s),
        "p50": percentile(s, 50),
        "p90": percentile(s, 90),
        "p99": percentile(s, 99),
        "max": s[-1] if s else None,
        "mean": sum(s) / len(s) if s else None,
    }
