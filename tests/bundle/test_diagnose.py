"""``bundle diagnose``: profiles shipped and read from files, the kernel read
off real log formats, and the command against the emulator, whose fault
names its kernel only under ``AMD_SERIALIZE_KERNEL=3``."""

from __future__ import annotations

import shlex
import sys
import tarfile

import orjson
import pytest

from replayer.bundle.diagnose import (
    apply,
    default_profiles,
    find_fault,
    load_profiles,
    looks_rocm,
)
from replayer.errors import UsageError
from tests.helpers.bundles import make_bundle
from tests.helpers.cli import run
from tests.helpers.net import free_port

EMULATOR_SERIALIZED = """\
(Worker_TP7 pid=12) :3:rocvirtual.cpp           :3135: 7283490196 us: [pid:12 tid:0x7f3f4affd700] ShaderName : mla_decode_kernel
(Worker_TP7 pid=12) Memory access fault by GPU node-9 (Agent handle: 0x55d0c8a1e2f0) on address 0x7f2a3c000000. Reason: Unknown.
(Worker_TP7 pid=12) Fatal Python error: Aborted
(Worker_TP7 pid=12) Thread 0x00007f3f4affd700 (most recent call first):
(Worker_TP7 pid=12)   File "/usr/local/lib/python3.12/dist-packages/aiter/mla.py", line 187 in mla_decode_fwd
"""  # noqa: E501
SANITIZER = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at flash_fwd_kernel(Params)+0x1a70 in /src/csrc/flash_fwd.cu:212
=========     by thread (3,0,0) in block (0,0,0)
"""
DEBUG_AGENT = """\
Queue 0x7fbd4c000000 state: 0
    wave_0: pc=0x7fbd6cc1a298 (stopped, reason: MEMVIOL)
Disassembly for function paged_attention_kernel(float*, int):
    code object: file:///opt/vllm/_rocm_C.so#offset=14309&size=31336
/opt/vllm/csrc/rocm/attention.cu:1053
    v = k_cache[block * stride + i];
