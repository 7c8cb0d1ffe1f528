"""Crash signatures from vLLM server logs.

Fixture logs (tests/helpers/vllm_logs.py) are assembled from vLLM 0.33.0
source strings and public crash reports (VLLM.md §2.4, §7): a ROCm HSA hard fault (worker dies, no
traceback), the Kimi-K3 HIP Triton error and HSA exception (#50347), a CUDA
illegal memory access with an Xid (#37917), an NCCL watchdog device-side
assert (InferenceX), a start-up failure, an engine assertion (LMCache
#2327), a segfault and a hang. Noise (timestamps, pids, addresses, ranks,
request ids, install paths, line numbers, interleaved lines from other
processes, an earlier launch, API-side tracebacks) must not change a
signature; a different fault must. The emulator's own crash logs are checked
the same way, end to end.
"""

from __future__ import annotations

import contextlib
import random
import re
import threading

import httpx
import pytest

from replayer.errors import UsageError
from replayer.monitor.logs import (
    DumpedRequest,
    Frame,
    iter_lines,
    last_launch,
    launch_marker,
    parse_line,
    parse_scheduler_dump,
    tracebacks,
)
from replayer.monitor.signature import (
    Signature,
    client_request_id,
    compile_signature_regex,
    exit_text,
    frame_key,
    matches,
    matches_regex,
    normalize,
    short_type,
    signature_from_log,
    top_frames,
)
from tests.helpers.vllm_logs import (
    ASSERTION,
    CUDA_IMA,
    FIXTURES,
    HANG,
    HIP_ERR,
    NCCL_ASSERT,
    ROCM_FAULT,
    ROCM_HIP,
    ROCM_HSA_EXCEPTION,
    SEGFAULT,
    SITE,
    STARTUP,
    WORKER_TB,
    dump,
    engine_fatal,
    frames,
    prefixed,
    worker_exception,
)

# -- noise -------------------------------------------------------------------------------

API_NOISE = prefixed(
    "APIServer",
    1,
    "serving.py:236",
    "Error in preprocessing prompt inputs\nTraceback (most recent call last):\n"
    + frames(("vllm/entrypoints/openai/serving_engine.py", 901, "_validate", "raise ValueError"))
    + "\nValueError: This model's maximum context length is 262144 tokens. However, your "
    "request has 262201 input tokens. Please reduce the length of the input messages.",
)
OLD_LAUNCH = launch_marker(1, "vllm serve moonshotai/Kimi-K3", 0.0) + CUDA_IMA


def noisy(log: str, seed: int, ids: dict[str, str] | None = None) -> str:
    """The same crash as another run would log it."""
    rnd = random.Random(seed)
    pids: dict[str, str] = {}
    s = re.sub(
        r"pid=(\d+)", lambda m: "pid=" + pids.setdefault(m[1], str(rnd.randrange(2, 99999))), log
    )
    s = re.sub(
        r"\d\d-\d\d \d\d:\d\d:\d\d",
        lambda m: (
            f"{rnd.randrange(1, 13):02d}-{rnd.randrange(1, 29):02d} "
            f"{rnd.randrange(24):02d}:{rnd.randrange(60):02d}:{rnd.randrange(60):02d}"
        ),
        s,
    )
    s = re.sub(
        r"0x[0-9a-f]{6,}", lambda m: "0x" + "".join(rnd.choices("0123456789abcdef", k=12)), s
    )
    rank = rnd.randrange(8)
    s = re.sub(r"(Worker_TP|VllmWorker-|rank|Rank )\d", lambda m: f"{m[1]}{rank}", s)
    s = re.sub(r"node-\d+", f"node-{rnd.randrange(2, 10)}", s)
    s = re.sub(r"line \d+,", lambda m: f"line {rnd.randrange(1, 4000)},", s)
    s = s.replace(SITE, rnd.choice([SITE, "/opt/venv/lib/python3.11/site-packages"]))
    s = re.sub(r"-[0-9a-f]{8}\b", lambda m: "-" + "".join(rnd.choices("0123456789abcdef", k=8)), s)
    for old, new in (ids or {}).items():
        s = s.replace(f"-{old}-", f"-{new}-")
    lines = s.splitlines(keepends=True)
    for _ in range(rnd.randrange(3, 12)):  # other processes' lines, anywhere
        noise = rnd.choice(
            [
                f"(Worker_TP0 pid={rnd.randrange(99999)}) INFO 11-30 02:51:0{rnd.randrange(10)} "
                f"[custom_all_reduce.py:203] Registering {rnd.randrange(9999)} graph addresses\n",
                f"(EngineCore_DP1 pid={rnd.randrange(99999)}) INFO 11-30 02:5{rnd.randrange(10)}:00"
                f" [loggers.py:259] Engine 001: Avg prompt throughput: {rnd.random():.1f} tok/s\n",
            ]
        )
        lines.insert(rnd.randrange(len(lines) + 1), noise)
    head = OLD_LAUNCH + launch_marker(2, "vllm serve moonshotai/Kimi-K3") if seed % 3 else ""
    if seed % 2:
        head += API_NOISE  # an earlier client error, logged with a traceback
    return head + "".join(lines)


