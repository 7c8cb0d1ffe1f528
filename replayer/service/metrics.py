"""The service's own Prometheus metrics, on a registry of its own.

Names (what the Grafana dashboard in ``docker/`` and its test refer to):

* ``replayer_serve_jobs{kind,state}``: jobs by kind and state, read from the
  job store at scrape time (so it is always right after a restart);
* ``replayer_serve_jobs_running``, ``replayer_serve_jobs_queued``;
* ``replayer_serve_job_transitions_total{kind,state}``: jobs that reached a
  terminal state since start;
* ``replayer_serve_api_requests_total{route,method,status}`` and
  ``replayer_serve_api_request_duration_seconds{route}``: the API itself,
  labelled by route *pattern* (bounded cardinality, no job ids);
* ``replayer_serve_upload_bytes_total``;
* ``replayer_serve_info{version}``.

The live replay and bisect metrics come from the jobs' own processes
(:mod:`replayer.service.hooks`); :class:`JobMetrics` appends the ones each
running job exposes, labelled ``job_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from replayer._version import __version__
from replayer.service.jobs import JobState

API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class _JobsCollector(Collector):
    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        counts = self._counts()
        g = GaugeMetricFamily(
            "replayer_serve_jobs", "Jobs by kind and state.", labels=["kind", "state"]
        )
        for kind in ("replay", "bisect", "verify"):
            for state in JobState:
                g.add_metric([kind, state.value], counts.get((kind, state.value), 0))
        yield g
        running = sum(v for (_, s), v in counts.items() if s == JobState.RUNNING.value)
        queued = sum(v for (_, s), v in counts.items() if s == JobState.QUEUED.value)
        yield GaugeMetricFamily("replayer_serve_jobs_running", "Jobs running now.", value=running)
        yield GaugeMetricFamily("replayer_serve_jobs_queued", "Jobs waiting to run.", value=queued)


class JobMetrics(Collector):
    """Live metrics of running jobs, fetched just before a scrape."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for job_id, text in sorted(self.texts.items()):
            try:
                families = list(text_string_to_metric_families(text))
            except ValueError:
                continue
            for fam in families:
                m = merged.get(fam.name)
                if m is None:
                    m = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for s in fam.samples:
                    m.add_sample(s.name, {**s.labels, "job_id": job_id}, s.value, s.timestamp)
        yield from merged.values()


class ServiceMetrics:
    """The registry ``/metrics`` renders."""

    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self.registry = r = CollectorRegistry()
        r.register(_JobsCollector(counts))
        self.jobs = JobMetrics()
        r.register(self.jobs)
        self.requests = Counter(
            "replayer_serve_api_requests",
            "API requests by route pattern, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "replayer_serve_api_request_duration_seconds",
            "API request handling time by route pattern.",
            ["route"],
            buckets=API_BUCKETS,
            registry=r,
        )
        self.transitions = Counter(
            "replayer_serve_job_transitions",
            "Jobs that reached a terminal state, by kind and state.",
            ["kind", "state"],
            registry=r,
        )
        self.upload_bytes = Counter(
            "replayer_serve_upload_bytes", "Trace bytes received by uploads.", registry=r
        )
        info = Gauge("replayer_serve_info", "The serving replayer.", ["version"], registry=r)
        info.labels(version=__version__).set(1)
