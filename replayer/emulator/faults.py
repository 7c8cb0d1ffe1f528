"""Fault rules: parsing ``--fault`` specs and fault files, and deciding when a
rule fires.

A rule is *effect + trigger*. The trigger is a conjunction of conditions over
what the engine sees, a probability and a delay::

    EFFECT [PARAM=VALUE ...] [when COND [and COND ...]] [p=P] [delay=S] [times=N] [name=ID]

(effect parameters and the rule options may also follow the conditions)

    exit code=1 when prompt_tokens>=200000 and cached_tokens>=4096
    hang when running>=4 p=0.25 delay=2
    error when request>=3 times=0 p=0.1

Conditions are ``VAR OP NUMBER`` (``OP`` in ``>= > <= < = == !=``; spaces
around it are allowed). Variables, all measured when the engine receives a
request (or, for ``preemption``, when it preempts one):

=================  ============================================================
``request``        the request's arrival number at the engine (1-based)
``prompt_tokens``  its prompt length in tokens
``cached_tokens``  its prefix-cache hit in tokens
``running``        sequences in the running batch when it arrived
``waiting``        requests in the waiting queue when it arrived
``kv_usage``       KV-cache usage (0..1) when it arrived
``session``        ordinal of its session among distinct sessions seen (0: none)
``turn``           its ordinal within its session (0: no session)
``preemption``     cumulative preemptions; makes the rule fire on preemptions
``abort``          cumulative client aborts (a client that went away before its
                   answer ended); makes the rule fire on aborts, with the
                   aborted request's values (``exit when abort>=1 and
                   cached_tokens>=1024``: a KV connector's crash on abort)
=================  ============================================================

Conditions may also test how the emulator was launched, so that a crash can
need a setting (and ``replayer bisect --vary`` can find which one turns it
off). These are fixed for the process's life:

==========================  =====================================================
``prefix_caching``          1 unless ``--no-enable-prefix-caching``
``chunked_prefill``         1 unless ``--no-enable-chunked-prefill``
``max_num_batched_tokens``  ``--max-num-batched-tokens`` (default 16384)
``max_num_seqs``            ``--max-num-seqs`` (default 1024)
``kv_fp8``                  1 when ``--kv-cache-dtype`` starts with ``fp8``
``enforce_eager``           1 with ``--enforce-eager``
``spec_decode``             1 with ``--speculative-config``
``env.VLLM_NAME``           the variable's value at start-up
==========================  =====================================================

``env.`` conditions read ``VLLM_*`` variables only (the ones vLLM reads;
names are upper-cased). The value may be a number (``env.VLLM_ROCM_USE_AITER=1``;
``true``/``false`` read as 1/0, as vLLM reads its switches) or, with ``=`` and
``!=`` only, a word compared without case (``env.VLLM_ATTENTION_BACKEND=TRITON_MLA``).
An unset variable reads as vLLM's default where :data:`ENV_DEFAULTS` knows it
(``VLLM_ROCM_USE_AITER`` 0; its sub-switches such as ``VLLM_ROCM_USE_AITER_MLA``
1, acting only when ``VLLM_ROCM_USE_AITER=1``), and as 0 otherwise.

A rule without ``when`` holds on every request. Each time a rule's conditions
hold it draws ``U[0,1)`` from its own generator (seeded by ``--seed`` and its
position) and fires if the draw is below ``p``; ``times`` bounds how often it
fires (default 1, 0 = unbounded). The effect starts ``delay`` seconds later, at
the engine's next step.

Effects and their parameters (defaults in brackets):

* ``exit``  [code=0 gpu=<platform> after=<watchdog>]: EngineCore crash log,
  engine dead, then vLLM's shutdown and ``exit(code)`` ``after`` seconds later
  (sooner if a request hits the dead engine). Without ``after``: 1 s, or for
  the 0.32 profile vLLM's watchdog (its next 5 s tick since start-up). ``gpu`` is ``hsa`` (ROCm hard
  fault), ``hip`` (Triton HIP error) or ``cuda``.
* ``dead``  [gpu]: as ``exit`` but the API stays up (``/health`` 503 forever).
* ``unhealthy`` [gpu timeout=none]: vLLM's fault tolerance
  (``--enable-fault-tolerance``): the engine faults but is kept, UNHEALTHY;
  in-flight requests fail, new ones wait (no more tokens), ``/health`` stays
  200 and ``GET /fault_tolerance/status`` says ``unhealthy``; nothing exits.
  After ``timeout`` s without recovery it becomes an ``exit`` (code 0), as
  vLLM's ``engine_recovery_timeout_sec``. Without ``--enable-fault-tolerance``
  it is ``exit``, as in vLLM, where such a fault kills the engine.
* ``hang``  [warn_every=60 timeout=none code=0 api=up]: no more tokens,
  ``/health`` 200; after ``timeout`` s it becomes an ``exit`` with the
  RPC-timeout error. ``api=stall``: the API server's event loop is stuck too
  (a blocking call in it, a frozen process): from then on no endpoint
  answers, ``/health`` included; connections are accepted and left waiting.
* ``cut``   [scope=all kill=0]: open streams (``all``, or just the triggering
  ``request``) are cut mid-body, no ``[DONE]``; ``kill=1`` then SIGKILLs the
  process.
* ``slow``  [factor=10 add=0 duration=none]: step times x ``factor`` plus
  ``add`` seconds per step (``add`` applies even with ``--speed instant``).
* ``error`` : the triggering request fails with vLLM's per-request internal error.

Fault files hold the same rules as JSON (a list, or ``{"faults": [...]}``) or
TOML (``[[fault]]`` tables); each entry is either ``{"spec": "..."}`` or
``{"effect": ..., "when": "..." | [...], "p": ..., "delay": ..., "times": ...,
"name": ..., <effect params>}``.

This module decides *whether* a rule fires; applying effects is the engine's
and the server's job.
"""