def sig(log: str, cls: str = "engine_dead", **kw) -> Signature:
    return signature_from_log(log, failure_class=cls, **kw)


# -- fixtures: exact readings ---------------------------------------------------------------


@pytest.mark.inprocess
def test_rocm_hard_fault():
    s = sig(ROCM_FAULT, "process_exit", exit_code=0)
    assert (s.exception, s.message) == ("RuntimeError", "Executor failed.")
    assert s.frames == (
        "multiproc_executor.py:collective_rpc",
        "core.py:step",
        "core.py:run_busy_loop",
    )
    assert s.gpu_errors == (
        "Memory access fault by GPU node-<N> on address <ADDR>. Reason: Unknown",
    )
    assert s.events == ("worker died unexpectedly (exit code: -6)",)
    assert s.exit == "code 0"
    assert s.suspects == ("turn-12", "turn-11")
    assert s.computed_tokens == {"turn-12": 0, "turn-11": 337128}
    assert s.text == (
        "process_exit: RuntimeError: Executor failed.; at multiproc_executor.py:collective_rpc"
        " < core.py:step < core.py:run_busy_loop; gpu: Memory access fault by GPU node-<N> on "
        "address <ADDR>. Reason: Unknown; events: worker died unexpectedly (exit code: -6); "
        "exit: code 0"
    )
    assert re.fullmatch(r"[0-9a-f]{12}", s.hash) and re.fullmatch(r"[0-9a-f]{12}", s.coarse_hash)


@pytest.mark.inprocess
def test_rocm_hip_triton_error_is_the_worker_traceback():
    s = sig(ROCM_HIP)
    assert s.exception == "RuntimeError"
    assert s.message == (
        "Triton Error [HIP]: Code: <N>, Message: an illegal memory access was encountered"
    )
    assert s.frames == (
        "mla_gluon.py:mla_gluon",
        "rocm_aiter_mla.py:forward_mqa",
        "gpu_worker.py:execute_model",
    )
    assert s.gpu_errors == (HIP_ERR,)
    assert s.events == ()


@pytest.mark.inprocess
def test_rocm_hsa_exception():
    s = sig(ROCM_HSA_EXCEPTION, "process_exit", signal=6)
    assert (s.exception, s.message) == (
        "AcceleratorError",
        "CUDA error: unspecified launch failure",
    )
    assert s.frames == (
        "gpu_model_runner.py:_prepare_inputs",
        "gpu_worker.py:execute_model",
        "multiproc_executor.py:worker_busy_loop",
    )
    assert s.gpu_errors == (
        "HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception. "
        "code: 0x1016",
        "CUDA error: unspecified launch failure",
    )
    assert s.events == ("worker died unexpectedly (exit code: -6)",)
    assert s.exit == "signal SIGABRT"


@pytest.mark.inprocess
def test_cuda_illegal_memory_access():
    s = sig(CUDA_IMA)
    assert (s.exception, s.message) == (
        "AcceleratorError",
        "CUDA error: an illegal memory access was encountered",
    )
    assert s.frames[0] == "gpu_model_runner.py:_prepare_inputs"
    assert s.gpu_errors == ("CUDA error: an illegal memory access was encountered", "NVRM Xid 31")


@pytest.mark.inprocess
def test_nccl_watchdog_device_side_assert():
    s = sig(NCCL_ASSERT)
    assert (s.exception, s.message) == ("RuntimeError", "CUDA error: device-side assert triggered")
    assert s.gpu_errors == (
        'device assertion IndexKernel.cu: `-sizes[i] <= index && index < sizes[i] && "index out'
        ' of bounds"` failed',
        "NCCL watchdog terminated: CUDA error: device-side assert triggered",
        "CUDA error: device-side assert triggered",
    )


@pytest.mark.inprocess
def test_startup_failure_names_the_engine_cause_not_the_api_wrapper():
    s = sig(STARTUP, "process_exit", exit_code=1)
    assert (s.exception, s.message) == (
        "ValueError",
        "mla_gluon requires gfx950 (CDNA4), got gfx942",
    )
    assert s.frames == ("rocm_aiter_mla.py:__init__", "core.py:run_engine_core")
    assert s.events == ("engine start-up failed",)
    assert s.suspects == ()


