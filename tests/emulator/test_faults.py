"""Fault rules: the spec grammar, fault files, and when a rule fires."""

from __future__ import annotations

import json
import random
import re

import pytest

from replayer.emulator.faults import (
    Condition,
    FaultPlan,
    FaultSpecError,
    env_values,
    load_file,
    load_rules,
    parse_spec,
)
from tests.helpers.engine import add, make

pytestmark = pytest.mark.inprocess


def test_spec_with_conditions_params_and_options():
    r = parse_spec("exit code=1 gpu=cuda when request=3 and running >= 2 p=0.5 delay=1.5", 4)
    assert r.name == "fault4" and r.effect == "exit"
    assert dict(r.params) == {"code": 1, "gpu": "cuda", "after": None}  # None: per profile
    assert r.conditions == (Condition("request", "=", 3), Condition("running", ">=", 2))
    assert (r.probability, r.delay, r.times, r.event) == (0.5, 1.5, 1, "request")
    assert r.when == "request=3 and running>=2"


def test_params_may_follow_the_conditions():
    r = parse_spec("exit when request=2 after=0.25 code=7 name=late times=0")
    assert r.num("after") == 0.25 and r.num("code") == 7 and r.name == "late" and r.times == 0


def test_defaults_and_no_condition():
    r = parse_spec("hang")
    assert r.conditions == () and r.when == "always"
    assert dict(r.params) == {"warn_every": 60.0, "timeout": None, "code": 0, "api": "up"}
    assert parse_spec("cut kill=1").num("kill") == 1.0
    assert parse_spec("slow factor=3 when kv_usage>=0.5").conditions[0].value == 0.5


def test_preemption_conditions_make_a_preemption_rule():
    assert parse_spec("dead when preemption>=1").event == "preemption"
    assert parse_spec("dead when preemption>=1 and prompt_tokens>=10").event == "preemption"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("boom", "unknown effect 'boom'; have exit, dead, hang, cut, slow, error"),
        ("exit when colour>=1", "unknown variable 'colour'"),
        ("exit speed=3", "unknown parameter 'speed' for exit (have code, gpu, after)"),
        ("exit gpu=tpu", "gpu: expected one of hsa, hip, cuda, got 'tpu'"),
        ("exit when request=1 running>=2", "expected 'and' before 'running>=2'"),
        ("exit when", "a condition must follow 'when'/'and'"),
        ("exit when request=1 and", "a condition must follow 'when'/'and'"),
        ("exit and request=1", "'and' must join two conditions"),
        ("exit p=2", "p must be in [0, 1]"),
        ("exit when request", "cannot parse condition 'request'"),
        ("error nonsense", "expected PARAM=VALUE or 'when', got 'nonsense'"),
        ("", "empty"),
    ],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(FaultSpecError) as err:
        parse_spec(spec)
    assert str(err.value) == f"bad fault spec {spec!r}: {message}" or message in str(err.value)
    assert "\n" not in str(err.value)


def test_json_and_toml_files_match_the_spec_form(tmp_path):
    spec = parse_spec("exit code=2 when prompt_tokens>=100 and cached_tokens>=16 p=0.25 delay=1")
    j = tmp_path / "f.json"
    j.write_text(
        json.dumps(
            {
                "faults": [
                    {
                        "effect": "exit",
                        "code": 2,
                        "when": "prompt_tokens >= 100 and cached_tokens>=16",
                        "p": 0.25,
                        "delay": 1,
                    },
                    {"spec": "hang when session=2", "name": "h"},
                ]
            }
        )
    )
    t = tmp_path / "f.toml"
    t.write_text(
        '[[fault]]\neffect = "exit"\nwhen = ["prompt_tokens>=100", "cached_tokens>=16"]\n'
        "p = 0.25\ndelay = 1\n[fault.params]\ncode = 2\n"
    )
    a, b = load_file(j)
    (c,) = load_file(t)
    for r in (a, c):
        assert (r.effect, dict(r.params), r.conditions, r.probability, r.delay) == (
            spec.effect,
            dict(spec.params),
            spec.conditions,
            spec.probability,
            spec.delay,
        )
    assert b.name == "h" and b.effect == "hang"


