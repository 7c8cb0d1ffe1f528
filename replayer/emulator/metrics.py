"""``/metrics``: vLLM's Prometheus metric names, types, labels and buckets
(VLLM.md §5), on a registry owned by one app.

A per-app :class:`~prometheus_client.CollectorRegistry` (not the global one)
lets several emulators live in one test process. Like single-API-server
vLLM it also carries the process and GC collectors and ``*_created`` series.
Labels are ``engine="0"`` and ``model_name`` (the first served name),
declared in sorted order as prometheus_client prints vLLM's.

The engine calls the ``on_*`` hooks; this module never reads engine state.
After engine death nothing calls them, so gauges keep their last values, as
vLLM's do.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from replayer.emulator.config import EmulatorConfig

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_HELP = {
    "running": "Number of requests in model execution batches.",
    "waiting": "Number of requests waiting to be processed.",
    "by_reason": "Number of requests waiting to be processed, by reason.",
    "kv": "KV-cache usage. 1 means 100 percent usage.",
    "queries": "Prefix cache queries, in terms of number of queried tokens.",
    "hits": "Prefix cache hits, in terms of number of cached tokens.",
    "preemptions": "Cumulative number of preemption from the engine.",
    "prompt": "Number of prefill tokens processed.",
    "generation": "Number of generation tokens processed.",
    "success": "Count of successfully processed requests.",
    "ttft": "Histogram of time to first token in seconds.",
    "itl": "Histogram of inter-token latency in seconds.",
    "e2e": "Histogram of e2e request latency in seconds.",
    "queue": "Histogram of time spent in WAITING phase for request.",
    "inference": "Histogram of time spent in RUNNING phase for request.",
    "prefill": "Histogram of time spent in PREFILL phase for request.",
    "decode": "Histogram of time spent in DECODE phase for request.",
    "req_prompt": "Number of prefill tokens processed.",
    "req_gen": "Number of generation tokens processed.",
    "max_tokens": "Histogram of the max_tokens request parameter.",
    "iteration": "Histogram of number of tokens per engine_step.",
    "req_preempt": "Number of preemptions per request.",
}


def buckets_1_2_5(limit: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's ``build_1_2_5_buckets``)."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > limit:
                return out
            out.append(float(v))
        exp += 1


class _CacheConfigInfo(Collector):
    def __init__(self, labels: dict[str, str]) -> None:
        self._labels = labels

    def collect(self) -> list[GaugeMetricFamily]:
        names = sorted(self._labels)
        g = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=names
        )
        g.add_metric([self._labels[n] for n in names], 1.0)
        return [g]


class Metrics:
    """The emulator's metric set, pre-bound to its ``engine``/``model_name`` labels."""

    def __init__(self, cfg: EmulatorConfig) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        for c in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(c)
        lab = ["engine", "model_name"]
        kv = {"engine": "0", "model_name": cfg.served_model_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, lab, registry=r, multiprocess_mode="mostrecent").labels(**kv)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, lab, registry=r).labels(**kv)

        def hist(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return Histogram(name, doc, lab, registry=r, buckets=buckets).labels(**kv)

        self.running = gauge("vllm:num_requests_running", _HELP["running"])
        self.waiting = gauge("vllm:num_requests_waiting", _HELP["waiting"])
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            _HELP["by_reason"],
            ["engine", "model_name", "reason"],
            registry=r,
        )
        self.waiting_capacity = by_reason.labels(reason="capacity", **kv)
        by_reason.labels(reason="deferred", **kv).set(0)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", _HELP["kv"])
        self.prefix_queries = counter("vllm:prefix_cache_queries", _HELP["queries"])
        self.prefix_hits = counter("vllm:prefix_cache_hits", _HELP["hits"])
        self.preemptions = counter("vllm:num_preemptions", _HELP["preemptions"])
        self.prompt_tokens = counter("vllm:prompt_tokens", _HELP["prompt"])
        self.generation_tokens = counter("vllm:generation_tokens", _HELP["generation"])
        success = Counter(
            "vllm:request_success",
            _HELP["success"],
            ["engine", "finished_reason", "model_name"],
            registry=r,
        )
        self.success = {f: success.labels(finished_reason=f, **kv) for f in FINISH_REASONS}
        self.ttft = hist("vllm:time_to_first_token_seconds", _HELP["ttft"], TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", _HELP["itl"], ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", _HELP["e2e"], LATENCY_BUCKETS)
        self.queue_time = hist("vllm:request_queue_time_seconds", _HELP["queue"], LATENCY_BUCKETS)
        self.inference_time = hist(
            "vllm:request_inference_time_seconds", _HELP["inference"], LATENCY_BUCKETS
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds", _HELP["prefill"], LATENCY_BUCKETS
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds", _HELP["decode"], LATENCY_BUCKETS
        )
        tok = buckets_1_2_5(cfg.max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", _HELP["req_prompt"], tok)
        self.req_generation = hist("vllm:request_generation_tokens", _HELP["req_gen"], tok)
        self.req_max_tokens = hist("vllm:request_params_max_tokens", _HELP["max_tokens"], tok)
        self.iteration = hist("vllm:iteration_tokens_total", _HELP["iteration"], ITERATION_BUCKETS)
        self.req_preemptions = hist(
            "vllm:request_num_preemptions", _HELP["req_preempt"], (1, 2, 3, 4, 5, 10, 20)
        )
        r.register(
            _CacheConfigInfo(
                {
                    "block_size": str(cfg.block_size),
                    "cache_dtype": cfg.kv_cache_dtype,
                    "enable_prefix_caching": str(cfg.enable_prefix_caching),
                    "engine": "0",
                    "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
                    "kv_cache_size_tokens": str(cfg.num_gpu_blocks * cfg.block_size),
                    "num_gpu_blocks": str(cfg.num_gpu_blocks),
                    "num_gpu_blocks_override": str(cfg.num_gpu_blocks),
                    "prefix_caching_hash_algo": "sha256",
                }
            )
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