@pytest.mark.inprocess
def test_bare_assertion_and_segfault_and_hang():
    a = sig(ASSERTION)
    assert (a.exception, a.message, a.frames[0]) == ("AssertionError", "", "scheduler.py:schedule")
    seg = sig(SEGFAULT, "process_exit", signal=11)
    assert seg.exception == "EngineDeadError"  # the only traceback left is the wrapper
    assert seg.events == ("Fatal Python error: Segmentation fault",)
    h = sig(HANG, "hang")
    assert (h.exception, h.gpu_errors, h.suspects) == (None, (), ())
    assert h.events == ("no shared memory broadcast block (engine stalled)",)
    assert h.hash == sig("", "hang").hash  # whether the 60 s warning showed up is timing
    assert h.text == "hang: no traceback; events: no shared memory broadcast block (engine stalled)"


@pytest.mark.inprocess
def test_exit_is_part_of_the_hash():
    zero = sig(ROCM_FAULT, "process_exit", exit_code=0)
    abort = sig(ROCM_FAULT, "process_exit", exit_code=-6)
    unknown = sig(ROCM_FAULT, "process_exit")
    # the same log ending two ways: two crashes, one log hash
    assert (zero.exit, abort.exit, unknown.exit) == ("code 0", "signal SIGABRT", None)
    assert zero.hash != abort.hash and zero.log_hash == abort.log_hash == unknown.log_hash
    assert not matches(zero, abort) and not matches(abort, zero)
    # an unknown exit (not exited yet) is no evidence of another crash
    assert unknown.hash == unknown.log_hash and not unknown.exit_hashed
    assert matches(zero, unknown) and matches(unknown, abort)
    assert zero.exit_hashed and abort.exit_hashed
    # the coarse hash stays without the exit
    assert zero.coarse_hash == abort.coarse_hash == unknown.coarse_hash
    # a negative code is the signal it reports
    assert abort.hash == sig(ROCM_FAULT, "process_exit", signal=6).hash
    # the exit as sole evidence is in the log hash too
    killed = sig("", "stream_cut", signal=9)
    assert (
        killed.exit == "signal SIGKILL"
        and killed.text == "stream_cut: no traceback; exit: signal SIGKILL"
    )
    assert killed.log_hash != sig("", "stream_cut", signal=11).log_hash
    assert killed.hash == sig("", "stream_cut", exit_code=-9).hash


@pytest.mark.inprocess
def test_log_hash_is_the_version_1_hash():
    # golden values: the log hash is byte for byte the hash replayer wrote
    # before the exit counted (checked against a version-1 signature.json)
    cases = [
        (sig(ROCM_FAULT, "process_exit", exit_code=0), "7b8020dcee87", "94e17689908f"),
        (sig(ROCM_FAULT, "process_exit", exit_code=-6), "7c398f475200", "94e17689908f"),
        (sig(ROCM_FAULT, "process_exit"), "94e17689908f", "94e17689908f"),
        (sig("", "stream_cut", signal=9), "66fd258d425a", "e0d0e35e0c03"),
    ]
    for s, full, log in cases:
        assert (s.hash, s.log_hash) == (full, log), s.text
    assert cases[0][0].coarse_hash == "4edbdedcfc4e"


@pytest.mark.inprocess
def test_version_1_signature_matches_on_its_log():
    s = sig(ROCM_FAULT, "process_exit", exit_code=0)
    d = s.to_dict()
    assert (d["version"], d["hash"], d["log_hash"]) == (2, s.hash, s.log_hash)
    # what an older replayer wrote: version 1, no log hash, its hash the log hash
    v1 = {k: v for k, v in d.items() if k != "log_hash"} | {"version": 1, "hash": s.log_hash}
    old = Signature.from_dict(v1)
    assert old.hash == old.log_hash == s.log_hash and old.exit == "code 0"
    assert not old.exit_hashed  # its hash never covered the exit
    abort = sig(ROCM_FAULT, "process_exit", exit_code=-6)
    assert matches(old, s) and matches(s, old) and matches(old, abort)
    assert not matches(old, sig(ROCM_FAULT, "engine_dead", exit_code=0))
    assert not matches(old, sig(ROCM_HIP, "process_exit", exit_code=0))
    # a stray log_hash in a version-1 dict is not trusted
    assert Signature.from_dict({**v1, "log_hash": "0" * 12}).log_hash == s.log_hash
    # version 2 round trips with both hashes
    assert Signature.from_dict(d) == s and Signature.from_dict(d).exit_hashed


