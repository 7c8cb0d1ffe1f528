"""``/metrics``: vLLM's Prometheus metric names, types, labels and buckets
(VLLM.md §5), on a registry owned by one app. The family set, help texts,
label sets and buckets are those of a real vLLM 0.32.0 (measured), including
the families the emulator never moves (external and multi-modal caches,
FLOPs estimates, admission rejections: all 0), the tool-parser counter when
a tool-call parser is enabled, and prometheus-fastapi-instrumentator's
``http_*`` families (see :meth:`Metrics.http`).

A per-app :class:`~prometheus_client.CollectorRegistry` (not the global one)
lets several emulators live in one test process. Like single-API-server
vLLM it also carries the process and GC collectors and ``*_created`` series.
Labels are ``engine="0"`` and ``model_name`` (the first served name),
declared in sorted order as prometheus_client prints vLLM's.

With ``--speculative-config`` the ``vllm:spec_decode_*`` counters exist too
(names and labels as vLLM's ``SpecDecodingProm``): the emulator drafts
nothing, so each generated token counts as one draft of
``num_speculative_tokens`` tokens of which a fixed rotation 0, 1, ..., k is
accepted (see :class:`SpecDecode`); replayer's results must equal the
counters' deltas, whatever they are.

The engine calls the ``on_*`` hooks; this module never reads engine state.
After engine death nothing calls them, so gauges keep their last values, as
vLLM's do.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
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
HTTP_BUCKETS = (0.1, 0.5, 1.0)
HTTP_HIGHR_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
)
HTTP_EXCLUDED = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")
"""Paths vLLM's instrumentator does not count."""
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
TOOL_MODES = ("streaming", "non_streaming")
TOOL_OUTCOMES = ("tool_call", "no_tool_call")
TOOL_REQUEST_TYPES = ("chat_completions", "responses", "other")
_MFU = "(for Model Flops Utilization calculations)."
_HELP = {
    "running": "Number of requests in model execution batches.",
    "waiting": "Number of requests waiting to be processed.",
    "by_reason": "Number of waiting requests by reason. Reason labels: 'capacity' = waiting "
    "for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
    "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    "sleep": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
    "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    "kv": "KV-cache usage. 1 means 100 percent usage.",
    "queries": "Prefix cache queries, in terms of number of queried tokens.",
    "hits": "Prefix cache hits, in terms of number of cached tokens.",
    "ext_queries": "External prefix cache queries from KV connector cross-instance cache "
    "sharing, in terms of number of queried tokens.",
    "ext_hits": "External prefix cache hits from KV connector cross-instance cache sharing, "
    "in terms of number of cached tokens.",
    "mm_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "mm_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "preemptions": "Cumulative number of preemption from the engine.",
    "prompt": "Number of prefill tokens processed.",
    "by_source": "Number of prompt tokens by source.",
    "cached": "Number of cached prompt tokens (local + external).",
    "cached_by_source": "Prefix-cache hit tokens by the cache tier that supplied them: device "
    "(local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) "
    "or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
    "vllm:external_prefix_cache_hits.",
    "generation": "Number of generation tokens processed.",
    "success": "Count of successfully processed requests.",
    "admission": "Number of admission attempts rejected by a queue limit, by reason.",
    "ttft": "Histogram of time to first token in seconds.",
    "itl": "Histogram of inter-token latency in seconds.",
    "tpot": "Histogram of time_per_output_token_seconds per request.",
    "e2e": "Histogram of e2e request latency in seconds.",
    "queue": "Histogram of time spent in WAITING phase for request.",
    "inference": "Histogram of time spent in RUNNING phase for request.",
    "prefill": "Histogram of time spent in PREFILL phase for request.",
    "decode": "Histogram of time spent in DECODE phase for request.",
    "req_prompt": "Number of prefill tokens processed.",
    "req_gen": "Number of generation tokens processed.",
    "max_gen": "Histogram of maximum number of requested generation tokens.",
    "params_n": "Histogram of the n request parameter.",
    "max_tokens": "Histogram of the max_tokens request parameter.",
    "iteration": "Histogram of number of tokens per engine_step.",
    "req_preempt": "Histogram of the number of times a request was preempted.",
    "kv_computed": "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    "flops": f"Estimated number of floating point operations per GPU {_MFU}",
    "read": f"Estimated number of bytes read from memory per GPU {_MFU}",
    "write": f"Estimated number of bytes written to memory per GPU {_MFU}",
    "tool": "Total number of ToolParser invocations. Non-streaming increments once per "
    "choice; streaming increments once per delta.",
    "http_total": "Total number of requests by method, status and handler.",
    "http_req_size": "Content length of incoming requests by handler. Only value of header is "
    "respected. Otherwise ignored. No percentile calculated. ",
    "http_resp_size": "Content length of outgoing responses by handler. Only value of header "
    "is respected. Otherwise ignored. No percentile calculated. ",
    "http_highr": "Latency with many buckets but no API specific labels. Made for more "
    "accurate percentile calculations. ",
    "http_duration": "Latency with only few buckets by handler. Made to be only used if "
    "aggregation by handler is important. ",
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


def num_speculative_tokens(spec: str | None) -> int | None:
    """``num_speculative_tokens`` of a ``--speculative-config`` JSON (None:
    no speculative decoding; 1 where the value is missing or unreadable)."""
    if spec is None:
        return None
    try:
        value = json.loads(spec).get("num_speculative_tokens", 1)
        return max(1, int(value))
    except (ValueError, TypeError, AttributeError):
        return 1


class SpecDecode:
    """vLLM's speculative-decoding counters, moved by generated tokens."""

    def __init__(self, registry: CollectorRegistry, kv: dict[str, str], k: int) -> None:
        lab = ["engine", "model_name"]
        self.k = k
        self.drafts = Counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", lab, registry=registry
        ).labels(**kv)
        self.draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", lab, registry=registry
        ).labels(**kv)
        self.accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            lab,
            registry=registry,
        ).labels(**kv)
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*lab, "position"],
            registry=registry,
        )
        self.per_pos = [per_pos.labels(**kv, position=str(p)) for p in range(k)]
        self._n = 0

    def observe(self, tokens: int, steps: list[int] | None = None) -> None:
        """``tokens`` generated: one draft each, accepting 0, 1, ..., k in turn;
        each draft's accepted count is appended to ``steps`` (the request's own
        record, so its figures sum to the counters)."""
        for _ in range(max(0, tokens)):
            j = self._n % (self.k + 1)
            self._n += 1
            self.drafts.inc()
            self.draft_tokens.inc(self.k)
            self.accepted.inc(j)
            for p in range(j):
                self.per_pos[p].inc()
            if steps is not None:
                steps.append(j)


