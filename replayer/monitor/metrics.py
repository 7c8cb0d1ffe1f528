"""Scraping Prometheus endpoints into ``RUN/metrics.arrow``.

Every ``interval`` seconds each source (the vLLM server's ``/metrics``, and
any ``--scrape URL`` such as a node or GPU exporter) is read and parsed with
prometheus_client's own text parser; every sample becomes a row
``(t, source, name, labels, value)`` with ``t`` in seconds after the replay's
anchor and ``labels`` a JSON object with sorted keys (so equal label sets are
equal strings, whatever order the server printed them in). The file is an
Arrow IPC stream flushed after every scrape: a killed run keeps its series.
The last raw exposition of each source is kept in memory, so the one just
before a failure can be written out whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
from prometheus_client.parser import text_string_to_metric_families

from replayer._arrow import read_stream
from replayer._async import wait_event
from replayer._files import output_error, truncate_quietly, writing
from replayer._http import pooled_connector
from replayer.errors import OutputError

log = logging.getLogger("replayer.monitor")

SCHEMA = pa.schema(
    [
        ("t", pa.float64()),
        ("source", pa.dictionary(pa.int32(), pa.string())),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("labels", pa.dictionary(pa.int32(), pa.string())),
        ("value", pa.float64()),
    ]
)


def parse_samples(text: str) -> Iterator[tuple[str, str, float]]:
    """(sample name, labels JSON, value) for every sample of an exposition."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, orjson.dumps(s.labels, option=orjson.OPT_SORT_KEYS).decode(), s.value


@dataclass
class Scrape:
    t: float
    source: str
    text: str


class MetricsWriter:
    """Appends scrapes to an Arrow stream; one batch per scrape.

    A scrape that cannot be written (a full disk) is cut back off the file,
    so it ends on its last whole batch, and reported once to ``on_error``
    (a replay stops on it); nothing is written after that. Without
    ``on_error`` the error is raised, as any write error would be."""

    def __init__(self, path: Path, on_error: Callable[[OutputError], None] | None = None) -> None:
        self.path = path
        self.on_error = on_error
        self.failed = False
        with writing(path):
            self._sink = pa.OSFile(str(path), "wb")
            self._w = ipc.new_stream(
                self._sink,
                SCHEMA,
                options=ipc.IpcWriteOptions(compression="zstd", emit_dictionary_deltas=True),
            )
            self._good = self._sink.tell()
        self.rows = 0

    def add(self, scrape: Scrape) -> int:
        if self.failed:
            return 0
        names, labels, values = [], [], []
        for n, lab, v in parse_samples(scrape.text):
            names.append(n)
            labels.append(lab)
            values.append(v)
        if not names:
            return 0
        k = len(names)
        batch = pa.record_batch(
            [
                pa.array([scrape.t] * k, pa.float64()),
                pa.array([scrape.source] * k).dictionary_encode(),
                pa.array(names).dictionary_encode(),
                pa.array(labels).dictionary_encode(),
                pa.array(values, pa.float64()),
            ],
            schema=SCHEMA,
        )
        try:
            # each batch carries its own dictionaries: replacement, which streams allow
            self._w.write_batch(batch)
            self._sink.flush()
        except OSError as exc:
            self._fail(exc)
            return 0
        self._good = self._sink.tell()
        self.rows += k
        return k

    def _fail(self, exc: OSError) -> None:
        self.failed = True
        truncate_quietly(self.path, self._good)
        err = output_error(exc, self.path)
        if self.on_error is None:
            raise err from None
        self.on_error(err)

    def close(self) -> None:
        if self._sink.closed:
            return
        if not self.failed:
            try:
                self._w.close()
                self._sink.close()
                return
            except OSError as exc:
                with contextlib.suppress(OSError):
                    self._sink.close()
                self._fail(exc)
                return
        with contextlib.suppress(OSError):
            self._sink.close()