# -- stability and distinctness ---------------------------------------------------------------


@pytest.mark.inprocess
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_same_fault_same_signature_under_noise(name):
    log = FIXTURES[name]
    exits = [0, -6, None]
    bases = [sig(log, exit_code=code) for code in exits]
    for seed in range(12):
        code = exits[seed % 3]
        base = bases[seed % 3]
        other = sig(
            noisy(log, seed, {"turn-12": f"s{seed}-t12", "turn-11": f"s{seed}-t11"}),
            exit_code=code,
        )
        assert other.hash == base.hash, (seed, other.text, base.text)
        assert other.log_hash == bases[0].log_hash  # the log's part ignores the exit
        assert matches(other, base)
        # a known exit is another crash than another known one, never than an unknown one
        assert matches(other, bases[2])
        nxt = (seed + 1) % 3
        assert matches(other, bases[nxt]) == (None in (code, exits[nxt]))
        assert (other.exception, other.message, other.frames) == (
            base.exception,
            base.message,
            base.frames,
        )
        assert other.gpu_errors == base.gpu_errors
        if base.suspects:
            assert other.suspects == (f"s{seed}-t12", f"s{seed}-t11")


@pytest.mark.inprocess
def test_different_faults_different_signatures():
    sigs = {name: sig(log) for name, log in FIXTURES.items()}
    assert len({s.hash for s in sigs.values()}) == len(sigs)
    # same exception type and GPU error, other frames: distinct, but the same coarse kind
    a, b = sigs["cuda_ima"], sigs["cuda_ima_mla"]
    assert a.hash != b.hash
    assert a.coarse_hash != b.coarse_hash  # the Xid line is only in one of them
    no_xid = sig(CUDA_IMA.split("NVRM:")[0])
    assert no_xid.coarse_hash == b.coarse_hash and no_xid.hash != b.hash
    # same log, another failure class: another signature
    assert sig(ROCM_FAULT, "process_exit").hash != sig(ROCM_FAULT, "engine_dead").hash
    assert not matches(sig(ROCM_FAULT, "process_exit"), sig(ROCM_FAULT, "engine_dead"))


@pytest.mark.inprocess
def test_only_the_last_launch_counts():
    both = (
        launch_marker(1, "vllm serve m", 0.0)
        + CUDA_IMA
        + launch_marker(2, "vllm serve m")
        + ROCM_HIP
    )
    assert sig(both).hash == sig(ROCM_HIP).hash
    assert sig(both).gpu_errors == (HIP_ERR,)
    assert last_launch(both) == ROCM_HIP
    assert last_launch(ROCM_HIP) == ROCM_HIP


@pytest.mark.inprocess
def test_api_only_tracebacks():
    # a 400 logged earlier is not why the engine died: the wrapper is the better name
    assert sig(API_NOISE + SEGFAULT, "process_exit").exception == "EngineDeadError"
    # for a per-request failure the latest API-side cause is the one
    late = prefixed(
        "APIServer",
        1,
        "serving.py:300",
        "Error in chat completion stream generator.\nTraceback (most recent call last):\n"
        + frames(("vllm/entrypoints/chat_utils.py", 1, "render", "t.render()"))
        + "\njinja2.exceptions.TemplateError: tool_calls must be a list",
    )
    s = sig(API_NOISE + late, "http_5xx_other")
    assert (s.exception, s.message, s.frames) == (
        "TemplateError",
        "tool_calls must be a list",
        ("chat_utils.py:render",),
    )
    assert sig(API_NOISE, "client_error").exception == "ValueError"
    assert sig("", "client_error").exception is None


@pytest.mark.inprocess
def test_prompts_quoted_in_the_log_are_not_gpu_errors():
    log = prefixed(
        "APIServer",
        1,
        "logger.py:39",
        "Received request chatcmpl-x-1a2b3c4d: prompt: 'why does CUDA error: an illegal memory "
        "access was encountered happen?', params: SamplingParams(n=1)",
        level="INFO",
    )
    assert sig(log + HANG, "hang").gpu_errors == ()


