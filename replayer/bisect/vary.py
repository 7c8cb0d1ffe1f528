"""What makes a crash go away: the minimal repro replayed under server variants.

A *variant* changes how the server is launched: arguments added
(``--enforce-eager``) or removed (``--speculative-config``), environment set
(``VLLM_ROCM_USE_AITER_MLA=0``) or unset. Each runs the repro ``runs`` times;
the unmodified launch is the control row, and the reading says which setting
the crash needs ("needs a prefix-cache hit; gone with VLLM_ROCM_USE_AITER_MLA=0"):
the first question a kernel team asks, answered before they ask it.

**Sources** (``--vary``, repeatable): a TOML file of ``[[variant]]`` tables or
a JSON list of the same objects, with keys ``name``, ``add`` (arguments),
``remove`` (flags), ``env`` (``{NAME = "value"}``), ``unset_env`` (names),
``aborts`` (``"complete"`` or ``"replay"``: the replay's ``--aborts``, a
client-side change the launch may not need) and ``means`` (what "gone"
says in the reading); ``default`` for the shipped list
(:func:`default_variants`); ``default:NAME,NAME`` for some of it.

**Applying** (:func:`apply`) edits the launch command as
:func:`~replayer.target.process.split_command` reads it (leading
``NAME=value`` words are environment). A flag is matched in its ``--flag
value`` and ``--flag=value`` forms, ``_`` and ``-`` alike; it takes the next
word as its value unless that starts with ``-`` or the flag is a switch
(``--no-*``, ``--enable-*``, ``--disable-*``, ``--enforce-eager``, ...).
Adding an option first drops the launch's own occurrences of it (and of its
``--no-`` opposite); removing drops every form. An unset variable leaves the
``NAME=value`` words, and when replayer's own environment (which the server
inherits) has it, the command starts ``env -u NAME``.

**Skipped**, with the reason: a variant that would leave the launch as it is
(the argument is already there, the flag to remove is not, the variable
already has that value, counting vLLM's defaults of :data:`VLLM_ENV_DEFAULTS`;
an ``aborts`` variant when the replay already runs so, or when no request of
the repro was abandoned by its client);
a variant touching ``VLLM_ROCM_*`` when the launch does not look like ROCm
(no ``VLLM_ROCM_*``, ``ROCM_*``, ``HIP_*``, ``HSA_*`` or ``AITER*`` variable in
its environment or replayer's, and no ``/dev/kfd``, the ROCm driver's device).

**Verdicts** (:func:`verdict`), against the control's 95% Wilson interval:
``gone`` (no crash at all, and the upper bound of its rate is below the
control's lower bound: too few runs cannot say gone), ``rarer`` (crashes, with
the same separation), ``crashes``, ``quiet`` (no crash, too few runs to tell),
``fails differently`` (another failure, not the chased one), ``did not start``
(two launches in a row failed), ``not exercised`` (its runs' requests were
mostly rejected) and ``skipped``.

**Settled early**: a variant that has crashed stops as soon as no outcome
of its remaining runs could make it ``rarer`` (:func:`settled`). Each crash
costs a restart, a model load on the servers this is for; "still crashes"
needs one, not five.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from replayer._files import (
    ENV_NAME,
    append_records,
    load_entries,
    named_entry,
    read_jsonl,
    shipped_named,
)
from replayer.bisect.confirm import confirm_counts
from replayer.bisect.files import VARIANTS
from replayer.bisect.stats import rate_dict
from replayer.emulator.faults import ENV_DEFAULTS
from replayer.errors import UsageError
from replayer.replay.aborts import abort_points
from replayer.replay.policy import Aborts, ReplayPolicy, Timing
from replayer.session import Chase, Outcome, Session
from replayer.target.facts import redact_command
from replayer.target.process import split_command

if TYPE_CHECKING:
    from replayer.bisect.state import Search
    from replayer.trace.reader import Trace

DEFAULT_RUNS = 5
CONTROL = "unmodified"
"""The control row's name (reserved)."""
VLLM_DEFAULT_BATCHED_TOKENS = 8192
"""vLLM's ``--max-num-batched-tokens`` for ``vllm serve`` on a GPU of 70 GiB
or more (H100, MI300X and up; ``vllm/engine/arg_utils.py``): the base of the
halved and doubled variants when the launch sets none."""
VLLM_ENV_DEFAULTS = ENV_DEFAULTS
"""What vLLM takes for these when unset (``vllm/envs.py``): the emulator's
fault conditions read unset variables the same way, from the same table."""
ROCM_ENV_PREFIXES = ("VLLM_ROCM_", "ROCM_", "HIP_", "HSA_", "AITER")
ROCM_DEVICE = Path("/dev/kfd")
SWITCHES = frozenset({"--enforce-eager", "--trust-remote-code", "--async-scheduling"})
"""Flags that take no value, besides ``--no-*``, ``--enable-*`` and ``--disable-*``."""
_KEYS = ("name", "add", "remove", "env", "unset_env", "aborts", "means")
_NUMBER = re.compile(r"^-?[0-9.]+$")