def spec_decode_object(steps: list[int], k: int, *, detailed: bool = False) -> dict[str, Any]:
    """A request's ``metrics.speculative_decoding`` as vLLM 0.32 sends it
    (``RequestSpecDecodeMetrics.to_dict`` in ``vllm/v1/metrics/stats.py``):
    ``acceptance_histogram[j]`` counts the steps that accepted j draft tokens;
    every step here proposed ``k``."""
    hist = [0] * (k + 1)
    for j in steps:
        hist[j] += 1
    n = len(steps)
    accepted = sum(steps)
    drafted = n * k
    out: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / n if n else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": hist,
        "num_spec_steps": n,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": k,
    }
    if detailed and steps:
        out["per_step_accepted"] = list(steps)
        out["per_step_drafted"] = [k] * n
    return out


class _Generated:
    """``vllm:generation_tokens``, which also drives :class:`SpecDecode`."""

    def __init__(self, counter: Counter, spec: SpecDecode | None) -> None:
        self.counter = counter
        self.spec = spec

    def inc(self, amount: float = 1, steps: list[int] | None = None) -> None:
        """``steps``: the generating request's record (see :meth:`SpecDecode.observe`)."""
        self.counter.inc(amount)
        if self.spec is not None:
            self.spec.observe(int(amount), steps)