# -- normalization -----------------------------------------------------------------------------


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("Executor failed.", "Executor failed."),
        ("pid=1417 tid=0x7f2a3c3ff640", "pid=<N> tid=<ADDR>"),
        (
            "Worker proc VllmWorker-6 died (exit code: -6)",
            "Worker proc VllmWorker-<N> died (exit code: -<N>)",
        ),
        (
            "rank3 on Worker_TP6_EP6 and EngineCore_DP1, cuda:3, GPU0",
            "rank<N> on Worker_TP<N>_EP<N> and EngineCore_DP<N>, cuda:<N>, GPU<N>",
        ),
        (
            "Tried to allocate 2.50 GiB (GPU 0; 191.98 GiB total)",
            "Tried to allocate <N> GiB (GPU <N>; <N> GiB total)",
        ),
        ("shape [4, 128] vs torch.Size([1, 4096])", "shape [<N>, <N>] vs torch.Size([<N>, <N>])"),
        (
            "at 2026-07-30T02:51:07.123Z and 11-30 02:51:07 and 02:51:07,5",
            "at <TS> and <TS> and <TS>",
        ),
        ("request chatcmpl-trace-r1-56262435 and cmpl-9f8e7d6c5b4a3f2e", "request <REQ> and <REQ>"),
        ("id 3f2504e0-4f89-41d3-9a0c-0305e82c3301 hash 9c1f6a2b3d4e5f60", "id <UUID> hash <HEX>"),
        ("open /models/Kimi-K3/model-00001-of-00064.safetensors failed", "open <PATH> failed"),
        ("see https://docs.nvidia.com/cuda/x.html#y", "see <URL>"),
        (
            "fp8 e4m3 on gfx950 with float16 and mla_a16w16",
            "fp8 e4m3 on gfx950 with float16 and mla_a16w16",
        ),
        (
            "kv_cache_usage=6.103515625e-05  and  1,234,567 tokens",
            "kv_cache_usage=<N> and <N>,<N>,<N> tokens",
        ),
        ("\x1b[1;31mERROR\x1b[0m boom", "ERROR boom"),
    ],
)
def test_normalize(raw, normalized):
    assert normalize(raw) == normalized


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("line", "canonical"),
    [
        (
            "(Worker_TP3 pid=9) Memory access fault by GPU node-5 (Agent handle: 0x5a) on address "
            "0x7f00deadbeef. Reason: Write access to a read-only page.",
            "Memory access fault by GPU node-<N> on address <ADDR>. Reason: Write access to a "
            "read-only page",
        ),
        ("Memory access fault by GPU node-2 on address 0x7f0000000000.", None),
        (
            ":0:rocdevice.cpp :3020: 27134 us: [pid:1417 tid:0x7f2a3c3ff640] Callback: Queue "
            "0x7f2a30200000 aborting with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The "
            "agent attempted to access memory beyond the largest legal address. code: 0x29",
            "HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory "
            "beyond the largest legal address. code: 0x29",
        ),
        (
            "RuntimeError: Triton Error [HIP]: Code: 719, Message: unspecified launch failure",
            "Triton Error [HIP]: Code: 719, Message: unspecified launch failure",
        ),
        (
            "torch.AcceleratorError: HIP error: an illegal memory access was encountered",
            "HIP error: an illegal memory access was encountered",
        ),
        (
            "[rank3]:[E1130 02:51:07.1 1414 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=8192, "
            "NumelOut=8192, Timeout(ms)=600000) ran for 600123 milliseconds before timing out.",
            "NCCL watchdog: collective operation timeout (ALLREDUCE)",
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            "NCCLUtils.hpp:317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
            "NCCL version 2.21.5",
            "NCCL error: unhandled cuda error",
        ),
        (
            "NVRM: Xid (PCI:0000:1b:00): 13, pid=2345, name=python3, Graphics SM Warp Exception "
            "on (GPC 0, TPC 1, SM 0): Out Of Range Address",
            "NVRM Xid 13",
        ),
        ("kernel launch: unspecified launch failure", "unspecified launch failure"),
        ("an illegal memory access was encountered at step 12", "illegal memory access"),
        ("RuntimeError: device-side assert triggered", "device-side assert triggered"),
        ("INFO: 127.0.0.1 - GET /health 200", None),
    ],
)
def test_gpu_error_strings(line, canonical):
    got = sig(line + "\n").gpu_errors
    if canonical is None and "Memory access fault" in line:
        assert got == ("Memory access fault by GPU node-<N> on address <ADDR>",)
    else:
        assert got == (() if canonical is None else (canonical,))


@pytest.mark.inprocess
def test_normalize_known_request_ids_and_length():
    assert (
        normalize("KeyError: 'sess-2/turn-9'", request_ids={"sess-2/turn-9"}) == "KeyError: '<REQ>'"
    )
    assert len(normalize("x " * 1000)) == 240