@dataclass(frozen=True, slots=True)
class Variant:
    """One change to the launch (see the module docstring).

    Usage::

        v = Variant("no-prefix-caching", add=("--no-enable-prefix-caching",))
        applied = apply(v, Launch.parse("vllm serve m --port 8000"))
    """

    name: str
    add: tuple[str, ...] = ()
    """Arguments appended (an option's earlier occurrences dropped first)."""
    remove: tuple[str, ...] = ()
    """Flags dropped in every form."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables set."""
    unset_env: tuple[str, ...] = ()
    """Variables unset."""
    means: str | None = None
    """What "gone" says in the reading (default: ``gone with <change>``)."""
    note: str | None = None
    """Where a shipped variant's value came from (``half of vLLM's default ...``)."""
    skip: str | None = None
    """Decided when the shipped list is built: why it does not apply."""
    aborts: Aborts | None = None
    """The replay's ``--aborts`` for this variant's runs (a client-side
    change: the launch may stay as it is)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """A launch command, split, with what the server will inherit."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    """The command's leading ``NAME=value`` words."""
    inherited: Mapping[str, str]
    """Replayer's own environment, which the launched server inherits."""
    rocm: bool
    """Whether it looks like a ROCm launch (see the module docstring)."""

    @classmethod
    def parse(
        cls, cmd: str, environ: Mapping[str, str] | None = None, rocm: bool | None = None
    ) -> Launch:
        argv, env = split_command(cmd)
        if Path(argv[0]).name in ("sh", "bash", "dash", "zsh") and "-c" in argv:
            raise UsageError(
                "--vary cannot change the arguments of a command run through a shell "
                "(sh -c '...'): give --launch the server command itself"
            )
        inherited = dict(os.environ if environ is None else environ)
        if rocm is None:
            names = [*env, *inherited]
            rocm = any(n.startswith(ROCM_ENV_PREFIXES) for n in names) or ROCM_DEVICE.exists()
        return cls(tuple(argv), env, inherited, rocm)

    def value(self, flag: str) -> str | None:
        """The value of ``flag``'s last occurrence (``""`` for a switch), or None."""
        found = _occurrences(self.argv, flag)
        return found[-1][2] if found else None

    def getenv(self, name: str) -> tuple[str | None, str]:
        """``name``'s value for the server and where it comes from."""
        if name in self.env:
            return self.env[name], "the launch"
        if name in self.inherited:
            return self.inherited[name], "replayer's environment"
        if name in VLLM_ENV_DEFAULTS:
            return VLLM_ENV_DEFAULTS[name], "vLLM's default"
        return None, "unset"


@dataclass(frozen=True, slots=True)
class Applied:
    """A variant against one launch: the command to run, or why not."""

    variant: Variant
    launch: str | None
    """The variant's launch command; None when skipped."""
    change: str
    """What changed, for people: ``--no-enable-prefix-caching, VLLM_X=0``."""
    skipped: str | None = None


