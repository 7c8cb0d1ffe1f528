"""vLLM server logs of real crashes, assembled from vLLM 0.33.0 source
strings and public crash reports (VLLM.md §2.4, §7): a ROCm HSA hard fault
(worker dies, no traceback), the Kimi-K3 HIP Triton error and HSA exception
(#50347), a CUDA illegal memory access with an Xid (#37917), an NCCL
watchdog device-side assert (InferenceX), a start-up failure, an engine
assertion (LMCache #2327), a segfault and a hang; and the pieces they are
built from (prefixed lines, traceback frames, a scheduler dump)."""

from __future__ import annotations

SITE = "/usr/local/lib/python3.12/dist-packages"
CFG = "model='moonshotai/Kimi-K3', tensor_parallel_size=8, kv_cache_dtype=fp8"


def prefixed(proc: str, pid: int, where: str, body: str, level: str = "ERROR") -> str:
    return "".join(
        f"({proc} pid={pid}) {level} 11-30 02:51:07 [{where}] {line}\n" for line in body.split("\n")
    )


def frames(*fs: tuple[str, int, str, str]) -> str:
    return "\n".join(f'  File "{SITE}/{p}", line {n}, in {f}\n    {code}' for p, n, f, code in fs)


ENGINE_TB = frames(
    ("vllm/v1/engine/core.py", 1577, "run_engine_core", "engine_core.run_busy_loop()"),
    ("vllm/v1/engine/core.py", 1612, "run_busy_loop", "self._process_engine_step()"),
    ("vllm/v1/engine/core.py", 452, "step", "model_output = future.result()"),
    (
        "/usr/lib/python3.12/concurrent/futures/_base.py",
        449,
        "result",
        "return self.__get_result()",
    ),
    ("vllm/v1/executor/multiproc_executor.py", 1779, "collective_rpc", "raise RuntimeError(...)"),
).replace(f"{SITE}//usr", "/usr")

DEAD_TAIL = prefixed(
    "APIServer",
    1,
    "async_llm.py:943",
    "AsyncLLM output_handler failed.\nTraceback (most recent call last):\n"
    + frames(
        ("vllm/v1/engine/async_llm.py", 880, "output_handler", "outputs = await x()"),
        ("vllm/v1/engine/core_client.py", 1278, "get_output_async", "raise self._format(o)"),
    )
    + "\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause.",
) + (
    '(APIServer pid=1) INFO:     127.0.0.1:50712 - "POST /v1/chat/completions HTTP/1.1" 500 '
    "Internal Server Error\n(APIServer pid=1) INFO:     Shutting down\n"
    "(APIServer pid=1) INFO:     Finished server process [1]\n"
)


def dump(new: list[tuple[str, int]], cached: list[tuple[str, int]]) -> str:
    new_txt = ", ".join(
        f"NewRequestData(req_id={rid},prompt_token_ids_len={n + 64},mm_features=[],"
        f"sampling_params=SamplingParams(n=1, temperature=0.6, max_tokens=4096),"
        f"block_ids=([1, 2, 3],),num_computed_tokens={n},lora_request=None)"
        for rid, n in new
    )
    ids = [r for r, _ in cached]
    nums = [n for _, n in cached]
    sched = {r: 16 for r, _ in new + cached}
    return prefixed(
        "EngineCore",
        1203,
        "dump_input.py:76",
        f"Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs="
        f"[{new_txt}], scheduled_cached_reqs=CachedRequestData(req_ids={ids}, "
        f"resumed_from_preemption={[False] * len(ids)}, new_token_ids=[], "
        f"new_block_ids={[None] * len(ids)}, num_computed_tokens={nums}), "
        f"num_scheduled_tokens={sched}, total_num_scheduled_tokens={16 * len(sched)})",
    ) + prefixed(
        "EngineCore",
        1203,
        "dump_input.py:78",
        "Dumping scheduler stats: SchedulerStats(num_running_reqs=2, num_waiting_reqs=0, "
        "kv_cache_usage=0.16, prefix_cache_stats=PrefixCacheStats(reset=False))",
    )