@pytest.mark.inprocess
def test_frames_types_and_exit_text():
    fs = [
        Frame("/usr/lib/python3.12/asyncio/events.py", 88, "_run"),
        Frame(f"{SITE}/vllm/v1/worker/gpu_worker.py", 712, "execute_model"),
        Frame("/usr/lib/python3.12/concurrent/futures/thread.py", 59, "run"),
    ]
    assert frame_key(fs[1]) == "gpu_worker.py:execute_model"
    assert top_frames(fs) == ("gpu_worker.py:execute_model",)
    assert top_frames([fs[0], fs[2]]) == ("thread.py:run", "events.py:_run")  # nothing else left
    assert short_type("vllm.v1.engine.exceptions.EngineDeadError") == "EngineDeadError"
    assert short_type("c10::AcceleratorError") == "AcceleratorError"
    assert [exit_text(0, None), exit_text(-9, None), exit_text(None, 6), exit_text(None, None)] == [
        "code 0",
        "signal SIGKILL",
        "signal SIGABRT",
        None,
    ]
    assert exit_text(None, 77) == "signal 77"


# -- log structure and suspects -------------------------------------------------------------------


@pytest.mark.inprocess
def test_parse_line_variants():
    a = parse_line(0, "(EngineCore_DP0 pid=12) ERROR 11-30 02:51:07 [core.py:1586] boom")
    assert (a.proc, a.pid, a.level, a.where, a.msg) == (
        "EngineCore_DP0",
        12,
        "ERROR",
        "core.py:1586",
        "boom",
    )
    b = parse_line(
        1,
        "2026-07-30T02:51:07.1Z vllm-1  | "
        "(VllmWorker rank=3 pid=9) INFO 11-30 02:51:07.123 [x.py:1] hi",
    )
    assert (b.proc, b.pid, b.level, b.msg) == ("VllmWorker", 9, "INFO", "hi")
    c = parse_line(2, "(APIServer pid=1) INFO:     Shutting down")
    assert (c.proc, c.level, c.msg) == ("APIServer", None, "INFO:     Shutting down")
    d = parse_line(3, "Memory access fault by GPU node-2")
    assert (d.proc, d.pid, d.msg) == (None, None, "Memory access fault by GPU node-2")


@pytest.mark.inprocess
def test_tracebacks_are_rebuilt_per_process_despite_interleaving():
    eng = engine_fatal("RuntimeError: Executor failed.").splitlines(keepends=True)
    wrk = worker_exception(2, WORKER_TB, "RuntimeError: boom").splitlines(keepends=True)
    mixed = [line for pair in zip(eng, wrk, strict=False) for line in pair] + eng[len(wrk) :]
    tbs = tracebacks(list(iter_lines("".join(mixed))))
    assert [(t.proc, t.exc_type, t.message, t.header) for t in tbs] == [
        ("EngineCore", "RuntimeError", "Executor failed.", "EngineCore encountered a fatal error."),
        ("Worker_TP2", "RuntimeError", "boom", "WorkerProc hit an exception."),
    ]
    assert [f.func for f in tbs[1].frames] == [
        "worker_busy_loop",
        "decorate_context",
        "execute_model",
    ]


@pytest.mark.inprocess
def test_chained_traceback_is_an_effect():
    log = prefixed(
        "EngineCore",
        5,
        "core.py:1",
        "Traceback (most recent call last):\n"
        + frames(("vllm/a.py", 1, "inner", "x"))
        + "\nKeyError: 'blk'\n\nThe above exception was the direct cause of the following "
        "exception:\n\nTraceback (most recent call last):\n"
        + frames(("vllm/b.py", 2, "outer", "y"))
        + "\nRuntimeError: wrapped",
    )
    tbs = tracebacks(list(iter_lines(log)))
    assert [(t.exc_type, t.chained) for t in tbs] == [("KeyError", False), ("RuntimeError", True)]
    assert sig(log).exception == "KeyError"


@pytest.mark.inprocess
def test_scheduler_dump_suspects_exact():
    d = dump(
        [("chatcmpl-sess-2/turn-9-1a2b3c4d", 0), ("cmpl-plain-id-00000000", 2048)],
        [("chatcmpl-a-0badf00d", 337128), ("chatcmpl-b-12345678", 12)],
    )
    assert parse_scheduler_dump(d.splitlines()[0]) == [
        DumpedRequest("chatcmpl-sess-2/turn-9-1a2b3c4d", 0, True),
        DumpedRequest("cmpl-plain-id-00000000", 2048, True),
        DumpedRequest("chatcmpl-a-0badf00d", 337128, False),
        DumpedRequest("chatcmpl-b-12345678", 12, False),
    ]
    s = sig(d)
    assert s.suspects == ("sess-2/turn-9", "plain-id", "a", "b")
    assert s.computed_tokens == {"sess-2/turn-9": 0, "plain-id": 2048, "a": 337128, "b": 12}