@dataclass(frozen=True, slots=True)
class VaryPlan:
    """The variants to run against a launch, each ``runs`` times."""

    launch: Launch
    command: str
    """The unmodified launch command (the control row)."""
    variants: tuple[Applied, ...]
    runs: int = DEFAULT_RUNS


# -- flags ----------------------------------------------------------------------------


def _norm(flag: str) -> str:
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


def _is_flag(word: str) -> bool:
    return word.startswith("-") and not _NUMBER.match(word)


def is_switch(flag: str) -> bool:
    f = _norm(flag)
    return f.startswith(("--no-", "--enable-", "--disable-")) or f in SWITCHES


def opposite(flag: str) -> str:
    """``--no-enable-x`` <-> ``--enable-x`` (argparse's boolean pairs)."""
    f = _norm(flag)
    return "--" + f[5:] if f.startswith("--no-") else "--no-" + f[2:]


def _occurrences(argv: Sequence[str], flag: str) -> list[tuple[int, int, str]]:
    """(index, words, value) of each occurrence of ``flag``; a switch's value is ``""``."""
    want = _norm(flag)
    out = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if not _is_flag(word):
            i += 1
            continue
        name, eq, value = word.partition("=")
        span = 1
        if not eq and not is_switch(name) and i + 1 < len(argv) and not _is_flag(argv[i + 1]):
            value, span = argv[i + 1], 2
        if _norm(name) == want:
            out.append((i, span, value))
        i += span
    return out


def _without(argv: list[str], flag: str) -> list[str]:
    drop = {j for i, span, _ in _occurrences(argv, flag) for j in range(i, i + span)}
    return [w for j, w in enumerate(argv) if j not in drop]


def _options(words: Sequence[str]) -> list[tuple[str, str | None, list[str]]]:
    """``["--a", "1", "--b=x"]`` -> ``[("--a", "1", ["--a", "1"]), ("--b", "x", ["--b=x"])]``."""
    out: list[tuple[str, str | None, list[str]]] = []
    i = 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if eq:
            out.append((name, value, [words[i]]))
            i += 1
        elif not is_switch(name) and i + 1 < len(words) and not _is_flag(words[i + 1]):
            out.append((name, words[i + 1], list(words[i : i + 2])))
            i += 2
        else:
            out.append((name, None, [name]))
            i += 1
    return out


def _command(env: Mapping[str, str], unset: Sequence[str], argv: Sequence[str]) -> str:
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    if unset:
        words += ["env", *(w for n in unset for w in ("-u", n))]
    return " ".join([*words, shlex.join(argv)])


# -- applying -------------------------------------------------------------------------