def engine_fatal(last: str) -> str:
    return prefixed(
        "EngineCore",
        1203,
        "core.py:1586",
        "EngineCore encountered a fatal error.\nTraceback (most recent call last):\n"
        + ENGINE_TB
        + "\n"
        + last,
    )


BATCH = dump([("chatcmpl-turn-12-1a2b3c4d", 0)], [("chatcmpl-turn-11-0badf00d", 337128)])

# VLLM.md §2.4: the HSA hard fault kills worker 6; the engine has no worker traceback.
ROCM_FAULT = (
    "(Worker_TP6 pid=1417) Memory access fault by GPU node-8 (Agent handle: 0x55d0c8a1e2f0) "
    "on address 0x7f2a3c000000. Reason: Unknown.\n"
    + prefixed(
        "EngineCore",
        1203,
        "multiproc_executor.py:380",
        "Worker proc VllmWorker-6 died unexpectedly (exit code: -6), shutting down executor.",
    )
    + prefixed(
        "EngineCore",
        1203,
        "dump_input.py:69",
        f"Dumping input data for V1 LLM engine (v0.33.0) with config: {CFG}, ",
    )
    + BATCH
    + engine_fatal("RuntimeError: Executor failed.")
    + DEAD_TAIL
)

HIP_ERR = "Triton Error [HIP]: Code: 700, Message: an illegal memory access was encountered"


def worker_exception(rank: int, tb: str, last: str) -> str:
    return prefixed(
        f"Worker_TP{rank}",
        1411 + rank,
        "multiproc_executor.py:1189",
        "WorkerProc hit an exception.\nTraceback (most recent call last):\n" + tb + "\n" + last,
    )


WORKER_TB = frames(
    ("vllm/v1/executor/multiproc_executor.py", 1184, "worker_busy_loop", "output = func()"),
    ("torch/utils/_contextlib.py", 120, "decorate_context", "return func(*args, **kwargs)"),
    ("vllm/v1/worker/gpu_worker.py", 712, "execute_model", "return self.runner.execute(s)"),
)
MLA_TB = (
    WORKER_TB
    + "\n"
    + frames(
        ("torch/nn/modules/module.py", 1775, "_call_impl", "return forward_call(*args)"),
        ("vllm/v1/attention/backends/mla/rocm_aiter_mla.py", 412, "forward_mqa", "mla_gluon(q)"),
        ("aiter/ops/triton/gluon/mla_gluon.py", 233, "mla_gluon", "kernel[grid](*args, **meta)"),
    )
)
PREPARE_TB = (
    WORKER_TB
    + "\n"
    + frames(
        ("vllm/v1/worker/gpu_model_runner.py", 3012, "_prepare_inputs", "self.commit(num_reqs)"),
    )
)

# vllm #50347, first report: Triton HIP error in the AITER MLA decode kernel.
ROCM_HIP = (
    worker_exception(6, MLA_TB, f"RuntimeError: {HIP_ERR}")
    + BATCH
    + engine_fatal(
        f"RuntimeError: Worker failed with error '{HIP_ERR}', please check the stack trace "
        "above for the root cause"
    )
    + DEAD_TAIL
)

CUDA_HINTS = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
)

# vllm #50347 follow-up: HSA exception on the 337K-token prefill, then the worker dies.
ROCM_HSA_EXCEPTION = (
    ":0:rocdevice.cpp            :2984: 2713443574 us: [pid:1417  tid:0x7f2a3c3ff640] Callback: "
    "Queue 0x7f2a30200000 aborting with error : HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation "
    "resulted in a hardware exception. code: 0x1016\n"
    + worker_exception(
        6,
        PREPARE_TB,
        "c10::AcceleratorError: CUDA error: unspecified launch failure\n" + CUDA_HINTS,
    )
    + prefixed(
        "EngineCore",
        1203,
        "multiproc_executor.py:380",
        "Worker proc VllmWorker-6 died unexpectedly (exit code: -6), shutting down executor.",
    )
    + BATCH
    + engine_fatal("RuntimeError: Executor failed.")
    + DEAD_TAIL
)

