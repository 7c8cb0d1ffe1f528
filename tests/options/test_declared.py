"""Every declared value object: built from strings as the CLI and the service
give them, refusing what its fields cannot take in one error style, and with
the CLI's defaults generated from the same declaration."""

from __future__ import annotations

import enum
import typing

import pytest

from replayer import options
from replayer._declare import specs
from replayer.cli import build_parser
from replayer.cli.args import build
from replayer.errors import OptionError, ReplayerError

pytestmark = pytest.mark.inprocess

CLASSES = sorted({c for cs in options.VERBS.values() for c in cs}, key=lambda c: c.__name__)
ENUM_FIELDS = [
    (cls, s)
    for cls in CLASSES
    for s in specs(cls)
    if any(
        isinstance(a, type) and issubclass(a, enum.Enum)
        for a in typing.get_args(s.type) or [s.type]
    )
]
MINIMAL = {
    "replay": ["t.arrow", "--launch", "x"],
    "check": ["t.arrow", "--url", "http://h:1"],
    "bisect": ["t.arrow", "--out", "d", "--launch", "x"],
    "verify": ["bundle", "verify", "b", "--launch", "x"],
    "soak": ["t.arrow", "--launch", "x"],
    "sweep": ["t.arrow", "--target", "http://h:1", "--max-inflight", "1,2", "--out", "d"],
    "compare": ["r"],
    "inspect": ["t.arrow"],
    "export": ["t.arrow", "-o", "x.jsonl"],
    "synth": ["-o", "x.arrow"],
    "record": ["--upstream", "http://h:1", "-o", "t.arrow"],
    "serve": ["--data", "d"],
}
"""The least command line of each verb (its required options given)."""

GIVEN = {"target", "url", "launch", "limits", "upstream", "data"}
"""Options the minimal command lines above give (their defaults are not the CLI's)."""


def _argv(verb: str) -> list[str]:
    args = MINIMAL[verb]
    return args if verb == "verify" else [verb, *args]


@pytest.mark.parametrize(
    "cls,spec", ENUM_FIELDS, ids=[f"{c.__name__}.{s.name}" for c, s in ENUM_FIELDS]
)
def test_an_enum_field_coerces_its_strings_and_refuses_others(cls, spec):
    enum_type = next(
        a for a in typing.get_args(spec.type) or [spec.type] if isinstance(a, type)
        and issubclass(a, enum.Enum)
    )  # fmt: skip
    values = [m.value for m in enum_type]
    for v in values:
        got = getattr(_with(cls, spec.name, v), spec.name)
        assert got is enum_type(v) and isinstance(got, enum_type)
    with pytest.raises(ReplayerError) as err:
        _with(cls, spec.name, "no-such-value")
    assert isinstance(err.value, OptionError)
    assert str(err.value) == f"{spec.name} 'no-such-value': want one of {', '.join(values)}"


def _with(cls, name, value):
    """``cls`` with ``name`` set, its required options given."""
    required = {s.name: _a_value(s) for s in specs(cls) if s.meta.required and s.name != name}
    return cls(**{**_required(cls), **required, name: value})


def _a_value(spec):
    return {"limits": "1,2", "upstream": "http://h:1", "data": "d"}.get(spec.name, "x")


def _required(cls):
    """What ``cls`` needs beyond its defaults to be built at all."""
    return {"url": "http://h:1"} if cls is options.Server else {}


@pytest.mark.parametrize("verb", sorted(MINIMAL))
def test_the_clis_defaults_are_the_declarations(verb):
    """Walk every option a verb takes: what the command line builds when the
    option is not given equals the value object's own default, field by field."""
    p = build_parser(full=True)
    args = p.parse_args(_argv(verb))
    walked = 0
    for cls in options.VERBS[verb]:
        built = build(cls, args, verb)
        for s in options.exposed(cls, verb):
            if s.name in GIVEN:
                continue
            assert getattr(built, s.name) == s.default, (verb, cls.__name__, s.name)
            walked += 1
        # the whole object too: the library's, given only what the command line gave
        plain = cls(**{s.name: getattr(built, s.name) for s in specs(cls) if s.name in GIVEN})
        assert built == plain, (verb, cls.__name__)
    assert walked == len([n for n in options.options_of(verb) if n not in GIVEN])


