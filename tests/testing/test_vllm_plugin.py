"""The crash plugin's decisions, without vLLM: fake scheduler outputs in, the
exact effects out; its import hook against a stand-in ``vllm`` package in a
subprocess (the real engine is the real-vLLM tier's)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from replayer.emulator.faults import FaultSpecError
from replayer.testing.vllm_plugin import Injector, parse_rules

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Req:
    req_id: str
    prompt_token_ids: list[int]
    num_computed_tokens: int = 0


@dataclass
class Step:
    scheduled_new_reqs: list[Req] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0


def step(*reqs: Req, tokens: int | None = None) -> Step:
    sched = {r.req_id: len(r.prompt_token_ids) - r.num_computed_tokens for r in reqs}
    total = sum(sched.values()) if tokens is None else tokens
    return Step(list(reqs), sched, total)


def injector(spec: str, tmp_path: Path, seed: int = 0) -> Injector:
    return Injector(parse_rules(spec), random.Random(seed), str(tmp_path / "faults.jsonl"))


def decisions(tmp_path: Path) -> list[dict]:
    path = tmp_path / "faults.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.inprocess
def test_raise_fires_on_the_request_with_a_long_prompt_and_a_cache_hit(tmp_path):
    inj = injector("raise gpu=hip when prompt_tokens>=100 and cached_tokens>=64", tmp_path)
    inj.before_step(step(Req("a", [1] * 120)))  # long, no hit
    inj.before_step(step(Req("b", [1] * 50, 48)))  # hit, short
    with pytest.raises(RuntimeError, match=r"Triton Error \[HIP\]: Code: 700"):
        inj.before_step(step(Req("c", [1] * 130, 64)))
    (d,) = decisions(tmp_path)
    assert d["request_id"] == "c" and d["fired"] is True
    assert d["values"] == {"prompt_tokens": 130.0, "cached_tokens": 64.0}
    inj.before_step(step(Req("d", [1] * 130, 64)))  # times=1: fired already


@pytest.mark.inprocess
def test_request_ordinal_counts_new_requests_once(tmp_path):
    inj = injector("raise gpu=cuda when request=3", tmp_path)
    inj.before_step(step(Req("a", [1]), Req("b", [1])))
    inj.before_step(step())  # a decode step: nothing new
    with pytest.raises(RuntimeError, match="CUDA error: an illegal memory access"):
        inj.before_step(step(Req("c", [1])))
    assert [d["request_id"] for d in decisions(tmp_path)] == ["c"]


@pytest.mark.inprocess
def test_step_rules_see_scheduled_tokens_and_probability_is_drawn(tmp_path):
    inj = injector("slow add=0 steps=2 when scheduled_tokens>=10 p=0.5 times=0", tmp_path, seed=3)
    for _ in range(20):
        inj.before_step(step(Req("x", [1] * 12)))
    got = decisions(tmp_path)
    assert len(got) == 20 and all(d["request_id"] is None for d in got)
    fired = [d["fired"] for d in got]
    rng = random.Random(3)
    assert fired == [rng.random() < 0.5 for _ in range(20)]


@pytest.mark.inprocess
def test_delayed_effect_waits_for_a_later_step(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("replayer.testing.vllm_plugin.time.monotonic", lambda: clock[0])
    inj = injector("raise when step=1 delay=5", tmp_path)
    inj.before_step(step())  # decided at t=100, due at 105
    clock[0] = 104.0
    inj.before_step(step())
    clock[0] = 105.0
    with pytest.raises(RuntimeError, match="HIP"):
        inj.before_step(step())


@pytest.mark.inprocess
def test_bad_rules_are_one_clear_error():
    with pytest.raises(FaultSpecError, match="unknown variable 'running'"):
        parse_rules("raise when running>=2")
    with pytest.raises(FaultSpecError, match="unknown effect 'cut'"):
        parse_rules("cut when request=1")


@dataclass
class Aborted:
    """What EngineCore's scheduler holds of a request it finishes as aborted."""

    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int = 0