"""


@pytest.mark.inprocess
def test_find_fault_reads_each_tool():
    got = find_fault(EMULATOR_SERIALIZED)
    assert got is not None
    assert (got["kernel"], got["file"], got["line"], got["how"]) == (
        "mla_decode_kernel",
        "aiter/mla.py",
        187,
        "HIP dispatch log (ShaderName)",
    )
    assert got["lines"][0].endswith("ShaderName : mla_decode_kernel")
    s = find_fault(SANITIZER)
    assert s is not None
    assert (s["kernel"], s["file"], s["line"], s["how"]) == (
        "flash_fwd_kernel(Params)",
        "/src/csrc/flash_fwd.cu",
        212,
        "compute-sanitizer",
    )
    d = find_fault(DEBUG_AGENT)
    assert d is not None
    assert (d["kernel"], d["file"], d["line"]) == (
        "paged_attention_kernel",
        "/opt/vllm/csrc/rocm/attention.cu",
        1053,
    )
    # the asynchronous fault alone names no kernel
    unserialized = EMULATOR_SERIALIZED.splitlines()[1]
    assert find_fault(unserialized) is None


@pytest.mark.inprocess
def test_the_last_dispatch_before_the_fault_is_the_one():
    log = "ShaderName : a_kernel\nShaderName : b_kernel\nMemory access fault by GPU node-2\n"
    log += "ShaderName : later_kernel\n"
    got = find_fault(log)
    assert got is not None and got["kernel"] == "b_kernel"


@pytest.mark.inprocess
def test_profiles_shipped_by_platform_and_from_a_file(tmp_path):
    rocm = [p.name for p in load_profiles(["default"], "HIP_VISIBLE_DEVICES=0 vllm serve m", {})]
    if not looks_rocm("vllm serve m", {}):  # a ROCm machine makes every launch ROCm
        cuda = [p.name for p in load_profiles(["default"], "vllm serve m", {})]
        assert cuda == ["cuda-launch-blocking", "compute-sanitizer"]
    assert rocm == ["serialize-kernels", "amd-log-level-4", "hip-launch-blocking"]
    f = tmp_path / "p.toml"
    f.write_text(
        '[[profile]]\nname = "debug-agent"\nplatform = "rocm"\n'
        'env = { HSA_TOOLS_LIB = "librocm-debug-agent.so.2", HSA_ENABLE_DEBUG = 1 }\n'
    )
    got = load_profiles([str(f), "default:serialize-kernels"], "vllm serve m", {})
    assert [p.name for p in got] == ["debug-agent", "serialize-kernels"]
    assert dict(got[0].env) == {
        "HSA_TOOLS_LIB": "librocm-debug-agent.so.2",
        "HSA_ENABLE_DEBUG": "1",
    }
    with pytest.raises(UsageError, match="no shipped profile nope"):
        load_profiles(["default:nope"], "vllm serve m", {})
    f.write_text('[[profile]]\nname = "x"\n')
    with pytest.raises(UsageError, match="changes nothing"):
        load_profiles([str(f)], "vllm serve m", {})


@pytest.mark.inprocess
def test_apply_sets_env_and_prefix():
    shipped = {p.name: p for p in default_profiles()}
    cmd, change = apply(shipped["serialize-kernels"], "VLLM_X=1 vllm serve m --port 8")
    assert cmd == "VLLM_X=1 AMD_SERIALIZE_KERNEL=3 vllm serve m --port 8"
    assert change == "AMD_SERIALIZE_KERNEL=3"
    assert apply(shipped["serialize-kernels"], "AMD_SERIALIZE_KERNEL=3 vllm serve m") == (
        None,
        "the launch already has it",
    )
    sanitizer = shipped["compute-sanitizer"]
    cmd, why = apply(sanitizer, "vllm serve m")
    if cmd is None:
        assert why == "compute-sanitizer is not installed (not on PATH)"
    else:
        assert cmd == "compute-sanitizer --tool memcheck vllm serve m"


def _emulator(*faults: str) -> str:
    args = [sys.executable, "-m", "replayer.emulator", "--port", str(free_port())]
    args += ["--speed", "instant"]
    for f in faults:
        args += ["--fault", f]
    return shlex.join(args)


def test_diagnose_names_the_kernel_only_under_serialized_dispatch(tmp_path):
    b = make_bundle(tmp_path)
    fault = "dead gpu=hsa when request=3"
    common = ["--settle", "1", "--grace", "0.5", "--health-interval", "0.1"]
    quiet = run(
        "bundle", "diagnose", b, "--launch", _emulator(fault),
        "--profile", "default:hip-launch-blocking", "--out", tmp_path / "d1", *common,
    )  # fmt: skip
    assert quiet.returncode == 1, quiet.stdout + quiet.stderr
    assert "hip-launch-blocking: MATCH; no kernel named" in quiet.stdout
    readme = (b / "README.md").read_text()
    assert "## Diagnosis" in readme and "mla_decode_kernel" not in readme
    assert "**the crash came back, but no log named a kernel**" in readme

    named = run(
        "bundle", "diagnose", b, "--launch", _emulator(fault),
        "--profile", "default:serialize-kernels", "--out", tmp_path / "d2", *common,
    )  # fmt: skip
    assert named.returncode == 0, named.stdout + named.stderr
    assert "serialize-kernels: MATCH; mla_decode_kernel at aiter/mla.py:187" in named.stdout
    readme = (b / "README.md").read_text()
    reading = "faulting kernel mla_decode_kernel (aiter/mla.py:187), named under serialize-kernels"
    assert f"**{reading}**" in readme
    assert (
        "| serialize-kernels | `AMD_SERIALIZE_KERNEL=3` | MATCH (engine_dead) | "
        "`mla_decode_kernel` | `aiter/mla.py:187` |"
    ) in readme
    m = orjson.loads((b / "manifest.json").read_bytes())
    row = m["diagnosis"]["profiles"][0]
    assert (row["name"], row["fault"]["kernel"], row["fault"]["line"]) == (
        "serialize-kernels",
        "mla_decode_kernel",
        187,
    )
    assert "AMD_SERIALIZE_KERNEL=3" in row["launch"]
    # the tarball carries the new README
    with tarfile.open(b.with_name(b.name + ".tar.gz")) as tar:
        member = tar.extractfile(f"{b.name}/README.md")
        assert member is not None and reading in member.read().decode()


def test_diagnose_needs_a_launch(tmp_path):
    b = make_bundle(tmp_path)
    res = run("bundle", "diagnose", b, "--url", "http://127.0.0.1:9")
    assert res.returncode == 2
    assert "--launch" in res.stderr