def test_every_exposed_option_has_help_and_a_flag_of_its_own():
    for verb in options.VERBS:
        seen: dict[str, str] = {}
        for s in options.options_of(verb).values():
            assert s.help, (verb, s.name)
            assert s.spelling.startswith("--"), (verb, s.name)
            assert seen.setdefault(s.spelling, s.name) == s.name, (verb, s.spelling)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: options.ReplayPolicy(speed=0), "speed must be positive"),
        (lambda: options.ReplayPolicy(max_inflight=0), "max_inflight must be at least 1"),
        (
            lambda: options.ReplayPolicy(token_range="5:3"),
            "token_range wants 0 <= LO < HI, not 5:3",
        ),
        (lambda: options.ReplayPolicy(workers=0), "workers must be 'auto' or at least 1"),
        (lambda: options.ReplayPolicy(body_cache_mb=-1), "body_cache_mb must not be negative"),
        (lambda: options.ReplayPolicy(speed=True), "speed True: want a finite number"),
        (lambda: options.ReplayPolicy(request_timeout=float("nan")), "request_timeout nan: want"),
        (lambda: options.WatchConfig(settle=-1), "settle must not be negative"),
        (lambda: options.WatchConfig(scrape=("ftp://x",)), "scrape 'ftp://x': want an http(s) URL"),
        (lambda: options.Selection(limit=-1), "limit must not be negative"),
        (lambda: options.BisectOptions(alpha=1), "alpha must be between 0 and 1"),
        (lambda: options.BisectOptions(max_time="soon"), "max_time want seconds or 30m/2h/1d"),
        (lambda: options.BisectOptions(stages="cut,nope"), "stages names unknown stage(s) nope"),
        (lambda: options.CheckOptions(also_interesting=2), "also_interesting must be between 3"),
        (lambda: options.Server(), "launch or url is required"),
        (lambda: options.Server(launch="a", restart_cmd="b"), "launch and restart_cmd are"),
        (lambda: options.ControlOptions(control_key="env:K"), "control_key needs control"),
        (lambda: options.SynthOptions(api="messages", payload="blocks"), "api messages needs chat"),
        (lambda: options.RecordOptions(), "upstream is required"),
        (lambda: options.SweepOptions(limits="4,4"), "limits wants two or more distinct values"),
        (lambda: options.ServeOptions(data="d", port=70000), "port must be between 0 and 65535"),
    ],
)
def test_value_objects_refuse_bad_values_when_built(make, message):
    with pytest.raises(OptionError) as err:
        make()
    assert str(err.value).startswith(message)


def test_strings_become_the_types_their_fields_declare():
    p = options.ReplayPolicy(
        timing="gaps", order="admitted", speed="7", max_inflight="4", token_range="1:9",
        workers="2", session_header="none", force_stream="false",
    )  # fmt: skip
    assert (p.timing, p.order, p.speed, p.max_inflight) == (
        options.Timing.GAPS,
        options.Order.ADMITTED,
        7.0,
        4,
    )
    assert (p.token_range, p.workers, p.session_header, p.force_stream) == ((1, 9), 2, None, False)
    b = options.BisectOptions(stages="cut,prefix", max_time="2h", calibrate_matches=3)
    assert (b.stages, b.max_time) == (("cut", "prefix"), 7200.0)
    assert options.WatchConfig(scrape=["http://a"]).scrape == ("http://a",)


def test_to_dict_round_trips_and_keeps_secrets_out():
    p = options.ReplayPolicy(timing="gaps", order="admitted", speed=7, token_range=(3, 99))
    assert options.ReplayPolicy(**p.to_dict()) == p
    s = options.Server(launch="vllm serve x", api_key="sk-secret", env={"A": "1"})
    assert "api_key" not in s.to_dict() and "env" not in s.to_dict()
    assert "sk-secret" not in repr(s)