class Metrics:
    """The emulator's metric set, pre-bound to its ``engine``/``model_name`` labels."""

    def __init__(self, cfg: EmulatorConfig) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        for c in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
            r.register(c)
        lab = ["engine", "model_name"]
        name = cfg.served_model_name
        kv = {"engine": "0", "model_name": name}

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(metric, doc, lab, registry=r, multiprocess_mode="mostrecent").labels(**kv)

        def counter(metric: str, doc: str) -> Counter:
            return Counter(metric, doc, lab, registry=r).labels(**kv)

        def by(metric: str, doc: str, label: str, values: tuple[str, ...]) -> dict[str, Counter]:
            c = Counter(metric, doc, ["engine", "model_name", label], registry=r)
            return {v: c.labels(**kv, **{label: v}) for v in values}

        def hist(metric: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return Histogram(metric, doc, lab, registry=r, buckets=buckets).labels(**kv)

        for metric, key in (
            ("vllm:estimated_flops_per_gpu", "flops"),
            ("vllm:estimated_read_bytes_per_gpu", "read"),
            ("vllm:estimated_write_bytes_per_gpu", "write"),
        ):
            counter(metric, _HELP[key])
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
        sleep = Gauge(
            "vllm:engine_sleep_state",
            _HELP["sleep"],
            ["engine", "model_name", "sleep_state"],
            registry=r,
        )
        for state in SLEEP_STATES:
            sleep.labels(sleep_state=state, **kv).set(1 if state == "awake" else 0)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", _HELP["kv"])
        self.prefix_queries = counter("vllm:prefix_cache_queries", _HELP["queries"])
        self.prefix_hits = counter("vllm:prefix_cache_hits", _HELP["hits"])
        counter("vllm:external_prefix_cache_queries", _HELP["ext_queries"])
        counter("vllm:external_prefix_cache_hits", _HELP["ext_hits"])
        counter("vllm:mm_cache_queries", _HELP["mm_queries"])
        counter("vllm:mm_cache_hits", _HELP["mm_hits"])
        self.preemptions = counter("vllm:num_preemptions", _HELP["preemptions"])
        self.prompt_tokens = counter("vllm:prompt_tokens", _HELP["prompt"])
        self.prompt_by_source = by(
            "vllm:prompt_tokens_by_source", _HELP["by_source"], "source", PROMPT_SOURCES
        )
        self.prompt_cached = counter("vllm:prompt_tokens_cached", _HELP["cached"])
        self.cached_by_source = by(
            "vllm:prompt_tokens_cached_by_source",
            _HELP["cached_by_source"],
            "source",
            CACHE_SOURCES,
        )
        k = num_speculative_tokens(cfg.speculative_config)
        self.spec_decode = SpecDecode(r, kv, k) if k is not None else None
        self.generation_tokens = _Generated(
            counter("vllm:generation_tokens", _HELP["generation"]), self.spec_decode
        )
        success = Counter(
            "vllm:request_success",
            _HELP["success"],
            ["engine", "finished_reason", "model_name"],
            registry=r,
        )
        self.success = {f: success.labels(finished_reason=f, **kv) for f in FINISH_REASONS}
        admission = Counter(
            "vllm:admission_rejections", _HELP["admission"], ["model_name", "reason"], registry=r
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            admission.labels(model_name=name, reason=reason)
        tok = buckets_1_2_5(cfg.max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", _HELP["req_prompt"], tok)
        self.req_generation = hist("vllm:request_generation_tokens", _HELP["req_gen"], tok)
        self.iteration = hist("vllm:iteration_tokens_total", _HELP["iteration"], ITERATION_BUCKETS)
        self.req_max_generation = hist(
            "vllm:request_max_num_generation_tokens", _HELP["max_gen"], tok
        )
        self.req_params_n = hist("vllm:request_params_n", _HELP["params_n"], (1, 2, 5, 10, 20))
        self.req_max_tokens = hist("vllm:request_params_max_tokens", _HELP["max_tokens"], tok)
        self.ttft = hist("vllm:time_to_first_token_seconds", _HELP["ttft"], TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", _HELP["itl"], ITL_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds", _HELP["tpot"], ITL_BUCKETS)
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
        self.req_preemptions = hist(
            "vllm:request_num_preemptions", _HELP["req_preempt"], (1, 2, 3, 4, 5, 10, 20)
        )
        self.kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens", _HELP["kv_computed"], tok
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
        self._http_total = Counter(
            "http_requests_total", _HELP["http_total"], ["handler", "method", "status"], registry=r
        )
        self._http_req_size = Summary(
            "http_request_size_bytes", _HELP["http_req_size"], ["handler"], registry=r
        )
        self._http_resp_size = Summary(
            "http_response_size_bytes", _HELP["http_resp_size"], ["handler"], registry=r
        )
        self._http_highr = Histogram(
            "http_request_duration_highr_seconds",
            _HELP["http_highr"],
            registry=r,
            buckets=HTTP_HIGHR_BUCKETS,
        )
        self._http_duration = Histogram(
            "http_request_duration_seconds",
            _HELP["http_duration"],
            ["handler", "method"],
            registry=r,
            buckets=HTTP_BUCKETS,
        )
        self._tools: dict[tuple[str, str], Counter] = {}
        if cfg.enable_auto_tool_choice and cfg.tool_call_parser:
            tools = Counter(
                "vllm:tool_call_parser_invocations",
                _HELP["tool"],
                ["mode", "model_name", "outcome", "request_type"],
                registry=r,
            )
            for mode in TOOL_MODES:
                for outcome in TOOL_OUTCOMES:
                    for rtype in TOOL_REQUEST_TYPES:
                        child = tools.labels(
                            mode=mode, model_name=name, outcome=outcome, request_type=rtype
                        )
                        if rtype == "chat_completions":
                            self._tools[(mode, outcome)] = child

    def prompt_admitted(self, prompt_tokens: int, cached: int) -> None:
        """A request's prompt at its first token: tokens by source, cache hits."""
        self.prompt_tokens.inc(prompt_tokens)
        self.prompt_by_source["local_compute"].inc(prompt_tokens - cached)
        self.prompt_by_source["local_cache_hit"].inc(cached)
        self.prompt_cached.inc(cached)
        self.cached_by_source["device"].inc(cached)
        self.kv_computed.observe(prompt_tokens - cached)

    def tool_parser(self, streaming: bool, times: int = 1) -> None:
        """The tool-call parser ran over ``times`` deltas (or one choice); it never
        finds a call in filler text. No-op without a parser."""
        c = self._tools.get(("streaming" if streaming else "non_streaming", "no_tool_call"))
        if c is not None and times > 0:
            c.inc(times)

    def http(
        self,
        handler: str,
        method: str,
        status: int,
        seconds: float,
        request_size: int,
        response_size: int,
    ) -> None:
        """One finished HTTP request, as prometheus-fastapi-instrumentator counts
        it: ``handler`` is the route template (``none`` for unknown paths),
        status grouped as ``2xx``; sizes are the Content-Length headers (0
        without one)."""
        if handler in HTTP_EXCLUDED:
            return
        self._http_total.labels(handler=handler, method=method, status=f"{status // 100}xx").inc()
        self._http_req_size.labels(handler=handler).observe(request_size)
        self._http_resp_size.labels(handler=handler).observe(response_size)
        self._http_highr.observe(seconds)
        self._http_duration.labels(handler=handler, method=method).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