@pytest.mark.inprocess
def test_scheduler_dump_older_and_unknown_layouts():
    old = (
        "Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[], "
        "scheduled_cached_reqs=[CachedRequestData(req_id='chatcmpl-x-1a2b3c4d', "
        "resumed_from_preemption=False, num_computed_tokens=4096), CachedRequestData(req_id="
        "'chatcmpl-y-2b3c4d5e', resumed_from_preemption=True, num_computed_tokens=8)], "
        "num_scheduled_tokens={'chatcmpl-x-1a2b3c4d': 1})"
    )
    assert parse_scheduler_dump(old) == [
        DumpedRequest("chatcmpl-x-1a2b3c4d", 4096, False),
        DumpedRequest("chatcmpl-y-2b3c4d5e", 8, False),
    ]
    partial = (
        "Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=["
        "NewRequestData(<elided>), NewRequestData(req_id=chatcmpl-z-1a2b3c4d,num_computed_tokens"
        "=7)], scheduled_cached_reqs=CachedRequestData(req_ids=[], num_computed_tokens=[]))"
    )
    assert parse_scheduler_dump(partial) == [DumpedRequest("chatcmpl-z-1a2b3c4d", 7, True)]
    odd = (
        "Dumping scheduler output for model execution: SchedulerOutput(reqs=<elided>, "
        "num_scheduled_tokens={'chatcmpl-p-1a2b3c4d': 3, 'chatcmpl-q-2b3c4d5e': 1})"
    )
    assert [r.engine_id for r in parse_scheduler_dump(odd)] == [
        "chatcmpl-p-1a2b3c4d",
        "chatcmpl-q-2b3c4d5e",
    ]


@pytest.mark.inprocess
def test_client_request_id():
    assert client_request_id("chatcmpl-turn-3-1a2b3c4d") == "turn-3"
    assert client_request_id("cmpl-turn-3-1a2b3c4d") == "turn-3"
    assert client_request_id("chatcmpl-9f8e7d6c5b4a3f2e") == "9f8e7d6c5b4a3f2e"  # no header
    # older vLLM adds no suffix: the known ids decide
    assert client_request_id("chatcmpl-job-deadbeef", {"job-deadbeef"}) == "job-deadbeef"
    assert client_request_id("chatcmpl-job-deadbeef", {"job"}) == "job"
    s = sig(dump([("chatcmpl-job-deadbeef", 5)], []), request_ids={"job-deadbeef"})
    assert s.suspects == ("job-deadbeef",)


# -- matching ----------------------------------------------------------------------------------


@pytest.mark.inprocess
def test_regex_pinning():
    hip, cuda = sig(ROCM_HIP), sig(CUDA_IMA)
    assert matches_regex(hip, r"Code: 700") and not matches_regex(cuda, r"Code: 700")
    assert matches_regex(hip, r"forward_mqa") and not matches_regex(cuda, r"forward_mqa")
    assert matches_regex(cuda, compile_signature_regex(r"^engine_dead: AcceleratorError"))
    assert matches_regex(sig(ROCM_FAULT), r"Memory access fault.*Reason: Unknown")
    with pytest.raises(UsageError) as err:
        compile_signature_regex("(unclosed")
    assert str(err.value).startswith("signature '(unclosed' is not a valid regex: ")


@pytest.mark.inprocess
def test_round_trip_and_hashable():
    s = sig(ROCM_HSA_EXCEPTION, exit_code=0)
    again = Signature.from_dict(s.to_dict())
    assert again == s and hash(again) == hash(s)
    assert len({s, again, sig(ROCM_HIP)}) == 2
    with pytest.raises(ValueError):
        Signature.from_dict({**s.to_dict(), "frames": "x"})
    with pytest.raises(ValueError):
        Signature.from_dict({**s.to_dict(), "computed_tokens": [1]})
    with pytest.raises(ValueError):
        signature_from_log("", failure_class="")


# -- the emulator's own crash logs, end to end ------------------------------------------------


def run_crash(emulator_factory, *args: str, ids: tuple[str, ...] = ("a", "b"), cls="process_exit"):
    emu = emulator_factory(["--speed", "instant", "--fault", "exit when request=2", *args])
    with httpx.Client(base_url=emu.url, timeout=10) as c:
        for rid in ids:
            with contextlib.suppress(httpx.TransportError):  # gone after the crash
                c.post(
                    "/v1/chat/completions",
                    json={
                        "model": "moonshotai/Kimi-K3",
                        "max_tokens": 2,
                        "messages": [{"role": "user", "content": "hello there " * 20}],
                    },
                    headers={"X-Request-Id": rid},
                )
    code = emu.wait_exit(10)
    return signature_from_log(emu.read_log(), failure_class=cls, exit_code=code)


