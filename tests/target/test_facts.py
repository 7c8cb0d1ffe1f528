"""Facts for repro bundles: env filtering, secret redaction, cache-config
labels, and what a launched emulator says about itself."""

from __future__ import annotations

import os

import httpx
import pytest

from replayer.target.facts import (
    ServerFacts,
    cache_config_labels,
    cache_identity,
    container_of,
    gather_facts,
    hardware_lines,
    is_secret,
    pip_packages,
    redact_command,
    redact_facts,
    relevant_env,
    server_python,
)
from tests.helpers.target import MODEL

EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="fp8",enable_prefix_caching="True",\
num_gpu_blocks="65536"} 1.0
"""


@pytest.mark.inprocess
def test_relevant_env_keeps_kernel_knobs_and_drops_secrets():
    env = {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_API_KEY": "sk-1",
        "HIP_VISIBLE_DEVICES": "0,1",
        "ROCM_PATH": "/opt/rocm",
        "NCCL_DEBUG": "INFO",
        "AITER_LOG_MORE": "1",
        "TRITON_CACHE_DIR": "/tmp/t",
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_AUTH_TOKEN": "x",
        "NCCL_IB_PASSWORD": "x",
        "TRITON_SECRET": "x",
        "HF_TOKEN": "hf_x",
        "PATH": "/bin",
        "MY_VLLM_THING": "1",
    }
    assert relevant_env(env) == {
        "AITER_LOG_MORE": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        "HIP_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "INFO",
        "ROCM_PATH": "/opt/rocm",
        "TRITON_CACHE_DIR": "/tmp/t",
        "VLLM_ROCM_USE_AITER": "1",
    }


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("cmd", "redacted"),
    [
        ("vllm serve m --api-key sk-123 --port 8000", "vllm serve m --api-key *** --port 8000"),
        ("vllm serve m --api-key=sk-123", "vllm serve m --api-key=***"),
        (
            "HF_TOKEN=hf_abc VLLM_API_KEY=k vllm serve m",
            "HF_TOKEN=*** VLLM_API_KEY=*** vllm serve m",
        ),
        (
            "ssh -i ~/.ssh/key node docker restart vllm",
            "ssh -i ~/.ssh/key node docker restart vllm",
        ),
        ("vllm serve m --hf-token abc", "vllm serve m --hf-token ***"),
    ],
)
def test_redact_command(cmd, redacted):
    assert redact_command(cmd) == redacted


@pytest.mark.inprocess
def test_cache_config_labels():
    assert cache_config_labels(EXPOSITION) == {
        "block_size": "16",
        "cache_dtype": "fp8",
        "enable_prefix_caching": "True",
        "num_gpu_blocks": "65536",
    }
    assert cache_config_labels("# TYPE x gauge\nx 1\n") is None
    assert cache_config_labels("not { prometheus") is None


@pytest.mark.e2e
async def test_facts_of_a_launched_server(launched):
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ROCM_USE_AITER": "1",
        "NCCL_DEBUG": "INFO",
        "VLLM_SECRET_THING": "hidden",
    }
    t = launched("--block-size", "32", env=env)
    await t.start()
    await t.wait_ready(120)
    facts = await t.facts()
    assert facts.url == t.url
    assert facts.version == "0.33.0"
    assert [m["id"] for m in facts.models] == [MODEL]
    assert isinstance(facts.server_info, dict)
    assert facts.server_info["vllm_env"]["VLLM_ROCM_USE_AITER"] == "1"
    assert facts.cache_config is not None and facts.cache_config["block_size"] == "32"
    assert facts.missing == {}
    cmd = facts.command
    assert cmd["kind"] == "launch" and cmd["launches"] == 1 and cmd["exit"] is None
    assert str(cmd["launch"]).endswith("--block-size 32")
    assert "VLLM_SECRET_THING=***" in str(cmd["launch"])
    got_env = cmd["env"]
    assert isinstance(got_env, dict)
    assert {
        k: got_env[k] for k in ("VLLM_SERVER_DEV_MODE", "VLLM_ROCM_USE_AITER", "NCCL_DEBUG")
    } == {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ROCM_USE_AITER": "1",
        "NCCL_DEBUG": "INFO",
    }
    assert "VLLM_SECRET_THING" not in got_env
    assert got_env == relevant_env({**os.environ, **env})
    assert facts.to_dict()["version"] == "0.33.0"
    # a local launch: its own interpreter lists its packages, and the caches are read here
    assert facts.packages is not None and "aiohttp" in facts.packages
    assert str(facts.packages_from).startswith("the server's interpreter (")
    assert [c["name"] for c in facts.jit_caches] == ["aiter", "triton", "torchinductor", "vllm"]
    assert facts.container is None


@pytest.mark.e2e
async def test_facts_without_dev_mode_say_what_is_missing(launched):
    t = launched()
    await t.start()
    await t.wait_ready(120)
    facts = await t.facts()
    assert facts.server_info is None
    off = "HTTP 404 (dev mode off: VLLM_SERVER_DEV_MODE=1 enables it)"
    assert facts.missing == {"/server_info?config_format=json": off}
    await t.stop()
    gone = await t.facts()
    assert gone.version is None and gone.models == () and gone.cache_config is None
    assert sorted(gone.missing) == [
        "/metrics",
        "/server_info?config_format=json",
        "/v1/models",
        "/version",
    ]
    assert all(v.startswith("ConnectError") for v in gone.missing.values())
    assert gone.command["exit"] == "code 0"


@pytest.mark.inprocess
async def test_gather_facts_from_odd_answers():
    def handler(request: httpx.Request) -> httpx.Response:
        return {
            "/version": httpx.Response(200, text="0.33.0"),  # not JSON
            "/v1/models": httpx.Response(200, json={"data": [{"id": "m"}, "junk"]}),
            "/server_info": httpx.Response(404, json={"detail": "Not Found"}),
            "/metrics": httpx.Response(200, text="# TYPE x gauge\nx 1\n"),
        }[request.url.path]

    async with httpx.AsyncClient(
        base_url="http://t", transport=httpx.MockTransport(handler)
    ) as client:
        facts = await gather_facts(client, "http://t", {"kind": "x"})
    assert facts == ServerFacts(
        url="http://t",
        version=None,
        models=({"id": "m"},),
        server_info=None,
        cache_config=None,
        command={"kind": "x"},
        missing={
            "/version": "not JSON",
            "/server_info?config_format=json": (
                "HTTP 404 (dev mode off: VLLM_SERVER_DEV_MODE=1 enables it)"
            ),
            "/metrics": "no vllm:cache_config_info",
            "packages": (
                "not a local launch, and no /server_info (VLLM_SERVER_DEV_MODE=1 enables it)"
            ),
        },
    )

    async with httpx.AsyncClient(
        base_url="http://t", transport=httpx.MockTransport(lambda r: httpx.Response(503))
    ) as client:
        facts = await gather_facts(client, "http://t", {})
    assert facts.missing == {
        "/version": "HTTP 503",
        "/v1/models": "HTTP 503",
        "/server_info?config_format=json": "HTTP 503",
        "/metrics": "HTTP 503",
        "packages": "not a local launch, and no /server_info (VLLM_SERVER_DEV_MODE=1 enables it)",
    }


@pytest.mark.inprocess
def test_the_new_families_and_one_secret_rule():
    env = {
        "HSA_XNACK": "0",
        "AMD_SERIALIZE_KERNEL": "3",
        "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True",
        "LMCACHE_CHUNK_SIZE": "256",
        "MC_TE_METRIC": "1",
        "NCCL_MIN_NCHANNELS": "16",
        "LMCACHE_REMOTE_AUTH": "x",
        "MC_COOKIE": "x",
        "PYTORCH_CREDENTIALS": "x",
        "HSA_API_KEY": "x",
        "VLLM_MAX_TOKENS_PER_BATCH": "8",
        "HOME": "/root",
    }
    assert relevant_env(env) == {
        "AMD_SERIALIZE_KERNEL": "3",
        "HSA_XNACK": "0",
        "LMCACHE_CHUNK_SIZE": "256",
        "MC_TE_METRIC": "1",
        "NCCL_MIN_NCHANNELS": "16",
        "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True",
        "VLLM_MAX_TOKENS_PER_BATCH": "8",
    }
    # one rule for names, in env and in commands: the value never leaves
    assert [is_secret(n) for n in ("--max-num-batched-tokens", "--tokenizer", "AUTHORIZATION")] == [
        False,
        False,
        True,
    ]
    assert redact_command(
        "MC_AUTH=a LMCACHE_COOKIE=b vllm serve m --max-num-batched-tokens 8192 --enforce-eager "
        "--api-key k --credential-file=f"
    ) == (
        "MC_AUTH=*** LMCACHE_COOKIE=*** vllm serve m --max-num-batched-tokens 8192 "
        "--enforce-eager --api-key *** --credential-file=***"
    )


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("cmd", "want"),
    [
        (
            "docker run --rm -it --gpus all -e X=1 -v /a:/b --network=host "
            "rocm/vllm-dev@sha256:0123abcd vllm serve m",
            {
                "runtime": "docker",
                "image": "rocm/vllm-dev@sha256:0123abcd",
                "digest": "sha256:0123abcd",
            },
        ),
        (
            "sh -c 'podman run -d --device /dev/kfd rocm/vllm:v0.9 vllm serve m'",
            {"runtime": "podman", "image": "rocm/vllm:v0.9", "digest": None},
        ),
        (
            "apptainer exec --rocm -B /x:/y /img/vllm.sif vllm serve m",
            {"runtime": "apptainer", "image": "/img/vllm.sif", "digest": None},
        ),
        (
            "srun -N1 --container-image=nvcr.io/nvidia/vllm:25.01 vllm serve m",
            {"runtime": "srun", "image": "nvcr.io/nvidia/vllm:25.01", "digest": None},
        ),
        ("VLLM_X=1 vllm serve m --port 8000", None),
        ("docker restart vllm", None),
    ],
)
def test_container_of_the_launch(cmd, want):
    assert container_of(cmd) == want


@pytest.mark.inprocess
def test_hardware_lines_from_a_server_log():
    log = "\n".join(
        [
            "(APIServer pid=1) INFO 12-01 10:00:00 [__init__.py:291] Automatically detected "
            "platform rocm.",
            "(EngineCore pid=2) INFO 12-01 10:00:01 [core.py:90] something else",
            "node1:2:2 [0] NCCL INFO RCCL version 2.21.5+hip6.3 HEAD:a5e3f71",
            "node1:2:2 [0] NCCL INFO ROCr version 1.14",
            "(Worker pid=3) WARNING 12-01 10:00:02 [fused_moe.py:1164] Using default MoE "
            "config. Config file not found at E=8,N=512,device_name=AMD_Instinct_MI355X.json",
            "(APIServer pid=1) INFO 12-01 10:00:03 [__init__.py:291] Automatically detected "
            "platform rocm.",
            "amdgpu firmware: SMC 0x00556400",
        ]
    )
    assert hardware_lines(log) == [
        "Automatically detected platform rocm.",
        "node1:2:2 [0] NCCL INFO RCCL version 2.21.5+hip6.3 HEAD:a5e3f71",
        "node1:2:2 [0] NCCL INFO ROCr version 1.14",
        "Using default MoE config. Config file not found at "
        "E=8,N=512,device_name=AMD_Instinct_MI355X.json",
        "amdgpu firmware: SMC 0x00556400",
    ]


@pytest.mark.inprocess
def test_cache_identity_and_packages_from_server_info(tmp_path):
    d = tmp_path / "triton"
    (d / "ab").mkdir(parents=True)
    (d / "ab" / "k.hsaco").write_bytes(b"x" * 10)
    (d / "k.json").write_bytes(b"{}")
    os.utime(d / "k.json", (1_700_000_000, 1_700_000_000))
    os.utime(d / "ab" / "k.hsaco", (1_600_000_000, 1_600_000_000))
    assert cache_identity(d) == {
        "path": str(d),
        "exists": True,
        "files": 2,
        "bytes": 12,
        "newest": "2023-11-14T22:13:20Z",
    }
    assert cache_identity(tmp_path / "none") == {"path": str(tmp_path / "none"), "exists": False}
    info = {"system_env": {"pip_packages": "[pip3] numpy==2.2.6\n[pip3] torch==2.9.0+rocm7.0\n"}}
    assert pip_packages(info) == {"numpy": "2.2.6", "torch": "2.9.0+rocm7.0"}
    assert pip_packages({"system_env": {}}) is None


@pytest.mark.inprocess
def test_server_python_reads_the_script_shebang(tmp_path):
    py = tmp_path / "bin" / "python3.11"
    py.parent.mkdir()
    py.write_text("")
    py.chmod(0o755)
    script = tmp_path / "bin" / "vllm"
    script.write_text(f"#!{py}\nimport sys\n")
    script.chmod(0o755)
    path = {"PATH": str(tmp_path / "bin")}
    assert server_python("VLLM_X=1 vllm serve m", path) == py
    assert server_python(f"{py} -m vllm.entrypoints.openai.api_server", path) == py
    assert server_python("nope serve m", path) is None


@pytest.mark.inprocess
def test_a_bundle_never_ships_a_launch_secret(tmp_path):
    launch = "HF_TOKEN=hf_x VLLM_X=1 vllm serve m --api-key sk-1 --max-num-batched-tokens 8192"
    facts = {"launch": launch, "command": {"kind": "launch", "launch": launch}}
    assert redact_facts(facts) == {
        "launch": "HF_TOKEN=*** VLLM_X=1 vllm serve m --api-key *** --max-num-batched-tokens 8192",
        "command": {
            "kind": "launch",
            "launch": "HF_TOKEN=*** VLLM_X=1 vllm serve m --api-key *** "
            "--max-num-batched-tokens 8192",
        },
    }
    assert facts["launch"] == launch  # the caller's facts are left as they were
    from replayer.bundle.export import write_bundle
    from replayer.trace import Trace
    from replayer.trace.synth import SynthOptions, write_trace

    p = tmp_path / "t.arrow"
    write_trace(p, SynthOptions(sessions=1, turns=2, context=3_000, max_tokens=4, seed=9))
    t = Trace.open(p)
    b = write_bundle(
        tmp_path / "bundle",
        trace=t,
        trace_sha256="x" * 64,
        rows=t.order,
        manifest={"policy": {"timing": "asap"}, "signature": None, "target": facts},
    )
    for name in ("manifest.json", "README.md"):
        text = (b / name).read_text()
        assert "hf_x" not in text and "sk-1" not in text, name
    assert "--max-num-batched-tokens 8192" in (b / "README.md").read_text()