def test_bad_files_and_duplicate_names(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json or toml")
    with pytest.raises(FaultSpecError, match=r"bad\.json: not JSON \("):
        load_file(bad)  # a .json file is read as JSON only
    other = tmp_path / "bad.rules"
    other.write_text("{not json or toml")
    with pytest.raises(FaultSpecError, match="not JSON or TOML"):
        load_file(other)
    with pytest.raises(FaultSpecError, match="missing 'effect'"):
        (tmp_path / "e.json").write_text('[{"when": "request=1"}]')
        load_file(tmp_path / "e.json")
    with pytest.raises(FaultSpecError, match="duplicate name"):
        load_rules(["exit name=a", "hang name=a"])
    with pytest.raises(FaultSpecError, match="No such file"):
        load_file(tmp_path / "missing.toml")


def values(**kw):
    base = dict(
        request=1,
        prompt_tokens=0,
        cached_tokens=0,
        running=0,
        waiting=0,
        kv_usage=0.0,
        session=0,
        turn=0,
        preemption=0,
    )
    return base | kw


def test_fires_the_first_time_the_conditions_hold_then_stops():
    plan = FaultPlan([parse_spec("error when prompt_tokens>=100 and running>=1")])
    seen = [
        plan.evaluate("request", values(request=n, prompt_tokens=p, running=r))
        for n, p, r in [(1, 50, 3), (2, 150, 0), (3, 150, 1), (4, 200, 2)]
    ]
    assert [[(d.holds, d.fired) for d in ds] for ds in seen] == [
        [(False, False)],
        [(False, False)],
        [(True, True)],
        [],  # times=1: the rule is spent
    ]
    assert seen[2][0].values == {"prompt_tokens": 150, "running": 1}
    assert seen[2][0].draw is None


def test_unbounded_rules_keep_firing_and_events_are_separate():
    plan = FaultPlan([parse_spec("error times=0"), parse_spec("dead when preemption>=2")])
    assert [d.index for d in plan.evaluate("request", values())] == [0]
    assert [d.index for d in plan.evaluate("request", values(request=2))] == [0]
    assert plan.fired(0) == 2
    (d,) = plan.evaluate("preemption", values(preemption=1))
    assert (d.index, d.fired) == (1, False)
    (d,) = plan.evaluate("preemption", values(preemption=2))
    assert d.fired


def test_probability_draws_are_seeded_and_logged():
    def run(seed):
        plan = FaultPlan([parse_spec("error p=0.3 times=0 name=flaky")], seed=seed)
        return [plan.evaluate("request", values(request=n))[0] for n in range(1, 40)]

    a, b, c = run(7), run(7), run(8)
    assert [d.draw for d in a] == [d.draw for d in b] != [d.draw for d in c]
    assert all(d.fired == (d.draw < 0.3) for d in a)
    assert 0 < sum(d.fired for d in a) < len(a)
    # The documented seeding: rule i's generator is Random(f"{seed}:{i}:{name}").
    rng = random.Random("7:0:flaky")
    assert [d.draw for d in a] == [rng.random() for _ in a]


# -- launch settings and environment (issue 16: what makes it go away) -------------------


def test_launch_and_env_conditions_parse(tmp_path):
    r = parse_spec(
        "exit when prefix_caching=1 and max_num_batched_tokens>=8192 and kv_fp8=0 "
        "and env.vllm_rocm_use_aiter_mla = 1 and env.VLLM_ATTENTION_BACKEND!=triton_mla"
    )
    assert r.conditions == (
        Condition("prefix_caching", "=", 1),
        Condition("max_num_batched_tokens", ">=", 8192),
        Condition("kv_fp8", "=", 0),
        Condition("env.VLLM_ROCM_USE_AITER_MLA", "=", 1),
        Condition("env.VLLM_ATTENTION_BACKEND", "!=", "triton_mla"),
    )
    assert r.when.endswith(
        "env.VLLM_ROCM_USE_AITER_MLA=1 and env.VLLM_ATTENTION_BACKEND!=triton_mla"
    )
    f = tmp_path / "f.toml"
    f.write_text('[[fault]]\neffect = "exit"\nwhen = "env.VLLM_X=1 and kv_fp8=1"\n')
    (c,) = load_file(f)
    assert c.conditions == (Condition("env.VLLM_X", "=", 1), Condition("kv_fp8", "=", 1))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("exit when env.HOME=1", "env conditions read VLLM_* variables only, not 'HOME'"),
        ("exit when env.VLLM_X>=abc", "a word compares with = or != only"),
        ("exit when enforce_eager=yes", "cannot parse condition 'enforce_eager=yes'"),
    ],
)
def test_bad_launch_and_env_conditions(spec, message):
    with pytest.raises(FaultSpecError, match=re.escape(message)):
        parse_spec(spec)