def apply(v: Variant, launch: Launch) -> Applied:
    """``v``'s launch command, or why it is skipped (see the module docstring)."""
    if v.skip:
        return Applied(v, None, "", v.skip)
    if not launch.rocm and any(n.startswith("VLLM_ROCM_") for n in [*v.env, *v.unset_env]):
        return Applied(
            v,
            None,
            "",
            "the launch does not look like ROCm (no VLLM_ROCM_*, ROCM_*, HIP_*, HSA_* or "
            "AITER* variable, no /dev/kfd)",
        )
    argv = list(launch.argv)
    env = dict(launch.env)
    changes: list[str] = []
    same: list[str] = []
    for flag in v.remove:
        if not _occurrences(argv, flag):
            same.append(f"{flag} is not in the launch")
            continue
        argv = _without(argv, flag)
        changes.append(f"without {flag}")
    for flag, value, words in _options(v.add):
        shown = " ".join(words)
        if is_switch(flag):
            last = max(
                [(i, _norm(flag)) for i, _, _ in _occurrences(argv, flag)]
                + [(i, opposite(flag)) for i, _, _ in _occurrences(argv, opposite(flag))],
                default=None,
            )
            if value is None and last is not None and last[1] == _norm(flag):
                same.append(f"{flag} is already in the launch")
                continue
            argv = _without(_without(argv, flag), opposite(flag))
        else:
            found = _occurrences(argv, flag)
            if found and found[-1][2] == (value or ""):
                same.append(f"{shown} is already in the launch")
                continue
            argv = _without(argv, flag)
        argv += words
        changes.append(shown)
    for name, value in v.env.items():
        have, where = launch.getenv(name)
        if have == value:
            same.append(f"{name} is already {value} ({where})")
            continue
        env[name] = value
        changes.append(f"{name}={value}")
    unset: list[str] = []
    for name in v.unset_env:
        if name not in env and name not in launch.inherited:
            same.append(f"{name} is not set")
            continue
        env.pop(name, None)
        if name in launch.inherited:
            unset.append(name)
        changes.append(f"unset {name}")
    if v.aborts is not None:
        changes.append(f"--aborts {v.aborts}")
    if not changes:
        return Applied(v, None, "", "; ".join(same) or "it changes nothing")
    return Applied(v, _command(env, unset, argv), ", ".join(changes))


# -- the shipped list -----------------------------------------------------------------


def _tokens(text: str) -> int | None:
    """``8192``, ``8k`` (1000s) or ``8K`` (1024s), as vLLM reads token counts."""
    m = re.fullmatch(r"(\d+)([kKmM]?)", text.strip())
    if not m:
        return None
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 1 << 20}[m.group(2)]
    return int(m.group(1)) * scale


def default_variants(launch: Launch) -> list[Variant]:
    """The shipped list for vLLM, resolved against ``launch`` (halved tokens
    of its own value, its KV dtype flipped, another attention backend).
    Speculative decoding goes first: the likeliest lead for a decode-time
    fault (NaN draft logits giving out-of-range token ids), and the cheapest
    to rule out."""
    spec = Variant(
        "no-speculative-decoding",
        remove=("--speculative-config",),
        means="needs speculative decoding",
    )
    if launch.value("--speculative-config") is None:
        spec = replace(
            spec, skip="speculative decoding is not configured (no --speculative-config)"
        )
    out = [
        spec,
        Variant(
            "no-prefix-caching",
            add=("--no-enable-prefix-caching",),
            means="needs a prefix-cache hit",
        ),
        Variant(
            "no-chunked-prefill",
            add=("--no-enable-chunked-prefill",),
            means="needs chunked prefill",
        ),
    ]
    raw = launch.value("--max-num-batched-tokens")
    base = VLLM_DEFAULT_BATCHED_TOKENS if raw is None else _tokens(raw)
    where = (
        f"vLLM's default {VLLM_DEFAULT_BATCHED_TOKENS} for vllm serve on a GPU of 70 GiB or "
        "more; the launch sets none"
        if raw is None
        else f"the launch's {raw}"
    )
    for name, factor, word in (("half", 0.5, "half"), ("double", 2.0, "twice")):
        if base is None:
            out.append(
                Variant(
                    f"{name}-batched-tokens",
                    skip=f"cannot read --max-num-batched-tokens {raw!r} as a number",
                )
            )
            continue
        out.append(
            Variant(
                f"{name}-batched-tokens",
                add=("--max-num-batched-tokens", str(max(1, int(base * factor)))),
                note=f"{word} {where}",
            )
        )
    out.append(Variant("enforce-eager", add=("--enforce-eager",)))
    kv = launch.value("--kv-cache-dtype") or "auto"
    flipped = "auto" if kv.lower().startswith("fp8") else "fp8"
    out.append(
        Variant(
            "flip-kv-cache-dtype",
            add=("--kv-cache-dtype", flipped),
            note=f"the launch's: {kv}" + (", vLLM's default" if kv == "auto" else ""),
        )
    )
    out.append(Variant("no-aiter", env={"VLLM_ROCM_USE_AITER": "0"}, means="needs AITER"))
    mla = Variant("no-aiter-mla", env={"VLLM_ROCM_USE_AITER_MLA": "0"})
    aiter, _ = launch.getenv("VLLM_ROCM_USE_AITER")
    if launch.rocm and (aiter or "").lower() not in ("1", "true"):
        mla = replace(
            mla, skip="VLLM_ROCM_USE_AITER_MLA acts only with VLLM_ROCM_USE_AITER=1 (not set)"
        )
    out.append(mla)
    backend, _ = launch.getenv("VLLM_ATTENTION_BACKEND")
    other = "TRITON_ATTN"
    if (backend or "").upper() == other:
        other = "ROCM_ATTN" if launch.rocm else "FLASH_ATTN"
    out.append(
        Variant(
            "other-attention-backend",
            env={"VLLM_ATTENTION_BACKEND": other},
            note=f"the launch's: {backend or 'unset, vLLM chooses'}",
        )
    )
    out.append(
        Variant(
            "complete-aborts",
            aborts=Aborts.COMPLETE,
            means="needs a client abort",
            note="client side: the requests the recorded client abandoned are read to the end",
        )
    )
    return out