@pytest.mark.inprocess
def test_abort_rules_fire_on_aborts_with_the_cache_hit_of_the_first_schedule(tmp_path):
    inj = injector("raise gpu=hsa when abort>=1 and cached_tokens>=256", tmp_path)
    # the worker's steps never evaluate an abort rule
    inj.before_step(step(Req("a", [1] * 600, 512)))
    assert decisions(tmp_path) == []
    inj.scheduled([Req("a", [1] * 600, 512), Req("b", [1] * 600, 128)])
    inj.aborted([Aborted("b", 600, 7)])  # aborted, but only 128 cached
    with pytest.raises(RuntimeError, match="HSA_STATUS_ERROR_EXCEPTION"):
        inj.aborted([Aborted("a", 600, 3)])
    (d,) = decisions(tmp_path)
    assert (d["request_id"], d["fired"]) == ("a", True)
    assert d["values"] == {"abort": 2.0, "cached_tokens": 512.0}
    assert inj.cached == {}  # forgotten once aborted


@pytest.mark.inprocess
def test_abort_rules_refuse_what_an_abort_cannot_do():
    with pytest.raises(FaultSpecError, match="slow cannot fire on an abort"):
        parse_rules("slow when abort>=1")
    with pytest.raises(FaultSpecError, match="only exit and abort take a delay"):
        parse_rules("raise when abort>=1 delay=2")
    with pytest.raises(FaultSpecError, match="no step variable at an abort"):
        parse_rules("raise when abort>=1 and batch>=2")
    assert parse_rules("exit code=3 when output_tokens>=5 delay=1")[0].delay == 1.0


FAKE_RUNNER = """
class GPUModelRunner:
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        return "ran"
"""
FAKE_CORE = """
class EngineCore:
    def add_request(self, request, request_wave=0):
        return "added"
"""
CALLER = """
import os, sys
from types import SimpleNamespace as NS
from replayer.testing.vllm_plugin import register
register()
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.engine.core import EngineCore
print(EngineCore().add_request(NS(request_id="chatcmpl-r1-0")), flush=True)
new = [NS(req_id="r1", prompt_token_ids=[1] * 8, num_computed_tokens=0)]
out = NS(scheduled_new_reqs=new, num_scheduled_tokens={"r1": 8}, total_num_scheduled_tokens=8)
print(GPUModelRunner().execute_model(out), flush=True)
"""


def _fake_vllm(root: Path) -> None:
    for d in ("vllm", "vllm/v1", "vllm/v1/worker", "vllm/v1/engine"):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "__init__.py").write_text("")
    (root / "vllm/v1/worker/gpu_model_runner.py").write_text(FAKE_RUNNER)
    (root / "vllm/v1/engine/core.py").write_text(FAKE_CORE)


def _call(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    _fake_vllm(tmp_path / "site")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CALLER)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("REPLAYER_VLLM")},
            "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}",
            **env,
        },
        check=False,
    )


def test_unarmed_plugin_patches_nothing(tmp_path):
    res = _call(tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["added", "ran"]
    assert "replayer-fault" not in res.stderr


@pytest.mark.parametrize(
    ("rule", "code", "text"),
    [
        ("exit code=7 when request=1", 7, None),
        ("abort node=3 when prompt_tokens>=8", -6, "Memory access fault by GPU node-3"),
    ],
)
def test_armed_plugin_ends_the_process_as_a_gpu_fault_would(tmp_path, rule, code, text):
    admission = tmp_path / "admission.jsonl"
    res = _call(tmp_path, REPLAYER_VLLM_FAULTS=rule, REPLAYER_VLLM_ADMISSION_LOG=str(admission))
    assert res.returncode == code, res.stdout + res.stderr
    assert res.stdout.splitlines() == ["added"]  # the step never ran
    assert "replayer-fault: " in res.stderr
    if text:
        assert text in res.stderr
    (rec,) = [json.loads(x) for x in admission.read_text().splitlines()]
    assert rec["ev"] == "admit" and rec["id"] == "chatcmpl-r1-0"
