"""replayer's own live Prometheus metrics (``--metrics-port`` on replay, bisect, record).

Why: a replay against a 1M-token agent trace, a bisect of fifty trials or a
day of recording runs for hours, and the people watching it want Grafana
while it runs, not ``summary.json`` at the end. This module is the one place
the metrics are defined; the subsystems only get an optional
:class:`LiveMetrics` handed in, and nothing here exists when it is not.

Names follow Prometheus conventions: a ``replayer_`` prefix, base units
(seconds, bytes), ``_total`` on counters. Every metric lives on a registry of
our own (never prometheus_client's global default, which the emulator and
tests share), served by prometheus_client's HTTP server in a daemon thread.

**Cost on the hot path.** Two mechanisms, chosen so the replay engine carries
no metrics code:

* Per-request counters and histograms are updated once per *settled* request
  by the results writer's ``on_add`` hook
  (:class:`~replayer.replay.results.ResultsWriter`): the single place every
  request of a replay passes exactly once, sent or not, so the counters equal
  ``results.arrow`` by construction. One ``observe`` is a lock and a bisect
  over the buckets, a few microseconds.
* Everything that is a *state* (requests dispatched and in flight, the last
  schedule lag, target health, the bisect's best size, the recorder's
  counters and bytes on disk) is read from the running objects at scrape
  time by custom collectors, from the HTTP thread. Those reads are of ints
  and object references, atomic under the GIL; nothing is mutated.

Histogram buckets suit long contexts: a 1M-token prefill takes minutes, so
TTFT buckets reach 10 minutes and end-to-end latency 30 minutes (the default
``--request-timeout``).

The metrics (labels in parentheses):

* ``replayer_requests_dispatched_total`` (target): requests put on the wire;
* ``replayer_requests_completed_total`` (target, status): sent requests that
  finished, by final status (``ok``, ``aborted``, ``http_error``,
  ``transport_error``, ``timeout``);
* ``replayer_requests_failed_total`` (target, error_class): of those, the
  ones neither ``ok`` nor ``aborted`` (a replayed client abort is the
  trace's, by design: never a failure);
* ``replayer_requests_not_sent_total`` (target, reason): ``skipped`` or
  ``not_sent_after_crash``;
* ``replayer_requests_inflight`` (target);
* ``replayer_ttft_seconds``, ``replayer_itl_seconds`` (mean inter-token
  latency of each request), ``replayer_e2e_seconds`` (target): histograms of
  the ``ok`` requests, as ``summary.json`` counts them;
* ``replayer_schedule_lag_seconds`` (target): histogram of dispatch minus
  schedule, every sent request; ``replayer_schedule_lag_last_seconds``
  (target): the last dispatched request's;
* ``replayer_target_health`` (target, state): 1 for the current state
  (``unknown``, ``healthy``, ``unhealthy``, ``unreachable``, ``failed``), 0
  for the others;
* ``replayer_target_failures_total`` (target, class): classified failures;
* ``replayer_bisect_trials_total`` (stage, outcome), ``replayer_bisect_trial``
  (the last finished trial's number), ``replayer_bisect_candidate_size`` (its
  requests), ``replayer_bisect_best_size`` (the best repro so far),
  ``replayer_bisect_selection_size`` (where the bisect started);
* ``replayer_record_exchanges_total`` (outcome: ``ok``, ``failed``),
  ``replayer_record_requests_forwarded_total``, ``replayer_record_inflight``,
  ``replayer_record_rows_written_total``, ``replayer_record_rows_flushed_total``
  (on disk: what survives a SIGKILL), ``replayer_record_write_errors_total``,
  ``replayer_record_bytes_written_total`` (the trace segment's size on disk),
  ``replayer_record_rows_lost_total`` and ``replayer_record_recording`` (0
  once recording stopped, say on a full disk, while traffic flows on).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from replayer.replay.results import Result, Status

if TYPE_CHECKING:
    from replayer.bisect.oracle import Candidate, TrialRecord
    from replayer.bisect.pipeline import Bisect
    from replayer.record.proxy import RecordingProxy
    from replayer.replay.engine import Replay

TTFT_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 450, 600,
)  # fmt: skip
"""Seconds: a short chat turn answers in 50 ms, a 1M-token prefill in minutes."""
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25,
    0.5, 1, 2.5, 5,
)  # fmt: skip
E2E_BUCKETS = (
    0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1200, 1800,
)  # fmt: skip
LAG_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)  # fmt: skip

HEALTH_STATES = ("unknown", "healthy", "unhealthy", "unreachable", "failed")
_NOT_SENT = (Status.NOT_SENT_AFTER_CRASH, Status.SKIPPED)
_NOT_FAILED = (Status.OK, Status.ABORTED)
"""Settled statuses that are no failure: an abort is the recorded client's, by design."""