from __future__ import annotations

import operator
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from replayer._files import parse_json_or_toml
from replayer.errors import UsageError

REQUEST_VARIABLES = (
    "request",
    "prompt_tokens",
    "cached_tokens",
    "running",
    "waiting",
    "kv_usage",
    "session",
    "turn",
    "preemption",
    "abort",
)
LAUNCH_VARIABLES = (
    "prefix_caching",
    "chunked_prefill",
    "max_num_batched_tokens",
    "max_num_seqs",
    "kv_fp8",
    "enforce_eager",
    "spec_decode",
)
"""Fixed at start-up (see ``EmulatorConfig.launch_values``)."""
ENV_VARIABLE = "env.VLLM_*"
"""Stands for every ``env.VLLM_NAME`` in a list of allowed variables."""
VARIABLES = (*REQUEST_VARIABLES, *LAUNCH_VARIABLES, ENV_VARIABLE)
ENV_DEFAULTS: dict[str, str] = {
    "VLLM_ROCM_USE_AITER": "0",
    "VLLM_ROCM_USE_AITER_PAGED_ATTN": "0",
    "VLLM_ROCM_USE_AITER_LINEAR": "1",
    "VLLM_ROCM_USE_AITER_MOE": "1",
    "VLLM_ROCM_USE_AITER_RMSNORM": "1",
    "VLLM_ROCM_USE_AITER_MLA": "1",
    "VLLM_ROCM_USE_AITER_MHA": "1",
}
"""What vLLM (``vllm/envs.py``) takes for these when unset; other unset
variables read as 0."""
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
}
_OP_RE = r"(>=|<=|==|!=|=|>|<)"
_RULE_KEYS = ("p", "probability", "delay", "times", "name")
GPU_FLAVOURS = ("hsa", "hip", "cuda")