@pytest.mark.e2e
def test_emulator_same_fault_same_signature(emulator_factory):
    a = run_crash(emulator_factory, "--platform", "rocm", ids=("turn-1", "turn-2"))
    b = run_crash(
        emulator_factory, "--platform", "rocm", "-tp", "4", "--seed", "7", ids=("x-1", "x-2")
    )
    assert a.hash == b.hash and matches(a, b)
    assert (a.suspects, b.suspects) == (("turn-2",), ("x-2",))
    assert a.exit == b.exit == "code 0"
    assert a.gpu_errors == (
        "Memory access fault by GPU node-<N> on address <ADDR>. Reason: Unknown",
    )


@pytest.mark.e2e
def test_emulator_different_faults_different_signatures(emulator_factory):
    hsa = run_crash(emulator_factory, "--platform", "rocm")
    cuda = run_crash(emulator_factory, "--platform", "cuda")
    hip = run_crash(
        emulator_factory, "--platform", "rocm", "--fault", "exit gpu=hip when request=1"
    )
    assert len({hsa.hash, cuda.hash, hip.hash}) == 3
    assert (
        cuda.exception == "AcceleratorError"
        and cuda.frames[0] == "gpu_model_runner.py:_prepare_inputs"
    )
    assert hip.gpu_errors == (HIP_ERR,) and hip.suspects == ("a",)
    assert matches_regex(hip, "Code: 700") and not matches_regex(cuda, "Code: 700")


@pytest.mark.e2e
def test_emulator_batch_suspects_in_dump_order(emulator_factory):
    emu = emulator_factory(
        ["--decode-time", "0.05", "--fault", "dead when request=3"], log_bodies=False
    )
    body = {
        "model": "moonshotai/Kimi-K3",
        "max_tokens": 200,
        "stream": True,
        "messages": [{"role": "user", "content": "tell me a story " * 10}],
    }
    started = [threading.Event(), threading.Event()]

    def stream(rid: str, ev: threading.Event) -> None:
        with (
            httpx.Client(base_url=emu.url, timeout=30) as c,
            c.stream("POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}) as r,
        ):
            for _ in r.iter_bytes():
                ev.set()

    threads = [
        threading.Thread(target=stream, args=(f"bg-{i}", ev)) for i, ev in enumerate(started)
    ]
    for t in threads:
        t.start()
    assert all(ev.wait(10) for ev in started)  # both are decoding
    with httpx.Client(base_url=emu.url, timeout=10) as c:
        c.post(
            "/v1/chat/completions",
            json={
                **body,
                "stream": False,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "an unrelated question " * 10}],
            },
            headers={"X-Request-Id": "culprit"},
        )
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads)
    s = signature_from_log(emu.wait_log("output_handler failed"), failure_class="engine_dead")
    assert s.suspects[0] == "culprit"
    assert sorted(s.suspects[1:]) == ["bg-0", "bg-1"]
    assert s.computed_tokens["culprit"] == 0  # a new request, nothing cached
    # the two streams were decoding: their 44 prompt tokens and some output are computed
    assert s.computed_tokens["bg-0"] > 44 and s.computed_tokens["bg-1"] > 44


@pytest.mark.e2e
def test_emulator_hang_and_kill(emulator_factory):
    emu = emulator_factory(["--speed", "instant", "--fault", "hang warn_every=0.1 when request=1"])
    with httpx.Client(base_url=emu.url, timeout=0.5) as c, pytest.raises(httpx.ReadTimeout):
        c.post(
            "/v1/chat/completions",
            json={
                "model": "moonshotai/Kimi-K3",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    log = emu.wait_log("No available shared memory broadcast block")
    h = signature_from_log(log, failure_class="hang")
    assert h.events == ("no shared memory broadcast block (engine stalled)",)
    assert h.hash == signature_from_log("", failure_class="hang").hash

    emu = emulator_factory(["--speed", "instant", "--fault", "cut kill=1 when request=1"])
    with httpx.Client(base_url=emu.url, timeout=10) as c, pytest.raises(httpx.TransportError):
        c.post(
            "/v1/chat/completions",
            json={
                "model": "moonshotai/Kimi-K3",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
            },
        )
    code = emu.wait_exit(10)
    k = signature_from_log(emu.read_log(), failure_class="stream_cut", exit_code=code)
    assert (code, k.exit, k.exception) == (-9, "signal SIGKILL", None)
    assert k.hash == signature_from_log("", failure_class="stream_cut", signal=9).hash
