"""vLLM-shaped server log lines (VLLM.md §1.1, §2.1, §2.4, §5.2).

Format: ``(<proc> pid=<pid>) <LEVEL> <MM-DD HH:MM:SS> [<file>:<line>] <msg>``,
the prefix repeated on every line of a multi-line message; uvicorn's lines are
``(APIServer pid=<pid>) INFO:     <msg>``. The emulator is one process, so the
EngineCore and worker pids are invented (``pid + 1``, ``pid + 2 + rank``) but
stable for a run.

Crash reports reproduce the sequence a crash detector greps for: the GPU
error (ROCm HSA hard fault, Triton HIP error or CUDA illegal access), the
EngineCore scheduler dump naming the batch's request ids, ``EngineCore
encountered a fatal error.`` with a traceback, then the API server's
``AsyncLLM output_handler failed.`` ending in ``EngineDeadError``. Line
numbers in frames are illustrative, as VLLM.md says of the real ones.

Lines go straight to file descriptors with one ``os.write`` each, so they are
never torn or lost at ``os._exit``. This module formats; it decides nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from replayer.emulator.config import EmulatorConfig

_SITE = "/usr/local/lib/python3.12/dist-packages"
DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
HIP_ERROR = "Triton Error [HIP]: Code: 700, Message: an illegal memory access was encountered"
CUDA_ERROR = "CUDA error: an illegal memory access was encountered"
CUDA_HINTS = [
    "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]
FAULT_KERNEL = ("mla_decode_kernel", "aiter/mla.py", 187)
"""The kernel a GPU fault names when kernels are serialized: its name, and
the file and line of its launch."""
SHM_WARNING = (
    "No available shared memory broadcast block found in {s:g} seconds. This typically "
    "happens when some processes are hanging or doing some time-consuming work (e.g. "
    "compilation, weight/kv cache quantization)."
)


@dataclass(frozen=True, slots=True)
class ReqDump:
    """One request of the batch in a scheduler dump."""

    req_id: str
    prompt_len: int
    num_computed: int
    num_scheduled: int
    num_output: int
    max_tokens: int
    new: bool
    resumed: bool = False


@dataclass(frozen=True, slots=True)
class BatchDump:
    """What EngineCore's ``log_error_detail`` prints about the failing step."""

    reqs: Sequence[ReqDump] = ()
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    queries: int = 0
    hits: int = 0
    requests: int = 0
    extra: dict[str, str] = field(default_factory=dict)


def _frame(path: str, line: int, func: str, code: str) -> list[str]:
    return [f'  File "{_SITE}/{path}", line {line}, in {func}', f"    {code}"]