def _bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def _choice(*options: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {v!r}")
        return v

    return parse


# effect -> parameter -> (parser, default)
Effects = Mapping[str, Mapping[str, tuple[Callable[[str], object], object]]]
EFFECTS: dict[str, dict[str, tuple[Callable[[str], object], object]]] = {
    "exit": {"code": (int, 0), "gpu": (_choice(*GPU_FLAVOURS), None), "after": (float, None)},
    "dead": {"gpu": (_choice(*GPU_FLAVOURS), None)},
    "hang": {
        "warn_every": (float, 60.0),
        "timeout": (float, None),
        "code": (int, 0),
        "api": (_choice("up", "stall"), "up"),
    },
    "cut": {"scope": (_choice("all", "request"), "all"), "kill": (_bool, False)},
    "slow": {"factor": (float, 10.0), "add": (float, 0.0), "duration": (float, None)},
    "error": {},
    "unhealthy": {"gpu": (_choice(*GPU_FLAVOURS), None), "timeout": (float, None)},
}


class FaultSpecError(UsageError):
    """A ``--fault`` spec or fault file that cannot be parsed."""


Value = float | str
"""A variable's value: a number, or an ``env.`` variable's text."""


def as_number(value: Value) -> float | None:
    """A value as a number: numeric text, or ``true``/``false`` as vLLM reads
    its switches; None for other text."""
    if not isinstance(value, str):
        return float(value)
    low = value.strip().lower()
    if low in ("true", "false"):
        return float(low == "true")
    try:
        return float(low)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Condition:
    """``var op value``; a text value (``env.`` conditions only) compares
    without case, with ``=``/``==``/``!=`` only."""

    var: str
    op: str
    value: Value

    def holds(self, values: Mapping[str, Value]) -> bool:
        actual = values[self.var]
        if isinstance(self.value, str):
            same = str(actual).lower() == self.value.lower()
            return same if self.op != "!=" else not same
        num = as_number(actual)
        if num is None:  # text is unequal to every number, and unordered
            return self.op == "!="
        return _OPS[self.op](num, self.value)

    def __str__(self) -> str:
        shown = self.value if isinstance(self.value, str) else f"{self.value:g}"
        return f"{self.var}{self.op}{shown}"


def env_values(rules: Sequence[FaultRule], env: Mapping[str, str]) -> dict[str, Value]:
    """The ``env.`` variables ``rules`` name, read from ``env`` (unset: the
    :data:`ENV_DEFAULTS` value, else ``"0"``)."""
    out: dict[str, Value] = {}
    for rule in rules:
        for c in rule.conditions:
            if c.var.startswith("env."):
                name = c.var[4:]
                out[c.var] = env.get(name, ENV_DEFAULTS.get(name, "0"))
    return out


@dataclass(frozen=True, slots=True)
class FaultRule:
    """One parsed rule (see the module docstring for the grammar)."""

    name: str
    """Id in the request log; ``fault<N>`` unless given."""
    effect: str
    """One of :data:`EFFECTS`."""
    params: Mapping[str, object] = field(default_factory=dict)
    """Effect parameters with defaults filled in."""
    conditions: tuple[Condition, ...] = ()
    """All must hold (``and``)."""
    probability: float = 1.0
    """Chance of firing each time the conditions hold."""
    delay: float = 0.0
    """Seconds from the decision to the effect."""
    times: int = 1
    """How often the rule may fire; 0 = unbounded."""

    @property
    def event(self) -> str:
        """``abort`` if a condition is about client aborts, else ``preemption``
        if one is about preemptions, else ``request``."""
        names = {c.var for c in self.conditions}
        return "abort" if "abort" in names else "preemption" if "preemption" in names else "request"

    @property
    def when(self) -> str:
        return " and ".join(map(str, self.conditions)) or "always"

    def num(self, key: str) -> float:
        """A numeric (or boolean) parameter."""
        value = self.params[key]
        if not isinstance(value, int | float):
            raise TypeError(f"{self.name}: parameter {key} is not a number")
        return float(value)

    def opt_num(self, key: str) -> float | None:
        return None if self.params.get(key) is None else self.num(key)

    def text(self, key: str) -> str | None:
        value = self.params.get(key)
        return None if value is None else str(value)


def _fail(where: str, msg: str) -> FaultSpecError:
    return FaultSpecError(f"bad fault {where}: {msg}")


_NUMBER = r"-?[0-9.]+(?:e-?[0-9]+)?"


def _condition(text: str, where: str, variables: Sequence[str] = VARIABLES) -> Condition:
    env = re.fullmatch(rf"(?i:env)\.([A-Za-z0-9_]+){_OP_RE}([A-Za-z0-9_.:+-]+)", text)
    if env and ENV_VARIABLE in variables:
        name, op, raw = env.groups()
        name = name.upper()
        if not name.startswith("VLLM_"):
            raise _fail(where, f"env conditions read VLLM_* variables only, not {name!r}")
        if re.fullmatch(_NUMBER, raw.lower()):
            return Condition(f"env.{name}", op, float(raw))
        if op not in ("=", "==", "!="):
            raise _fail(where, f"{text!r}: a word compares with = or != only")
        return Condition(f"env.{name}", op, raw)
    m = re.fullmatch(rf"([a-z_][a-z0-9_]*){_OP_RE}({_NUMBER})", text.lower())
    if not m:
        raise _fail(where, f"cannot parse condition {text!r} (expected VAR>=NUMBER)")
    var, op, num = m.groups()
    if var not in variables:
        raise _fail(where, f"unknown variable {var!r}; have {', '.join(variables)}")
    try:
        value = float(num)
    except ValueError:
        raise _fail(where, f"not a number in {text!r}") from None
    return Condition(var, op, value)


def _build(
    where: str,
    effect: str,
    raw_params: Mapping[str, str],
    conditions: Sequence[Condition],
    options: Mapping[str, str],
    index: int,
    effects: Effects = EFFECTS,
) -> FaultRule:
    if effect not in effects:
        raise _fail(where, f"unknown effect {effect!r}; have {', '.join(effects)}")
    spec = effects[effect]
    params: dict[str, object] = {k: default for k, (_, default) in spec.items()}
    for key, value in raw_params.items():
        if key not in spec:
            have = ", ".join(spec) or "none"
            raise _fail(where, f"unknown parameter {key!r} for {effect} (have {have})")
        try:
            params[key] = spec[key][0](value)
        except ValueError as exc:
            raise _fail(where, f"{key}: {exc}") from None
    try:
        p = float(options.get("p", options.get("probability", "1")))
        delay = float(options.get("delay", "0"))
        times = int(options.get("times", "1"))
    except ValueError as exc:
        raise _fail(where, str(exc)) from None
    if not 0 <= p <= 1:
        raise _fail(where, "p must be in [0, 1]")
    if delay < 0 or times < 0:
        raise _fail(where, "delay and times must be >= 0")
    return FaultRule(
        name=options.get("name", f"fault{index}"),
        effect=effect,
        params=params,
        conditions=tuple(conditions),
        probability=p,
        delay=delay,
        times=times,
    )


def parse_spec(
    text: str,
    index: int = 0,
    *,
    variables: Sequence[str] = VARIABLES,
    effects: Effects = EFFECTS,
) -> FaultRule:
    """Parse one ``--fault`` string (``variables`` and ``effects``: another
    dialect of the grammar, e.g. the real-vLLM plugin's)."""
    where = f"spec {text!r}"
    words = re.sub(rf"\s*{_OP_RE}\s*", r"\1", text.strip()).split()
    if not words:
        raise _fail(where, "empty")
    effect = words[0].lower()
    params: dict[str, str] = {}
    options: dict[str, str] = {}
    conditions: list[Condition] = []
    in_when = False
    want_cond = False
    for word in words[1:]:
        low = word.lower()
        if low == "when":
            if in_when:
                raise _fail(where, "'when' appears twice")
            in_when = want_cond = True
            continue
        if low == "and":
            if not in_when or want_cond:
                raise _fail(where, "'and' must join two conditions")
            want_cond = True
            continue
        key, sep, value = word.partition("=")
        if sep and key.lower() in _RULE_KEYS and not value.startswith("="):
            options["p" if key.lower() == "probability" else key.lower()] = value
            continue
        if sep and key.lower() in effects.get(effect, {}) and not value.startswith("="):
            params[key.lower()] = value  # effect parameters may follow the conditions
            continue
        if in_when:
            if not want_cond:
                raise _fail(where, f"expected 'and' before {word!r}")
            if low == "always":
                want_cond = False
                continue
            conditions.append(_condition(word, where, variables))
            want_cond = False
            continue
        if not sep:
            raise _fail(where, f"expected PARAM=VALUE or 'when', got {word!r}")
        params[key.lower()] = value
    if in_when and want_cond:
        raise _fail(where, "a condition must follow 'when'/'and'")
    return _build(where, effect, params, conditions, options, index, effects)


def parse_mapping(entry: object, index: int, where: str) -> FaultRule:
    """Parse one entry of a fault file."""
    if not isinstance(entry, Mapping):
        raise _fail(where, "each fault must be a table/object")
    if "spec" in entry:
        rule = parse_spec(str(entry["spec"]), index)
        return rule if "name" not in entry else _renamed(rule, str(entry["name"]))
    data = dict(entry)
    effect = str(data.pop("effect", "")).lower()
    if not effect:
        raise _fail(where, "missing 'effect'")
    when = data.pop("when", [])
    clauses = [when] if isinstance(when, str) else list(when) if isinstance(when, list) else None
    if clauses is None:
        raise _fail(where, "'when' must be a string or a list of strings")
    conds: list[Condition] = []
    for clause in clauses:
        for part in re.split(r"\s+and\s+", str(clause).strip()):
            part = re.sub(rf"\s*{_OP_RE}\s*", r"\1", part)
            if part and part.lower() != "always":
                conds.append(_condition(part, where))
    options = {k: _text(data.pop(k)) for k in _RULE_KEYS if k in data}
    if "probability" in options:
        options["p"] = options.pop("probability")
    nested = data.pop("params", {})
    if not isinstance(nested, Mapping):
        raise _fail(where, "'params' must be a table/object")
    params = {str(k): _text(v) for k, v in {**nested, **data}.items()}
    return _build(where, effect, params, conds, options, index)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _renamed(rule: FaultRule, name: str) -> FaultRule:
    return FaultRule(
        name, rule.effect, rule.params, rule.conditions, rule.probability, rule.delay, rule.times
    )


def load_file(path: Path, first_index: int = 0) -> list[FaultRule]:
    """Rules from a JSON or TOML file (chosen by suffix; JSON is tried first
    for other suffixes)."""
    where = f"file {path}"
    try:
        text = path.read_text()
    except OSError as exc:
        raise _fail(where, exc.strerror or str(exc)) from None
    try:
        data = parse_json_or_toml(path, text)
    except ValueError as exc:
        raise _fail(where, str(exc)) from None
    if isinstance(data, Mapping):
        data = data.get("faults", data.get("fault", []))
    if not isinstance(data, list):
        raise _fail(where, "expected a list of faults, {'faults': [...]} or [[fault]] tables")
    return [parse_mapping(e, first_index + i, f"{where}[{i}]") for i, e in enumerate(data)]


def load_rules(specs: Sequence[str], files: Sequence[Path] = ()) -> list[FaultRule]:
    """Specs first, then files; rules are numbered in that order."""
    rules = [parse_spec(s, i) for i, s in enumerate(specs)]
    for path in files:
        rules.extend(load_file(path, len(rules)))
    names = [r.name for r in rules]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise FaultSpecError(f"bad fault rules: duplicate name(s) {', '.join(sorted(dup))}")
    return rules


@dataclass(frozen=True, slots=True)
class Decision:
    """One evaluation of one rule at one event (a request-log line)."""

    index: int
    rule: FaultRule
    holds: bool
    """Whether every condition held."""
    draw: float | None
    """The random draw, made only when the conditions held and p < 1."""
    fired: bool
    values: dict[str, Value]
    """The values of the variables the rule's conditions name."""


class FaultPlan:
    """The rules plus their mutable state (fire counts, random generators).

    Usage::

        plan = FaultPlan(load_rules(["exit when request=3"]), seed=0)
        for d in plan.evaluate("request", values):
            if d.fired: ...
    """

    def __init__(self, rules: Sequence[FaultRule], seed: int = 0) -> None:
        self.rules = list(rules)
        self._rngs = [random.Random(f"{seed}:{i}:{r.name}") for i, r in enumerate(self.rules)]
        self._fired = [0] * len(self.rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def fired(self, index: int) -> int:
        return self._fired[index]

    def evaluate(self, event: str, values: Mapping[str, Value]) -> list[Decision]:
        """Evaluate every live rule that listens to ``event``."""
        out: list[Decision] = []
        for i, rule in enumerate(self.rules):
            if rule.event != event or (rule.times and self._fired[i] >= rule.times):
                continue
            holds = all(c.holds(values) for c in rule.conditions)
            draw: float | None = None
            fired = holds
            if holds and rule.probability < 1:
                draw = self._rngs[i].random()
                fired = draw < rule.probability
            if fired:
                self._fired[i] += 1
            seen = {c.var: values[c.var] for c in rule.conditions}
            out.append(Decision(i, rule, holds, draw, fired, seen))
        return out