@dataclass
class _Snapshot:
    """What a finished replay leaves behind for the collectors."""

    dispatched: int
    health: str


class _ReplayCollector(Collector):
    """Dispatched, in flight, last lag and health, read at scrape time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replays: list[Replay] = []
        self.done: dict[str, int] = {}
        """Requests dispatched by replays that have finished, per target."""
        self.last: dict[str, _Snapshot] = {}

    def collect(self) -> Iterable[Metric]:
        dispatched = CounterMetricFamily(
            "replayer_requests_dispatched",
            "Requests put on the wire, per target.",
            labels=["target"],
        )
        inflight = GaugeMetricFamily(
            "replayer_requests_inflight", "Requests in flight, per target.", labels=["target"]
        )
        lag = GaugeMetricFamily(
            "replayer_schedule_lag_last_seconds",
            "Dispatch minus schedule of the last dispatched request: the replayer's lateness.",
            labels=["target"],
        )
        health = GaugeMetricFamily(
            "replayer_target_health",
            "1 for the target's current state (last /health probe, or failed), 0 otherwise.",
            labels=["target", "state"],
        )
        with self.lock:
            replays = list(self.replays)
            totals = dict(self.done)
            states = {name: s.health for name, s in self.last.items()}
        live: dict[str, tuple[int, int, int]] = {}
        for replay in replays:
            for name, snap in replay.snapshot().items():
                sent, n, last = live.get(name, (0, 0, 0))
                live[name] = (sent + snap.sent, n + snap.inflight, snap.last_lag_us)
                states[name] = snap.health
        for name in sorted(set(totals) | set(live)):
            sent, n, last = live.get(name, (0, 0, 0))
            dispatched.add_metric([name], totals.get(name, 0) + sent)
            inflight.add_metric([name], n)
            if name in live:
                lag.add_metric([name], last / 1e6)
        for name, state in sorted(states.items()):
            for s in HEALTH_STATES:
                health.add_metric([name, s], 1.0 if s == state else 0.0)
        return [dispatched, inflight, lag, health]


class _BisectCollector(Collector):
    def __init__(self, bisect: Bisect) -> None:
        self.bisect = bisect

    def collect(self) -> Iterable[Metric]:
        b = self.bisect
        best = GaugeMetricFamily(
            "replayer_bisect_best_size", "Requests in the best (smallest crashing) repro so far."
        )
        best.add_metric([], len(b.best.positions))
        sel = GaugeMetricFamily(
            "replayer_bisect_selection_size", "Requests in the selection the bisect started from."
        )
        sel.add_metric([], len(b.rows))
        return [best, sel]


class _RecorderCollector(Collector):
    def __init__(self, proxy: RecordingProxy) -> None:
        self.proxy = proxy

    def collect(self) -> Iterable[Metric]:
        st = self.proxy.stats()
        ex = CounterMetricFamily(
            "replayer_record_exchanges",
            "Recorded exchanges handed to the trace writer, by outcome.",
            labels=["outcome"],
        )
        ex.add_metric(["ok"], st.recorded - st.failed)
        ex.add_metric(["failed"], st.failed)
        fwd = CounterMetricFamily(
            "replayer_record_requests_forwarded", "Requests forwarded upstream (recorded or not)."
        )
        fwd.add_metric([], st.forwarded)
        inflight = GaugeMetricFamily(
            "replayer_record_inflight", "Exchanges in flight through the proxy."
        )
        inflight.add_metric([], st.inflight)
        rows = CounterMetricFamily(
            "replayer_record_rows_written", "Rows accepted by the trace writer."
        )
        rows.add_metric([], st.rows_written)
        flushed = CounterMetricFamily(
            "replayer_record_rows_flushed",
            "Rows in the trace file: every exchange a client saw complete is among them.",
        )
        flushed.add_metric([], st.rows_flushed)
        errors = CounterMetricFamily(
            "replayer_record_write_errors", "Rows that could not be written."
        )
        errors.add_metric([], st.write_errors)
        size = CounterMetricFamily(
            "replayer_record_bytes_written", "Bytes of the trace (this segment) on disk."
        )
        size.add_metric([], st.bytes_on_disk)
        lost = CounterMetricFamily(
            "replayer_record_rows_lost",
            "Exchanges forwarded but not recorded because recording stopped (disk full).",
        )
        lost.add_metric([], st.rows_lost)
        recording = GaugeMetricFamily(
            "replayer_record_recording", "1 while recording, 0 once recording stopped."
        )
        recording.add_metric([], 1 if st.stopped is None else 0)
        return [ex, fwd, inflight, rows, flushed, errors, size, lost, recording]


class MetricsServer:
    """prometheus_client's HTTP server on a thread; ``close`` stops it."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str) -> None:
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.host = host
        self.port = int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class LiveMetrics:
    """replayer's metrics on a registry of its own.

    **Usage**::

        live = LiveMetrics()
        server = live.serve(9400)            # http://127.0.0.1:9400/metrics
        await replay_to_dir(..., live=live)  # or TrialEnv(live=...), serve(config, live=...)
        server.close()
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.completed = Counter(
            "replayer_requests_completed",
            "Sent requests that finished, by target and final status.",
            ["target", "status"],
            registry=r,
        )
        self.failed = Counter(
            "replayer_requests_failed",
            "Sent requests that failed (neither ok nor aborted by design), by target and "
            "error class.",
            ["target", "error_class"],
            registry=r,
        )
        self.not_sent = Counter(
            "replayer_requests_not_sent",
            "Requests never sent, by target and reason.",
            ["target", "reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "replayer_ttft_seconds",
            "Time to first token of ok requests (first token minus dispatch).",
            ["target"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "replayer_itl_seconds",
            "Mean inter-token latency of each ok request.",
            ["target"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "replayer_e2e_seconds",
            "End-to-end latency of ok requests (last byte minus dispatch).",
            ["target"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.lag = Histogram(
            "replayer_schedule_lag_seconds",
            "Dispatch minus schedule of every sent request: the replayer's own lateness.",
            ["target"],
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.failures = Counter(
            "replayer_target_failures",
            "Target failures, by class (after the settle window).",
            ["target", "class"],
            registry=r,
        )
        self._replays = _ReplayCollector()
        r.register(self._replays)

    # -- replay --------------------------------------------------------------------

    def observe(self, r: Result) -> None:
        """One settled request (the results writer's ``on_add`` hook)."""
        t = r.target
        if r.status in _NOT_SENT and r.seq is None:
            self.not_sent.labels(t, r.status.value).inc()
            return
        self.completed.labels(t, r.status.value).inc()
        if r.status not in _NOT_FAILED:
            self.failed.labels(t, r.error_class or r.status.value).inc()
        if r.lag_us is not None:
            self.lag.labels(t).observe(max(0, r.lag_us) / 1e6)
        if r.status is not Status.OK or r.dispatched_us is None:
            return
        if r.first_token_us is not None:
            self.ttft.labels(t).observe((r.first_token_us - r.dispatched_us) / 1e6)
        if r.done_us is not None:
            self.e2e.labels(t).observe((r.done_us - r.dispatched_us) / 1e6)
        if r.itl_mean_us is not None:
            self.itl.labels(t).observe(r.itl_mean_us / 1e6)

    def attach(self, replay: Replay) -> None:
        """Expose a replay's live state until :meth:`detach`."""
        with self._replays.lock:
            self._replays.replays.append(replay)

    def detach(self, replay: Replay) -> None:
        """The replay is over: keep its totals, count its classified failures."""
        c = self._replays
        final = replay.snapshot()
        with c.lock:
            if replay in c.replays:
                c.replays.remove(replay)
            for name, snap in final.items():
                c.done[name] = c.done.get(name, 0) + snap.sent
                c.last[name] = _Snapshot(snap.sent, snap.health)
        for name, snap in final.items():
            if snap.failure_class is not None:
                self.failures.labels(name, snap.failure_class).inc()

    # -- bisect --------------------------------------------------------------------

    def attach_bisect(self, bisect: Bisect) -> None:
        """Trial counters through the oracle's ``on_trial`` hook; the best size
        is read at scrape time (it improves between trials)."""
        r = self.registry
        trials = Counter(
            "replayer_bisect_trials",
            "Bisect trials finished, by stage and outcome.",
            ["stage", "outcome"],
            registry=r,
        )
        trial = Gauge("replayer_bisect_trial", "Number of the last finished trial.", registry=r)
        size = Gauge(
            "replayer_bisect_candidate_size",
            "Requests in the candidate of the last finished trial.",
            registry=r,
        )
        r.register(_BisectCollector(bisect))

        def on_trial(rec: TrialRecord, cand: Candidate) -> None:
            trials.labels(rec.stage, rec.outcome.value).inc()
            trial.set(rec.trial)
            size.set(rec.size)

        bisect.oracle.on_trial.append(on_trial)

    # -- recorder ------------------------------------------------------------------

    def attach_recorder(self, proxy: RecordingProxy) -> None:
        self.registry.register(_RecorderCollector(proxy))

    # -- serving -------------------------------------------------------------------

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve ``/metrics`` on ``host:port`` (port 0: any free port)."""
        return MetricsServer(self.registry, port, host)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """Every sample now, as (name, labels, value): what a scrape would see."""
        for family in self.registry.collect():
            for s in family.samples:
                yield s.name, dict(s.labels), s.value