class ServerLog:
    """Writes log lines to stdout and/or a file."""

    def __init__(
        self, cfg: EmulatorConfig, *, stdout: bool = True, path: Path | None = None
    ) -> None:
        self.cfg = cfg
        self.pid = os.getpid()
        self.engine_pid = self.pid + 1
        self._fds: list[int] = [1] if stdout else []
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fds.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))

    def _emit(self, text: str) -> None:
        data = text.encode(errors="replace")
        for fd in self._fds:
            with contextlib.suppress(OSError):  # a closed stdout must not stop the server
                os.write(fd, data)

    def line(self, proc: str, level: str, where: str, msg: str, pid: int | None = None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        prefix = f"({proc} pid={self.pid if pid is None else pid}) {level} {stamp} [{where}] "
        self._emit("".join(prefix + m + "\n" for m in msg.split("\n")))

    def api(self, level: str, where: str, msg: str) -> None:
        self.line("APIServer", level, where, msg)

    def engine(self, level: str, where: str, msg: str) -> None:
        self.line("EngineCore", level, where, msg, self.engine_pid)

    def raw(self, proc: str, pid: int, msg: str) -> None:
        self._emit(f"({proc} pid={pid}) {msg}\n")

    def uvicorn(self, msg: str) -> None:
        self._emit(f"(APIServer pid={self.pid}) INFO:     {msg}\n")

    def access(
        self, peer: str, method: str, path: str, version: str, status: int, reason: str
    ) -> None:
        self.uvicorn(f'{peer} - "{method} {path} HTTP/{version}" {status} {reason}')

    def worker_pid(self, rank: int) -> int:
        return self.pid + 2 + rank

    # -- start-up ---------------------------------------------------------------

    def config_text(self) -> str:
        c = self.cfg
        return (
            f"model='{c.model}', speculative_config=None, tokenizer='{c.model}', "
            f"skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
            f"trust_remote_code=True, dtype=torch.bfloat16, max_seq_len={c.max_model_len}, "
            f"download_dir=None, load_format=auto, tensor_parallel_size={c.tensor_parallel_size}, "
            f"pipeline_parallel_size=1, data_parallel_size=1, disable_custom_all_reduce=False, "
            f"quantization=None, enforce_eager=False, kv_cache_dtype={c.kv_cache_dtype}, "
            f"device_config=cuda, seed={c.seed}, served_model_name={c.served_model_name}, "
            f"enable_prefix_caching={c.enable_prefix_caching}, enable_chunked_prefill=True, "
            f"pooler_config=None, compilation_config={{'level': 3, 'mode': 3}}"
        )

    def startup(self, non_default: dict[str, object]) -> None:
        c = self.cfg
        self.api(
            "INFO", "utils.py:299", f"vLLM server version {c.vllm_version}, serving model {c.model}"
        )
        self.api("INFO", "utils.py:233", f"non-default args: {non_default}")
        if c.dev_mode:
            self.api(
                "WARNING",
                "api_server.py:1143",
                "SECURITY WARNING: Development endpoints are enabled! "
                "This should NOT be used in production!",
            )
        self.engine(
            "INFO",
            "core.py:140",
            f"Initializing a V1 LLM engine (v{c.vllm_version}) with config: {self.config_text()}",
        )
        tokens = c.num_gpu_blocks * c.block_size
        self.engine(
            "INFO",
            "kv_cache_utils.py:1305",
            f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
            f"{c.max_model_len:,} tokens per request: {tokens / c.max_model_len:.2f}x",
        )
        if tokens < c.max_model_len:
            # Real vLLM refuses to start here; the emulator allows it (small caches
            # make preemption easy to provoke) but a request larger than the whole
            # cache will wait forever.
            self.engine(
                "WARNING",
                "kv_cache_utils.py:1318",
                f"KV cache ({tokens:,} tokens) is smaller than max_model_len "
                f"({c.max_model_len:,}); a request that needs more blocks than exist "
                "will never be scheduled (emulator only: vLLM would not start).",
            )

    def ready(self, host: str, port: int, routes: Sequence[tuple[str, str]]) -> None:
        self.api("INFO", "api_server.py:1873", f"Starting vLLM server on http://{host}:{port}")
        self.api("INFO", "launcher.py:37", "Available routes are:")
        for path, methods in routes:
            self.api("INFO", "launcher.py:45", f"Route: {path}, Methods: {methods}")
        self.uvicorn(f"Started server process [{self.pid}]")
        self.uvicorn("Waiting for application startup.")
        self.uvicorn("Application startup complete.")

    def shutdown(self) -> None:
        self.uvicorn("Shutting down")

    def shutdown_complete(self) -> None:
        self.uvicorn("Waiting for application shutdown.")
        self.uvicorn("Application shutdown complete.")
        self.uvicorn(f"Finished server process [{self.pid}]")

    # -- running ----------------------------------------------------------------

    def stats(
        self,
        prompt_tps: float,
        gen_tps: float,
        running: int,
        waiting: int,
        preemptions: int,
        kv: float,
        hit_rate: float,
    ) -> None:
        pre = f", Preemptions: {preemptions}" if preemptions else ""
        self.api(
            "INFO",
            "loggers.py:259",
            f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, Avg generation "
            f"throughput: {gen_tps:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} "
            f"reqs{pre}, GPU KV cache usage: {kv * 100:.1f}%, Prefix cache hit rate: "
            f"{hit_rate * 100:.1f}%",
        )

    def hang_warning(self, seconds: float) -> None:
        self.engine("WARNING", "shm_broadcast.py:466", SHM_WARNING.format(s=seconds))

    def request_failed(self, req_id: str) -> None:
        self.api(
            "ERROR",
            "serving.py:521",
            f"Request {req_id} failed with an internal error during generation",
        )

    def stream_error(self, chat: bool) -> None:
        what = "chat completion" if chat else "completion"
        tb = ["Traceback (most recent call last):"]
        tb += _frame(
            f"vllm/entrypoints/openai/{'chat_completion' if chat else 'completion'}/serving.py",
            688 if chat else 402,
            f"{'chat_' if chat else ''}completion_stream_generator",
            "async for res in result_generator:",
        )
        tb += _frame(
            "vllm/v1/engine/async_llm.py", 616, "generate", "out = q.get_nowait() or await q.get()"
        )
        tb += _frame("vllm/v1/engine/output_processor.py", 78, "get", "raise output")
        tb.append(f"vllm.v1.engine.exceptions.EngineDeadError: {DEAD_MESSAGE}")
        where = "serving.py:952" if chat else "serving.py:576"
        self.api("ERROR", where, f"Error in {what} stream generator.\n" + "\n".join(tb))

    # -- crashes ----------------------------------------------------------------

    def _fault_site(self, gpu: str, wname: str, wpid: int) -> list[str]:
        """Where the fault happened, when the launch waits for each kernel
        (``AMD_SERIALIZE_KERNEL=3``, ``CUDA_LAUNCH_BLOCKING=1``): the HIP
        runtime's dispatch line naming :data:`FAULT_KERNEL`, written now, and
        the traceback frame of its launch (empty when kernels run async)."""
        platform = "cuda" if gpu == "cuda" else "rocm"
        if platform not in self.cfg.kernel_sync.split(","):
            return []
        kernel, path, line = FAULT_KERNEL
        if platform == "rocm":
            self.raw(
                wname,
                wpid,
                ":3:rocvirtual.cpp           :3135: 7283490196 us: [pid:"
                f"{wpid} tid:0x7f3f4affd700] ShaderName : {kernel}",
            )
        return _frame(path, line, "mla_decode_fwd", f"{kernel}[grid](q, kv_buffer, o, kv_indptr)")

    def crash(self, gpu: str, dump: BatchDump, *, timeout: bool = False) -> None:
        """The whole engine-death sequence, worker to API server."""
        rank = self.cfg.tensor_parallel_size - 1 if self.cfg.tensor_parallel_size > 1 else 0
        wname, wpid = f"Worker_TP{rank}", self.worker_pid(rank)
        if timeout:
            root = "TimeoutError: RPC call to execute_model timed out."
        elif gpu == "hsa":
            node = 2 + rank
            site = self._fault_site(gpu, wname, wpid)
            self.raw(
                wname,
                wpid,
                f"Memory access fault by GPU node-{node} (Agent handle: 0x55d0c8a1e2f0) on "
                "address 0x7f2a3c000000. Reason: Unknown.",
            )
            if site:  # the abort finds the launching thread waiting on its kernel
                abort = ["Fatal Python error: Aborted", ""]
                abort += ["Thread 0x00007f3f4affd700 (most recent call first):"]
                abort += [f.replace(", in ", " in ") for f in site[::2]]
                for text in abort:
                    self.raw(wname, wpid, text)
            self.engine(
                "ERROR",
                "multiproc_executor.py:380",
                f"Worker proc VllmWorker-{rank} died unexpectedly (exit code: -6), "
                "shutting down executor.",
            )
            root = "RuntimeError: Executor failed."
        else:
            err = HIP_ERROR if gpu == "hip" else CUDA_ERROR
            site = self._fault_site(gpu, wname, wpid)
            tb = ["WorkerProc hit an exception.", "Traceback (most recent call last):"]
            tb += _frame(
                "vllm/v1/executor/multiproc_executor.py",
                1184,
                "worker_busy_loop",
                "output = func(*args, **kwargs)",
            )
            tb += _frame(
                "vllm/v1/worker/gpu_worker.py",
                712,
                "execute_model",
                "output = self.model_runner.execute_model(scheduler_output)",
            )
            if gpu == "hip":
                tb += _frame(
                    "vllm/v1/attention/backends/mla/rocm_aiter_mla.py",
                    412,
                    "forward_mqa",
                    "mla_gluon(q, kv_buffer, o, qo_indptr, kv_indptr)",
                )
                tb += _frame(
                    "aiter/ops/triton/gluon/mla_gluon.py",
                    233,
                    "mla_gluon",
                    "kernel[grid](*args, **meta)",
                )
                tb += site
                tb.append(f"RuntimeError: {err}")
            else:
                tb += _frame(
                    "vllm/v1/worker/gpu_model_runner.py",
                    3012,
                    "_prepare_inputs",
                    "self.input_batch.block_table.commit_block_table(num_reqs)",
                )
                tb += site
                tb.append(f"torch.AcceleratorError: {err}")
                tb += CUDA_HINTS
            self.line(wname, "ERROR", "multiproc_executor.py:1189", "\n".join(tb), wpid)
            root = (
                f"RuntimeError: Worker failed with error '{err}', please check the stack "
                "trace above for the root cause"
            )
        self._dump(dump)
        tb = ["EngineCore encountered a fatal error.", "Traceback (most recent call last):"]
        tb += _frame(
            "vllm/v1/engine/core.py", 1577, "run_engine_core", "engine_core.run_busy_loop()"
        )
        tb += _frame("vllm/v1/engine/core.py", 1612, "run_busy_loop", "self._process_engine_step()")
        tb += _frame(
            "vllm/v1/engine/core.py",
            1645,
            "_process_engine_step",
            "outputs, model_executed = self.step_fn()",
        )
        tb += _frame("vllm/v1/engine/core.py", 452, "step", "model_output = future.result()")
        if timeout:
            tb += _frame(
                "vllm/v1/executor/multiproc_executor.py",
                301,
                "get_response",
                'raise TimeoutError(f"RPC call to {method} timed out.")',
            )
        else:
            tb += _frame(
                "vllm/v1/executor/multiproc_executor.py",
                1779,
                "collective_rpc",
                "raise RuntimeError(...)",
            )
        tb.append(root)
        self.engine("ERROR", "core.py:1586", "\n".join(tb))
        self._output_handler_failed()

    def engine_killed(self) -> None:
        """``kill -9`` of EngineCore (vLLM 0.32's lines): the API server notices."""
        self.api(
            "WARNING",
            "core_client.py:817",
            "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
        )
        self.api("INFO", "core_client.py:770", "[shutdown] MPClient: start timeout=default")
        self.api("INFO", "core_client.py:777", "[shutdown] MPClient: complete")
        self._output_handler_failed()

    def _output_handler_failed(self) -> None:
        tb = ["AsyncLLM output_handler failed.", "Traceback (most recent call last):"]
        tb += _frame(
            "vllm/v1/engine/async_llm.py",
            880,
            "output_handler",
            "outputs = await engine_core.get_output_async()",
        )
        tb += _frame(
            "vllm/v1/engine/core_client.py",
            1278,
            "get_output_async",
            "raise self._format_exception(outputs) from None",
        )
        tb.append(f"vllm.v1.engine.exceptions.EngineDeadError: {DEAD_MESSAGE}")
        self.api("ERROR", "async_llm.py:943", "\n".join(tb))

    def _dump(self, d: BatchDump) -> None:
        c = self.cfg
        self.engine(
            "ERROR",
            "dump_input.py:69",
            f"Dumping input data for V1 LLM engine (v{c.vllm_version}) with config: "
            f"{self.config_text()}, ",
        )
        new = [r for r in d.reqs if r.new]
        old = [r for r in d.reqs if not r.new]
        new_txt = ", ".join(
            f"NewRequestData(req_id={r.req_id},prompt_token_ids_len={r.prompt_len},"
            f"mm_features=[],sampling_params=SamplingParams(n=1, temperature=1.0, "
            f"max_tokens={r.max_tokens}),block_ids=(...),num_computed_tokens={r.num_computed},"
            f"lora_request=None,prompt_embeds_shape=None)"
            for r in new
        )
        cached = (
            f"CachedRequestData(req_ids={[r.req_id for r in old]}, "
            f"resumed_from_preemption={[r.resumed for r in old]}, new_token_ids=[], "
            f"all_token_ids={{}}, new_block_ids={[None for _ in old]}, "
            f"num_computed_tokens={[r.num_computed for r in old]}, "
            f"num_output_tokens={[r.num_output for r in old]})"
        )
        sched = {r.req_id: r.num_scheduled for r in d.reqs}
        total = sum(sched.values())
        self.engine(
            "ERROR",
            "dump_input.py:76",
            f"Dumping scheduler output for model execution: SchedulerOutput("
            f"scheduled_new_reqs=[{new_txt}], scheduled_cached_reqs={cached}, "
            f"num_scheduled_tokens={sched}, total_num_scheduled_tokens={total}, "
            f"scheduled_spec_decode_tokens={{}}, scheduled_encoder_inputs={{}}, "
            f"num_common_prefix_blocks=[0], finished_req_ids=set(), "
            f"free_encoder_mm_hashes=[], kv_connector_metadata=None)",
        )
        self.engine(
            "ERROR",
            "dump_input.py:78",
            f"Dumping scheduler stats: SchedulerStats(num_running_reqs={d.running}, "
            f"num_waiting_reqs={d.waiting}, step_counter=0, current_wave=0, "
            f"kv_cache_usage={d.kv_usage}, prefix_cache_stats=PrefixCacheStats(reset=False, "
            f"requests={d.requests}, queries={d.queries}, hits={d.hits}), "
            f"spec_decoding_stats=None, kv_connector_stats=None, num_corrupted_reqs=0)",
        )
