"""Fault rules: the spec grammar, fault files, and when a rule fires."""

from __future__ import annotations

import json
import random

import pytest

from replayer.emulator.faults import (
    Condition,
    FaultPlan,
    FaultSpecError,
    load_file,
    load_rules,
    parse_spec,
)


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
    with pytest.raises(FaultSpecError, match="not JSON or TOML"):
        load_file(bad)
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