@dataclass
class MetricsScraper:
    """Scrapes ``sources`` every ``interval`` seconds until stopped."""

    sources: list[str]
    writer: MetricsWriter | None
    interval: float = 2.0
    timeout: float = 5.0
    final_timeout: float = 5.0
    t0: float = 0.0
    last: dict[str, Scrape] = field(default_factory=dict)
    first: dict[str, Scrape] = field(default_factory=dict)
    """The first scrape of each source: counters over the run are last - first."""
    history: dict[str, list[Scrape]] = field(default_factory=dict)
    keep: int = 8
    errors: int = 0
    _primed: list[Scrape] = field(default_factory=list)

    async def scrape_once(
        self, session: aiohttp.ClientSession, *, within: float | None = None, write: bool = True
    ) -> list[Scrape]:
        """Scrape every source once (each bounded by ``within``, default
        ``timeout``); what was scraped."""
        loop = asyncio.get_running_loop()
        got = []
        for url in self.sources:
            t = loop.time() - self.t0
            limit = aiohttp.ClientTimeout(total=self.timeout if within is None else within)
            try:
                async with session.get(url, timeout=limit) as r:
                    if r.status != 200:
                        self.errors += 1
                        continue
                    text = (await r.read()).decode(errors="replace")
            except (aiohttp.ClientError, TimeoutError):
                self.errors += 1
                continue
            s = Scrape(t=t, source=url, text=text)
            got.append(s)
            self.last[url] = s
            self.first.setdefault(url, s)
            hist = self.history.setdefault(url, [])
            hist.append(s)
            del hist[: -self.keep]
            if write:
                self._write(s)
        return got

    def _write(self, s: Scrape) -> None:
        if self.writer is None:
            return
        try:
            self.writer.add(s)
        except ValueError as exc:  # not Prometheus text: keep going
            self.errors += 1
            log.warning("metrics from %s did not parse: %s", s.source, exc)

    async def run(self, stop: asyncio.Event) -> None:
        # scrapes every ~5 s would meet vLLM's 5 s idle close head on (see IDLE_CLOSE_S)
        async with aiohttp.ClientSession(connector=pooled_connector(4)) as session:
            while not stop.is_set():
                await self.scrape_once(session)
                await wait_event(stop, self.interval)

    async def _one_off(self, *, write: bool) -> list[Scrape]:
        if not self.sources:
            return []
        async with aiohttp.ClientSession(connector=pooled_connector(4)) as session:
            return await self.scrape_once(session, within=self.final_timeout, write=write)

    async def prime(self) -> None:
        """One scrape before the anchor is set (bounded by ``final_timeout``):
        the run's counters then start from what the server had counted
        before the first request, not from whenever the first periodic scrape
        got through. :meth:`anchor` dates and writes it."""
        self.t0 = 0.0
        self._primed = await self._one_off(write=False)

    def anchor(self, t0: float) -> None:
        """Set the anchor; a primed scrape becomes the first row, dated before it."""
        for s in self._primed:
            s.t -= t0  # it was taken in absolute loop time
            self._write(s)
        self._primed = []
        self.t0 = t0

    async def final(self) -> None:
        """One last scrape when the replay ends (bounded by ``final_timeout``):
        the run's counters then cover every request."""
        await self._one_off(write=True)

    def counter_delta(self, url: str, name: str) -> float | None:
        """How much a counter (summed over its label sets) grew from the first
        scrape of ``url`` to the last; None without two scrapes or the name."""
        first, last = self.first.get(url), self.last.get(url)
        if first is None or last is None or first is last:
            return None
        a, b = counter_sum(first.text, name), counter_sum(last.text, name)
        return None if a is None or b is None else b - a

    def spec_decode(self, url: str) -> dict[str, Any] | None:
        """Speculative decoding over the run (first to last scrape of ``url``):
        see :func:`spec_decode_figures`."""
        first, last = self.first.get(url), self.last.get(url)
        if first is None or last is None or first is last:
            return None
        return spec_decode_figures(first.text, last.text)

    def before(self, t: float) -> dict[str, Scrape]:
        """The last scrape of each source taken at or before ``t``."""
        out: dict[str, Scrape] = {}
        for url, hist in self.history.items():
            prior = [s for s in hist if s.t <= t]
            if prior:
                out[url] = prior[-1]
        return out


def counter_sum(text: str, name: str) -> float | None:
    """The sum of every sample named ``name`` (``..._total``) in an exposition."""
    total, seen = 0.0, False
    try:
        for n, _, v in parse_samples(text):
            if n == name:
                total += v
                seen = True
    except ValueError:
        return None
    return total if seen else None


SPEC_DECODE_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
"""vLLM's speculative-decoding counters (``vllm/v1/spec_decode/metrics.py``):
present only on a server launched with ``--speculative-config``."""
SPEC_DECODE_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
"""Accepted tokens by draft position (label ``position``, 0-based)."""


def counter_by_label(text: str, name: str, label: str) -> dict[str, float]:
    """Samples named ``name`` summed by the value of ``label`` (other labels,
    such as ``engine``, summed over)."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and label in s.labels:
                    key = s.labels[label]
                    out[key] = out.get(key, 0.0) + s.value
    except ValueError:
        return {}
    return out


def spec_decode_figures(first: str, last: str) -> dict[str, Any] | None:
    """Draft and accepted tokens between two expositions of one server, and
    what vLLM derives from them: the acceptance rate (accepted / draft
    tokens), the mean acceptance length (1 + accepted / drafts: the bonus
    token included, as vLLM logs it) and accepted tokens per draft position.
    None when the server exposes no speculative-decoding counters (it was
    not launched with it)."""
    got: dict[str, float] = {}
    for key, name in SPEC_DECODE_COUNTERS.items():
        a, b = counter_sum(first, name), counter_sum(last, name)
        if b is None:
            return None
        got[key] = b - (a or 0.0)
    pos_a = counter_by_label(first, SPEC_DECODE_PER_POSITION, "position")
    pos_b = counter_by_label(last, SPEC_DECODE_PER_POSITION, "position")
    positions = sorted(pos_b, key=lambda p: int(p) if p.isdigit() else 1 << 30)
    drafts, drafted, accepted = (int(got[k]) for k in SPEC_DECODE_COUNTERS)
    return {
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "accepted_per_position": [int(pos_b[p] - pos_a.get(p, 0.0)) for p in positions],
    }


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every sample row of a run's metrics.arrow (a torn tail is dropped)."""
    rows: list[dict[str, Any]] = read_stream(path).to_pylist()
    return rows


def series(rows: list[dict[str, Any]], name: str, **labels: str) -> list[tuple[float, float]]:
    """(t, value) of one metric, optionally filtered by label values."""
    out = []
    for r in rows:
        if r["name"] != name:
            continue
        if labels:
            have = orjson.loads(r["labels"])
            if any(have.get(k) != v for k, v in labels.items()):
                continue
        out.append((r["t"], r["value"]))
    return out