# vllm #37917 / eugr #308: CUDA illegal memory access in _prepare_inputs, Xid 31.
CUDA_IMA = (
    worker_exception(
        1,
        PREPARE_TB,
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        + CUDA_HINTS,
    )
    + BATCH
    + engine_fatal(
        "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was "
        "encountered', please check the stack trace above for the root cause"
    )
    + DEAD_TAIL
    + "NVRM: Xid (PCI:0000:8a:00): 31, pid=1418, name=python3, Ch 00000008, intr 00000000. "
    "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_3c000000.\n"
)

# The same error raised in the MLA kernel instead: same type and GPU kind, other frames.
CUDA_IMA_MLA = (
    worker_exception(
        1,
        MLA_TB,
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        + CUDA_HINTS,
    )
    + BATCH
    + engine_fatal("RuntimeError: Executor failed.")
    + DEAD_TAIL
)

# InferenceX notes: NCCL watchdog with a device-side assert, older 500 wrapper.
NCCL_ASSERT = (
    "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [7,0,0], "
    'thread: [32,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of '
    'bounds"` failed.\n'
    "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [7,0,0], "
    'thread: [33,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of '
    'bounds"` failed.\n'
    "(Worker_TP3 pid=1414) [rank3]:[E1130 02:51:07.123456 1414 ProcessGroupNCCL.cpp:2174] "
    "[PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with "
    "exception: CUDA error: device-side assert triggered\n"
    + worker_exception(3, PREPARE_TB, "RuntimeError: CUDA error: device-side assert triggered")
    + engine_fatal("RuntimeError: Executor failed.")
    + DEAD_TAIL
)

# vllm #50682: the gfx942 start-up failure, with the API server's wrapper.
STARTUP = prefixed(
    "EngineCore_DP0",
    1203,
    "core.py:1592",
    "EngineCore failed to start.\nTraceback (most recent call last):\n"
    + frames(
        ("vllm/v1/engine/core.py", 1580, "run_engine_core", "engine_core = EngineCoreProc()"),
        ("vllm/v1/attention/backends/mla/rocm_aiter_mla.py", 88, "__init__", "check_arch()"),
    )
    + "\nValueError: mla_gluon requires gfx950 (CDNA4), got gfx942",
) + prefixed(
    "APIServer",
    1,
    "api_server.py:1900",
    "Traceback (most recent call last):\n"
    + frames(("vllm/v1/engine/utils.py", 1021, "wait_for_engine_startup", "raise RuntimeError()"))
    + "\nRuntimeError: Engine core initialization failed. See root cause above. Failed core "
    "proc(s): {'EngineCore_DP0': 1}",
)

# LMCache #2327: a bare assertion in the scheduler, engine-side.
ASSERTION = (
    BATCH
    + engine_fatal("AssertionError").replace(
        'multiproc_executor.py", line 1779, in collective_rpc',
        'core/sched/scheduler.py", line 512, in schedule',
    )
    + DEAD_TAIL
)

SEGFAULT = (
    "Fatal Python error: Segmentation fault\n\nThread 0x00007f2a3c3ff640 (most recent call "
    f'first):\n  File "{SITE}/vllm/v1/worker/block_table.py", line 141 in swap_blocks_batch\n'
    + DEAD_TAIL
)

HANG = prefixed(
    "EngineCore",
    1203,
    "shm_broadcast.py:466",
    "No available shared memory broadcast block found in 60 seconds. This typically happens "
    "when some processes are hanging or doing some time-consuming work (e.g. compilation, "
    "weight/kv cache quantization).",
    level="WARNING",
)

FIXTURES = {
    "rocm_fault": ROCM_FAULT,
    "rocm_hip": ROCM_HIP,
    "rocm_hsa_exception": ROCM_HSA_EXCEPTION,
    "cuda_ima": CUDA_IMA,
    "cuda_ima_mla": CUDA_IMA_MLA,
    "nccl_assert": NCCL_ASSERT,
    "startup": STARTUP,
    "assertion": ASSERTION,
    "segfault": SEGFAULT,
}