def test_env_values_read_vllm_defaults_when_unset():
    rules = [
        parse_spec("exit when env.VLLM_ROCM_USE_AITER_MLA=1 and env.VLLM_ROCM_USE_AITER=1"),
        parse_spec("hang when env.VLLM_ATTENTION_BACKEND=TRITON_ATTN"),
    ]
    assert env_values(rules, {}) == {
        "env.VLLM_ROCM_USE_AITER_MLA": "1",  # vLLM's default: on (acting under AITER=1)
        "env.VLLM_ROCM_USE_AITER": "0",
        "env.VLLM_ATTENTION_BACKEND": "0",  # not in the table: unset reads as 0
    }
    assert env_values(rules, {"VLLM_ROCM_USE_AITER": "true"})["env.VLLM_ROCM_USE_AITER"] == "true"


@pytest.mark.parametrize(
    ("cond", "value", "holds"),
    [
        (Condition("env.X", "=", 1), "1", True),
        (Condition("env.X", "=", 1), "True", True),  # vLLM's switches read true as 1
        (Condition("env.X", "=", 1), "0", False),
        (Condition("env.X", "!=", 1), "TRITON_ATTN", True),  # text is no number
        (Condition("env.X", ">=", 1), "TRITON_ATTN", False),
        (Condition("env.X", "=", "triton_attn"), "TRITON_ATTN", True),  # words: no case
        (Condition("env.X", "!=", "triton_attn"), "ROCM_ATTN", True),
        (Condition("env.X", "=", "triton_attn"), "0", False),
    ],
)
def test_env_conditions_compare_numbers_and_words(cond, value, holds):
    assert cond.holds({"env.X": value}) is holds


def test_every_flag_the_default_variants_touch_parses_and_reaches_the_conditions():
    import argparse

    from replayer.emulator.config import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)

    def cfg(*argv, **env):
        return config_from_args(p.parse_args(list(argv)), env)

    base = cfg().launch_values()
    assert base == {
        "prefix_caching": 1.0,
        "chunked_prefill": 1.0,
        "max_num_batched_tokens": 16384.0,
        "max_num_seqs": 1024.0,
        "kv_fp8": 0.0,
        "enforce_eager": 0.0,
        "spec_decode": 0.0,
    }
    varied = cfg(
        "--no-enable-prefix-caching",
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "4096",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--enforce-eager",
        "--speculative-config",
        '{"method": "mtp", "num_speculative_tokens": 1}',
    ).launch_values()
    assert varied == {
        "prefix_caching": 0.0,
        "chunked_prefill": 0.0,
        "max_num_batched_tokens": 4096.0,
        "max_num_seqs": 1024.0,
        "kv_fp8": 1.0,
        "enforce_eager": 1.0,
        "spec_decode": 1.0,
    }
    assert cfg("--enable-prefix-caching", "--no-enforce-eager").launch_values() == base
    assert cfg(VLLM_ROCM_USE_AITER_MLA="0").env == {"VLLM_ROCM_USE_AITER_MLA": "0"}


def test_the_engine_tests_launch_settings_and_environment():
    def errors(faults, **cfg):
        e = make(faults, **cfg)
        req = add(e, list(range(64)))
        e.step()
        return req.error is not None

    env_rule = ["error when env.VLLM_ROCM_USE_AITER_MLA=1 and env.VLLM_ROCM_USE_AITER=1"]
    assert not errors(env_rule)  # AITER is off by default
    assert errors(env_rule, env={"VLLM_ROCM_USE_AITER": "1"})  # its MLA switch defaults on
    assert not errors(env_rule, env={"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "0"})
    cache_rule = ["error when prefix_caching=1 and chunked_prefill=1 and enforce_eager=0"]
    assert errors(cache_rule)
    assert not errors(cache_rule, enable_prefix_caching=False)
    assert not errors(cache_rule, enable_chunked_prefill=False)
    assert not errors(cache_rule, enforce_eager=True)
    assert errors(
        ["error when spec_decode=1 and kv_fp8=1"], speculative_config="{}", kv_cache_dtype="fp8"
    )
    assert not errors(["error when spec_decode=1"])


def test_without_chunked_prefill_a_prompt_waits_for_room_for_all_of_it():
    for chunked, first_step in [(True, [(1, 100), (2, 28)]), (False, [(1, 100)])]:
        e = make(max_num_batched_tokens=128, enable_chunked_prefill=chunked)
        add(e, list(range(100)))
        add(e, [9] * 100)
        assert [(r.n, n) for r, n in e.step()] == first_step, chunked
    e = make(max_num_batched_tokens=64, enable_chunked_prefill=False)
    add(e, list(range(100)))  # longer than any step: prefilled alone, whole
    assert [(r.n, n) for r, n in e.step()] == [(1, 100)]