# -- files ----------------------------------------------------------------------------


def _strings(value: object, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise UsageError(f"{where}: {key!r} must be a list of non-empty strings")
    return tuple(value)


def _env_text(value: object) -> str | None:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float | str):
        return str(value)
    return None


def parse_variant(entry: object, where: str) -> Variant:
    """One ``[[variant]]`` table or JSON object."""
    fields, name, where = named_entry(entry, where, "variant", _KEYS)
    add = _strings(fields.get("add", []), where, "add")
    if add and not _is_flag(add[0]):
        raise UsageError(f"{where}: 'add' must start with a flag, not {add[0]!r}")
    remove = _strings(fields.get("remove", []), where, "remove")
    bad = [f for f in remove if not f.startswith("-") or "=" in f]
    if bad:
        raise UsageError(
            f"{where}: 'remove' names flags (like --speculative-config), not {bad[0]!r}"
        )
    raw_env = fields.get("env", {})
    if not isinstance(raw_env, Mapping):
        raise UsageError(f"{where}: 'env' must be a table/object of NAME = \"value\"")
    env: dict[str, str] = {}
    for k, v in raw_env.items():
        text = _env_text(v)
        if not isinstance(k, str) or not ENV_NAME.match(k) or text is None:
            raise UsageError(f"{where}: 'env' entry {k!r} must be NAME = \"value\"")
        env[k] = text
    unset = _strings(fields.get("unset_env", []), where, "unset_env")
    bad = [n for n in unset if not ENV_NAME.match(n)]
    if bad:
        raise UsageError(f"{where}: 'unset_env' entry {bad[0]!r} is not a variable name")
    means = fields.get("means")
    if means is not None and not isinstance(means, str):
        raise UsageError(f"{where}: 'means' must be a string")
    aborts = fields.get("aborts")
    if aborts is not None and aborts not in tuple(Aborts):
        raise UsageError(f"{where}: 'aborts' must be {' or '.join(repr(a.value) for a in Aborts)}")
    if not (add or remove or env or unset or aborts):
        raise UsageError(f"{where}: changes nothing (give add, remove, env, unset_env or aborts)")
    return Variant(name, add, remove, env, unset, means, aborts=Aborts(aborts) if aborts else None)


def load_file(path: Path) -> list[Variant]:
    """Variants from a TOML (``[[variant]]``) or JSON (a list) file, by suffix
    (JSON, then TOML, for others)."""
    data = load_entries(path, "--vary", "variant")
    return [parse_variant(e, f"--vary {path}: variant {i + 1}") for i, e in enumerate(data)]


def load_variants(sources: Sequence[str], launch: Launch) -> list[Variant]:
    """Every ``--vary`` source in order: files, ``default``, ``default:NAME,...``."""
    out: list[Variant] = []
    for src in sources:
        if src == "default":
            out += default_variants(launch)
        elif src.startswith("default:"):
            shipped = {v.name: v for v in default_variants(launch)}
            out += shipped_named(src, shipped, "--vary", "variant")
        else:
            out += load_file(Path(src))
    names = [v.name for v in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--vary: variant name(s) {', '.join(dup)} given twice")
    if CONTROL in names:
        raise UsageError(f"--vary: the name {CONTROL!r} is the control row's")
    return out


def make_plan(
    sources: Sequence[str],
    launch: str,
    runs: int = DEFAULT_RUNS,
    *,
    environ: Mapping[str, str] | None = None,
    rocm: bool | None = None,
) -> VaryPlan:
    """Read ``sources`` and apply each variant to ``launch`` (before anything runs)."""
    if runs < 1:
        raise UsageError("--vary-runs must be at least 1")
    parsed = Launch.parse(launch, environ, rocm)
    applied = tuple(apply(v, parsed) for v in load_variants(sources, parsed))
    return VaryPlan(parsed, launch, applied, runs)


# -- running --------------------------------------------------------------------------


def _mkdir(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    return d


INFRA_LIMIT = 2
"""Launches in a row that may fail before a variant counts as "did not start"."""


async def _run_one(
    name: str,
    cmd: str,
    runs: int,
    rows: list[int],
    out: Path,
    session: Session,
    policy: ReplayPolicy | None,
    chase: Chase,
    key: str,
    say: Callable[[str], None],
    trace: Trace | None = None,
    control: Mapping[str, Any] | None = None,
    server: int = 0,
) -> dict[str, Any]:
    """``runs`` runs of one launch (journaled runs of the same launch count),
    fewer when ``control`` is given and the verdict is settled (:func:`settled`);
    on a pool, in the place of its server ``server``."""
    shown = redact_command(cmd)
    jpath = out / "variants.jsonl"
    done = [
        e for e in read_jsonl(jpath) if (e["key"], e["variant"], e["launch"]) == (key, name, shown)
    ][:runs]
    d = _mkdir(out / name)
    error = None

    def crashes() -> int:
        return sum(e["outcome"] == Outcome.MATCH.value for e in done)

    if len(done) < runs and not (control and settled(crashes(), runs, control)):
        slot = session.variant(cmd, d / "server.log", server)
        mine = replace(chase)
        failed = 0
        try:
            for i in range(len(done), runs):
                res = await session.trial(
                    d / f"{i + 1:03d}",
                    rows=rows,
                    slot=slot,
                    policy=policy,
                    trace=trace,
                    chase=mine,
                )
                outcome = "UNEXERCISED" if res.unexercised else res.outcome.value
                entry = {
                    "key": key,
                    "variant": name,
                    "launch": shown,
                    "run": i + 1,
                    "outcome": outcome,
                    "failure_class": res.failure_class,
                    "signature": res.signature.hash if res.signature else None,
                    "message": (res.message or res.unexercised or "")[:300] or None,
                }
                append_records(jpath, [orjson.dumps(entry) + b"\n"])
                done.append(entry)
                say(f"variant {name} {i + 1}/{runs}: {outcome}")
                failed = failed + 1 if res.outcome is Outcome.INFRA else 0
                if failed >= INFRA_LIMIT:
                    error = entry["message"]
                    break
                if control and i + 1 < runs and settled(crashes(), runs, control):
                    say(f"variant {name}: settled after {i + 1} run(s), {runs - i - 1} not needed")
                    break
        finally:
            await slot.stop()
    counted = [e for e in done if e["outcome"] not in ("INFRA", "UNEXERCISED")]
    k = sum(e["outcome"] == Outcome.MATCH.value for e in counted)
    row: dict[str, Any] = {
        "name": name,
        "launch": shown,
        **rate_dict(k, len(counted)),
        "other_failures": sum(e["outcome"] == Outcome.OTHER_FAILURE.value for e in counted),
        "infra": sum(e["outcome"] == "INFRA" for e in done),
        "unexercised": sum(e["outcome"] == "UNEXERCISED" for e in done),
    }
    if control and error is None and len(done) < runs and settled(k, runs, control):
        row["settled"] = len(done)
    if error is not None or (done and not counted):
        row["error"] = error or next((e["message"] for e in done if e["message"]), None)
    return row


async def run_plan(
    plan: VaryPlan,
    rows: list[int],
    out: Path,
    session: Session,
    *,
    policy: ReplayPolicy | None = None,
    chase: Chase | None = None,
    key: str = "",
    control: tuple[int, int, str] | None = None,
    say: Callable[[str], None] = print,
    trace: Trace | None = None,
) -> dict[str, Any]:
    """Run every applicable variant of ``plan`` on ``rows``; the report
    (``manifest.json``'s ``variants``). ``control``: (crashes, runs, source)
    already measured on the unmodified launch; without it the control runs too.
    Runs are journaled in ``out/variants.jsonl``: a resumed run repeats none."""
    chase = chase or Chase()
    args = (plan.runs, rows, out, session, policy, chase, key, say, trace)
    if control is not None and control[1]:
        ctl: dict[str, Any] = {
            "name": CONTROL,
            "launch": redact_command(plan.command),
            **rate_dict(control[0], control[1]),
            "other_failures": 0,
            "infra": 0,
            "unexercised": 0,
            "source": control[2],
        }
    else:
        ctl = {**await _run_one(CONTROL, plan.command, *args), "source": "vary"}
    ctl.update(change="", verdict="control")
    # on a pool, each variant takes the place of one server: several at once
    lanes: asyncio.Queue[int] = asyncio.Queue()
    for i in range(max(1, session.width)):
        lanes.put_nowait(i)

    async def row_of(a: Applied) -> dict[str, Any]:
        v = a.variant
        base = {"change": a.change, "note": v.note, "means": v.means}
        skipped, mine = a.skipped, args
        if a.launch is not None and v.aborts is not None:
            pol = policy or session.policy
            if pol.aborts is v.aborts:
                skipped = f"the replay already runs with --aborts {v.aborts}"
            elif not abort_points(trace if trace is not None else session.trace, rows):
                skipped = "no request of the repro was abandoned by its client"
            mine = (*args[:4], replace(pol, aborts=v.aborts), *args[5:])
        if a.launch is None or skipped is not None:
            return {
                "name": v.name,
                **base,
                **rate_dict(0, 0),
                "skipped": skipped,
                "verdict": "skipped",
            }
        lane = await lanes.get()
        try:
            return {**await _run_one(v.name, a.launch, *mine, control=ctl, server=lane), **base}
        finally:
            lanes.put_nowait(lane)

    result = await asyncio.gather(*(row_of(a) for a in plan.variants))
    for row in result:
        row.setdefault("verdict", verdict(row, ctl))
    report = {"runs": plan.runs, "control": ctl, "variants": result}
    report["reading"] = reading(report)
    return report


def bisect_hook(plan: VaryPlan, session: Session) -> Callable[[Search], Awaitable[None]]:
    """What a bisect runs after confirming: the variants on its best repro,
    the confirm runs as the control row, the report in ``b.variants``."""

    async def hook(b: Search) -> None:
        await b.aclose()  # the variants launch on the same port
        k, n = confirm_counts(b)
        b.say(f"== vary: {sum(a.launch is not None for a in plan.variants)} variant(s)")
        trace, rows = b.derived(b.best)  # a shrunk repro brings its own small trace
        b.variants = await run_plan(
            plan,
            rows,
            b.out / "variants",
            session,
            policy=replace(b.policy, timing=Timing(b.best.timing), speed=b.best.speed),
            chase=b.chase,
            key=b.best.key(),
            control=(k, n, "confirm") if n else None,
            say=b.say,
            trace=trace,
        )
        write_report(b.out, b.variants)

    return hook


# -- verdicts ---------------------------------------------------------------------------


def settled(crashes: int, runs: int, control: Mapping[str, Any]) -> bool:
    """Whether a variant's verdict is ``crashes`` whatever its remaining runs
    do: it has crashed, and even if every later run of ``runs`` passed, its
    upper bound would not fall below the control's lower bound (``rarer`` is
    out of reach). Each run that crashes costs a server restart (a model load),
    so such a variant stops there."""
    if not crashes:
        return False
    if not (control["runs"] and control["crashes"]):
        return True
    return bool(rate_dict(crashes, runs)["high"] >= control["low"])


def verdict(row: Mapping[str, Any], control: Mapping[str, Any]) -> str:
    """One row against the control (see the module docstring)."""
    if row.get("skipped"):
        return "skipped"
    if not row["runs"]:
        return "not exercised" if row.get("unexercised") else "did not start"
    apart = bool(control["runs"] and control["crashes"] and row["high"] < control["low"])
    if row["crashes"]:
        return "rarer" if apart else "crashes"
    if row.get("other_failures"):
        return "fails differently"
    return "gone" if apart else "quiet"


def reading(report: Mapping[str, Any]) -> str:
    """One line: what the crash needs, what does not matter."""
    ctl = report["control"]
    if not ctl["runs"]:
        return "the unmodified launch did not run: nothing to compare with"
    if not ctl["crashes"]:
        return f"the unmodified launch did not crash ({ctl['text']}): nothing to compare with"
    rows = report["variants"]

    def names(v: str) -> list[str]:
        return [r["name"] for r in rows if r["verdict"] == v]

    parts = [r.get("means") or f"gone with {r['change']}" for r in rows if r["verdict"] == "gone"]
    parts += [f"rarer with {r['change']}" for r in rows if r["verdict"] == "rarer"]
    parts += [
        f"fails differently with {r['change']}" for r in rows if r["verdict"] == "fails differently"
    ]
    if not parts:
        parts.append("no variant made it go away")
    for v, say in (
        ("crashes", "still crashes with"),
        ("quiet", "no crash but too few runs to call it gone with"),
        ("did not start", "did not start:"),
        ("not exercised", "not exercised (requests rejected):"),
    ):
        if names(v):
            parts.append(f"{say} {', '.join(names(v))}")
    if names("skipped"):
        parts.append(f"{len(names('skipped'))} skipped")
    return "; ".join(parts)


def interval(row: Mapping[str, Any]) -> str:
    return f"{row['low']:.0%}-{row['high']:.0%}" if row["runs"] else "-"


def table(report: Mapping[str, Any]) -> list[str]:
    """The report as aligned text lines (the CLI's closing table)."""
    head = ("variant", "change", "crashes/runs", "95% interval", "verdict")
    body = []
    for r in [report["control"], *report["variants"]]:
        what = r["verdict"]
        if r.get("skipped"):
            what = f"skipped: {r['skipped']}"
        elif r.get("error"):
            what = f"{what}: {str(r['error']).splitlines()[0][:120]}"
        if r.get("other_failures") and r["verdict"] != "fails differently":
            what += f" (+{r['other_failures']} other failure(s))"
        if r.get("settled"):
            what += f" (settled after {r['settled']} of {report['runs']} runs)"
        change = r.get("change") or "-"
        body.append(
            (
                r["name"],
                change if len(change) <= 48 else change[:45] + "...",
                f"{r['crashes']}/{r['runs']}" if r["runs"] else "-",
                interval(r),
                what,
            )
        )
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(4)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)), row[4]]).rstrip()
        for row in [head, *body]
    ]
    return [*lines, f"reading: {report['reading']}"]


def write_report(directory: Path, report: Mapping[str, Any]) -> None:
    """``directory/variants.json`` (:data:`replayer.bisect.files.VARIANTS`)."""
    VARIANTS.write(directory, report)
