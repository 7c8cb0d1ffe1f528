"""Server variants (``--vary``): the files, what a variant does to a launch
command (exact argv and environment), why one is skipped, the verdicts, and
the bisect's hook that puts the table in the manifest and the README."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from replayer.bisect import vary
from replayer.bisect.oracle import Outcome
from replayer.bisect.pipeline import Bisect, BisectOptions, run_bisect
from replayer.bisect.runner import FunctionRunner
from replayer.bisect.vary import Launch, Variant, apply, default_variants, load_file, make_plan
from replayer.emulator.faults import ENV_DEFAULTS
from replayer.errors import UsageError
from replayer.replay.plan import select
from replayer.replay.policy import Aborts, ReplayPolicy
from replayer.session import TrialResult
from replayer.target.process import split_command
from replayer.trace import Trace
from replayer.trace.model import RequestRecord, TraceMeta
from replayer.trace.synth import SynthOptions, write_trace
from replayer.trace.writer import TraceWriter

pytestmark = pytest.mark.inprocess

VLLM = "vllm serve moonshotai/Kimi-K3 --port 8000"


def launch(cmd=VLLM, rocm=False, **environ):
    return Launch.parse(cmd, environ, rocm)


def run_as(applied):
    """What the target would run: (argv, environment words)."""
    assert applied.skipped is None, applied.skipped
    return split_command(applied.launch)


# -- applying -------------------------------------------------------------------------


def test_adding_a_switch_appends_it_and_drops_its_opposite():
    a = apply(Variant("v", add=("--no-enable-prefix-caching",)), launch())
    assert run_as(a) == (
        ["vllm", "serve", "moonshotai/Kimi-K3", "--port", "8000", "--no-enable-prefix-caching"],
        {},
    )
    assert a.change == "--no-enable-prefix-caching"
    a = apply(
        Variant("v", add=("--no-enable-prefix-caching",)),
        launch(VLLM + " --enable-prefix-caching --max-num-seqs 8"),
    )
    assert run_as(a)[0][3:] == [
        "--port",
        "8000",
        "--max-num-seqs",
        "8",
        "--no-enable-prefix-caching",
    ]


def test_adding_an_option_replaces_every_form_of_it():
    for form in ("--max-num-batched-tokens 8192", "--max-num-batched-tokens=8192",
                 "--max_num_batched_tokens 8192"):  # fmt: skip
        a = apply(
            Variant("v", add=("--max-num-batched-tokens", "4096")),
            launch(f"{VLLM} {form} --enforce-eager"),
        )
        assert run_as(a)[0][3:] == [
            "--port",
            "8000",
            "--enforce-eager",
            "--max-num-batched-tokens",
            "4096",
        ], form


def test_an_added_option_keeps_the_form_it_was_given_in():
    a = apply(Variant("v", add=("--kv-cache-dtype=fp8", "-tp", "4")), launch(VLLM + " -tp 8"))
    assert run_as(a)[0][3:] == ["--port", "8000", "--kv-cache-dtype=fp8", "-tp", "4"]
    assert a.change == "--kv-cache-dtype=fp8, -tp 4"


def test_removing_a_flag_removes_both_forms_and_keeps_the_rest():
    spec = '{"method": "mtp", "num_speculative_tokens": 1}'
    cmd = f"VLLM_X=1 {VLLM} --speculative-config '{spec}' -tp 8 '--speculative-config={spec}'"
    a = apply(Variant("v", remove=("--speculative-config",)), launch(cmd))
    assert run_as(a) == (
        ["vllm", "serve", "moonshotai/Kimi-K3", "--port", "8000", "-tp", "8"],
        {"VLLM_X": "1"},
    )
    assert a.change == "without --speculative-config"


def test_environment_set_and_unset():
    base = launch("VLLM_A=1 VLLM_B=2 " + VLLM, VLLM_C="3", HOME="/h")
    a = apply(Variant("v", env={"VLLM_A": "0", "VLLM_D": "x y"}), base)
    assert run_as(a)[1] == {"VLLM_A": "0", "VLLM_B": "2", "VLLM_D": "x y"}
    assert a.change == "VLLM_A=0, VLLM_D=x y"
    # unset in the launch's words: dropped; inherited from replayer: env -u
    a = apply(Variant("v", unset_env=("VLLM_B", "VLLM_C")), base)
    assert run_as(a) == (
        ["env", "-u", "VLLM_C", "vllm", "serve", "moonshotai/Kimi-K3", "--port", "8000"],
        {"VLLM_A": "1"},
    )
    assert a.change == "unset VLLM_B, unset VLLM_C"


ALREADY = "is already in the launch"


@pytest.mark.parametrize(
    ("variant", "cmd", "reason"),
    [
        (
            Variant("v", remove=("--speculative-config",)),
            VLLM,
            "--speculative-config is not in the launch",
        ),
        (
            Variant("v", add=("--enforce-eager",)),
            VLLM + " --enforce_eager",
            f"--enforce-eager {ALREADY}",
        ),
        (
            Variant("v", add=("--kv-cache-dtype", "fp8")),
            VLLM + " --kv-cache-dtype=fp8",
            f"--kv-cache-dtype fp8 {ALREADY}",
        ),
        (Variant("v", env={"VLLM_A": "1"}), "VLLM_A=1 " + VLLM, "VLLM_A is already 1 (the launch)"),
        (Variant("v", unset_env=("VLLM_NOPE",)), VLLM, "VLLM_NOPE is not set"),
        (
            Variant("v", remove=("--a",), add=("--enforce-eager",)),
            VLLM + " --enforce-eager",
            f"--a is not in the launch; --enforce-eager {ALREADY}",
        ),
    ],
)
def test_a_variant_that_changes_nothing_is_skipped_with_the_reason(variant, cmd, reason):
    a = apply(variant, launch(cmd))
    assert (a.launch, a.skipped) == (None, reason)


def test_rocm_variables_apply_only_to_a_launch_that_looks_like_rocm():
    v = Variant("v", env={"VLLM_ROCM_USE_AITER_MLA": "0"})
    assert apply(v, launch()).skipped.startswith("the launch does not look like ROCm")
    # the launch's own words, or replayer's environment, make it look like ROCm
    assert Launch.parse("VLLM_ROCM_USE_AITER=1 " + VLLM, {}, None).rocm
    assert Launch.parse(VLLM, {"HIP_VISIBLE_DEVICES": "0"}, None).rocm
    assert run_as(apply(v, launch(rocm=True)))[1] == {"VLLM_ROCM_USE_AITER_MLA": "0"}


def test_a_shell_launch_cannot_be_varied():
    with pytest.raises(UsageError, match="through a shell"):
        Launch.parse("sh -c 'vllm serve m'", {}, False)


# -- the shipped list ---------------------------------------------------------------------


def shipped(cmd=VLLM, rocm=False, **environ):
    got = launch(cmd, rocm, **environ)
    return {v.name: (v, apply(v, got)) for v in default_variants(got)}


def test_the_shipped_list_against_a_plain_cuda_launch():
    d = shipped()
    assert list(d) == [
        "no-speculative-decoding",  # first: the likeliest lead for a decode-time fault
        "no-prefix-caching",
        "no-chunked-prefill",
        "half-batched-tokens",
        "double-batched-tokens",
        "enforce-eager",
        "flip-kv-cache-dtype",
        "no-aiter",
        "no-aiter-mla",
        "other-attention-backend",
        "complete-aborts",
    ]
    tail = {name: run_as(a)[0][5:] for name, (_, a) in d.items() if a.launch}
    assert tail == {
        "no-prefix-caching": ["--no-enable-prefix-caching"],
        "no-chunked-prefill": ["--no-enable-chunked-prefill"],
        "half-batched-tokens": ["--max-num-batched-tokens", "4096"],
        "double-batched-tokens": ["--max-num-batched-tokens", "16384"],
        "enforce-eager": ["--enforce-eager"],
        "flip-kv-cache-dtype": ["--kv-cache-dtype", "fp8"],
        "other-attention-backend": [],
        "complete-aborts": [],  # client side: the launch as it is
    }
    assert d["complete-aborts"][1].change == "--aborts complete"
    assert run_as(d["other-attention-backend"][1])[1] == {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}
    assert d["half-batched-tokens"][0].note == (
        "half vLLM's default 8192 for vllm serve on a GPU of 70 GiB or more; the launch sets none"
    )
    skipped = {name: a.skipped for name, (_, a) in d.items() if a.skipped}
    rocm = (
        "the launch does not look like ROCm (no VLLM_ROCM_*, ROCM_*, HIP_*, HSA_* or AITER* "
        "variable, no /dev/kfd)"
    )
    assert skipped == {
        "no-aiter": rocm,
        "no-aiter-mla": rocm,
        "no-speculative-decoding": (
            "speculative decoding is not configured (no --speculative-config)"
        ),
    }


def test_the_shipped_list_follows_the_launchs_own_settings():
    cmd = (
        "VLLM_ROCM_USE_AITER=1 VLLM_ATTENTION_BACKEND=TRITON_ATTN " + VLLM
        + " --max-num-batched-tokens 16k --kv-cache-dtype fp8_e4m3 --enforce-eager"
        + " --speculative-config '{\"method\": \"mtp\"}'"
    )  # fmt: skip
    d = shipped(cmd, rocm=True)
    assert d["enforce-eager"][1].skipped == "--enforce-eager is already in the launch"
    assert d["half-batched-tokens"][1].change == "--max-num-batched-tokens 8000"
    assert d["half-batched-tokens"][0].note == "half the launch's 16k"
    assert d["double-batched-tokens"][1].change == "--max-num-batched-tokens 32000"
    assert d["flip-kv-cache-dtype"][1].change == "--kv-cache-dtype auto"
    assert d["other-attention-backend"][1].change == "VLLM_ATTENTION_BACKEND=ROCM_ATTN"
    assert run_as(d["no-aiter"][1])[1]["VLLM_ROCM_USE_AITER"] == "0"
    assert run_as(d["no-aiter-mla"][1])[1] == {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_ATTENTION_BACKEND": "TRITON_ATTN",
        "VLLM_ROCM_USE_AITER_MLA": "0",
    }
    argv, _ = run_as(d["no-speculative-decoding"][1])
    assert "--speculative-config" not in argv and argv[-1] == "--enforce-eager"
    assert shipped(VLLM + " --max-num-batched-tokens lots")["half-batched-tokens"][1].skipped == (
        "cannot read --max-num-batched-tokens 'lots' as a number"
    )


def test_aiter_variants_on_rocm_without_aiter():
    d = shipped(rocm=True)
    # AITER is off by default in vLLM, and its MLA switch acts only under it
    assert d["no-aiter"][1].skipped == "VLLM_ROCM_USE_AITER is already 0 (vLLM's default)"
    assert d["no-aiter-mla"][1].skipped == (
        "VLLM_ROCM_USE_AITER_MLA acts only with VLLM_ROCM_USE_AITER=1 (not set)"
    )


def test_the_defaults_table_is_the_emulators():
    assert vary.VLLM_ENV_DEFAULTS == ENV_DEFAULTS


# -- files -------------------------------------------------------------------------------


def test_toml_and_json_files_read_alike(tmp_path):
    t = tmp_path / "v.toml"
    t.write_text(
        '[[variant]]\nname = "small-step"\nadd = ["--max-num-batched-tokens", "2048"]\n'
        'remove = ["--enforce-eager"]\nenv = {VLLM_A = "0", VLLM_B = 1}\n'
        'unset_env = ["VLLM_C"]\nmeans = "needs big steps"\n'
    )
    j = tmp_path / "v.json"
    j.write_text(
        json.dumps(
            [
                {
                    "name": "small-step",
                    "add": ["--max-num-batched-tokens", "2048"],
                    "remove": ["--enforce-eager"],
                    "env": {"VLLM_A": "0", "VLLM_B": 1},
                    "unset_env": ["VLLM_C"],
                    "means": "needs big steps",
                }
            ]
        )
    )
    want = Variant(
        "small-step",
        add=("--max-num-batched-tokens", "2048"),
        remove=("--enforce-eager",),
        env={"VLLM_A": "0", "VLLM_B": "1"},
        unset_env=("VLLM_C",),
        means="needs big steps",
    )
    assert load_file(t) == load_file(j) == [want]


V = "[[variant]]\nname = 'a'\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (V + "add = '--x'\n", "variant 1 (a): 'add' must be a list of non-empty strings"),
        (
            V + "foo = 1\nadd = ['--x']\n",
            "variant 1: unknown key(s) foo (have name, add, remove, env, unset_env, aborts, means)",
        ),
        ("[[variant]]\nadd = ['--x']\n", "variant 1: 'name' must be a word"),
        (V, "variant 1 (a): changes nothing"),
        (V + "add = ['4096']\n", "'add' must start with a flag, not '4096'"),
        (V + "remove = ['--x=1']\n", "'remove' names flags"),
        (V + "env = {'1X' = '0'}\n", "'env' entry '1X' must be NAME = \"value\""),
        (V + "unset_env = ['A B']\n", "'unset_env' entry 'A B' is not a variable name"),
        ("[[variant]\n", "not TOML"),
        ("title = 'x'\n", "expected [[variant]] tables (TOML) or a list of objects (JSON)"),
    ],
)
def test_bad_files_name_the_problem_on_one_line(tmp_path, text, message):
    p = tmp_path / "v.toml"
    p.write_text(text)
    with pytest.raises(UsageError) as err:
        make_plan([str(p)], VLLM)
    assert str(err.value).startswith(f"--vary {p}: ")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_sources(tmp_path):
    p = tmp_path / "v.json"
    p.write_text('[{"name": "enforce-eager", "add": ["--enforce-eager"]}]')
    with pytest.raises(UsageError, match="variant name.s. enforce-eager given twice"):
        make_plan([str(p), "default"], VLLM)
    with pytest.raises(
        UsageError,
        match="no shipped variant nope; have no-speculative-decoding, no-prefix-caching, ",
    ):
        make_plan(["default:enforce-eager,nope"], VLLM)
    p.write_text('[{"name": "unmodified", "add": ["--x"]}]')
    with pytest.raises(UsageError, match="the name 'unmodified' is the control row's"):
        make_plan([str(p)], VLLM)
    with pytest.raises(UsageError, match="No such file"):
        make_plan([str(tmp_path / "missing.toml")], VLLM)
    with pytest.raises(UsageError, match="--vary-runs must be at least 1"):
        make_plan(["default"], VLLM, 0)
    plan = make_plan(["default:enforce-eager,no-prefix-caching"], VLLM, 3, environ={})
    assert [a.variant.name for a in plan.variants] == ["enforce-eager", "no-prefix-caching"]
    assert (plan.runs, plan.command) == (3, VLLM)


# -- verdicts ---------------------------------------------------------------------------


def row(k, n, **kw):
    from replayer.bisect.stats import rate_dict

    return {"name": kw.pop("name", "v"), "change": kw.pop("change", "--x"), **rate_dict(k, n), **kw}


@pytest.mark.parametrize(
    ("r", "control", "want"),
    [
        (row(0, 5), row(10, 10), "gone"),  # upper 45% < lower 72%
        (row(0, 2), row(10, 10), "quiet"),  # upper 78%: too few runs
        (row(0, 5), row(3, 10), "quiet"),  # the control is too rare to tell
        (row(1, 10), row(10, 10), "rarer"),
        (row(4, 5), row(10, 10), "crashes"),
        (row(0, 5, other_failures=2), row(10, 10), "fails differently"),
        (row(0, 0), row(10, 10), "did not start"),
        (row(0, 0, unexercised=2), row(10, 10), "not exercised"),
        (row(0, 0, skipped="why"), row(10, 10), "skipped"),
    ],
)
def test_verdicts(r, control, want):
    assert vary.verdict(r, control) == want


@pytest.mark.parametrize(
    ("crashes", "runs", "control", "want"),
    [
        (0, 5, row(10, 10), False),  # no crash yet: could still be gone
        (1, 2, row(10, 10), True),  # 1/2's upper bound 91% >= 10/10's lower bound 72%
        (1, 5, row(10, 10), False),  # 1/5 (upper 62%) could still be rarer than 10/10
        (1, 4, row(5, 5), True),  # 1/4's upper bound 70% >= 5/5's lower bound 57%
        (2, 20, row(5, 5), False),  # 2/20 (upper 30%) could be rarer than 5/5
        (1, 3, row(0, 3), True),  # a control that never crashed: nothing to be rarer than
    ],
)
def test_a_crashing_variant_is_settled_when_rarer_is_out_of_reach(crashes, runs, control, want):
    assert vary.settled(crashes, runs, control) is want


def test_readings():
    ctl = row(10, 10, name="unmodified", change="")

    def read(*rows, control=ctl):
        rows = [{**r, "verdict": vary.verdict(r, control)} for r in rows]
        return vary.reading({"control": control, "variants": rows})

    assert read(
        row(0, 5, name="no-prefix-caching", means="needs a prefix-cache hit"),
        row(0, 5, name="no-aiter-mla", change="VLLM_ROCM_USE_AITER_MLA=0"),
        row(5, 5, name="enforce-eager"),
        row(5, 5, name="flip"),
        row(0, 0, name="spec", skipped="not configured"),
    ) == (
        "needs a prefix-cache hit; gone with VLLM_ROCM_USE_AITER_MLA=0; "
        "still crashes with enforce-eager, flip; 1 skipped"
    )
    assert read(row(5, 5, name="a"), row(0, 2, name="b")) == (
        "no variant made it go away; still crashes with a; "
        "no crash but too few runs to call it gone with b"
    )
    assert read(row(5, 5), control=row(0, 10)) == (
        "the unmodified launch did not crash (crashed 0/10 (95% upper bound 26%)): "
        "nothing to compare with"
    )


# -- running, with a fake server ------------------------------------------------------------


@dataclass
class FakeSlot:
    """A variant's server: crashes unless the launch has prefix caching off;
    fails to launch when it has ``--bad``."""

    cmd: str
    runs: list[Path] = field(default_factory=list)
    stops: int = 0

    async def stop(self):
        self.stops += 1


class FakeSession:
    """What ``run_plan`` asks of a session: a slot per variant, trials on it."""

    def __init__(self, width=1):
        self.width = width
        self.envs: list[FakeSlot] = []
        self.servers: dict[str, int] = {}
        self.running = self.peak = 0

    def variant(self, cmd, log_path, server=0):
        self.envs.append(FakeSlot(cmd))
        self.servers[cmd] = server
        return self.envs[-1]

    async def trial(self, out, *, rows, slot, policy=None, trace=None, chase=None):
        slot.runs.append(out)
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(0)  # the other lanes' trials start meanwhile
        self.running -= 1
        if "--bad" in slot.cmd:
            return TrialResult(Outcome.INFRA, None, message="cannot launch: --bad")
        if "--no-enable-prefix-caching" in slot.cmd:
            return TrialResult(Outcome.PASS, None)
        return TrialResult(Outcome.MATCH, None, failure_class="process_exit")


async def test_run_plan_runs_the_control_and_each_variant_and_resumes(tmp_path):
    p = tmp_path / "v.toml"
    p.write_text("[[variant]]\nname = 'broken'\nadd = ['--bad']\n")
    plan = make_plan([str(p), "default:no-prefix-caching,enforce-eager"], VLLM, 3, environ={})
    f = FakeSession()
    report = await vary.run_plan(plan, [0, 1], tmp_path / "v", f, key="k", say=lambda m: None)
    assert [e.cmd for e in f.envs] == [
        VLLM,
        VLLM + " --bad",
        VLLM + " --no-enable-prefix-caching",
        VLLM + " --enforce-eager",
    ]
    # two failed launches: given up; enforce-eager's first crash settled it
    # (1/3's upper bound, 79%, could not fall below 3/3's lower bound, 44%)
    assert [len(e.runs) for e in f.envs] == [3, 2, 3, 1]
    assert all(e.stops == 1 for e in f.envs)
    assert report["control"]["source"] == "vary"
    got = [(r["name"], r["crashes"], r["runs"], r["verdict"]) for r in report["variants"]]
    assert got == [
        ("broken", 0, 0, "did not start"),
        ("no-prefix-caching", 0, 3, "quiet"),  # 0/3 vs 3/3: too few runs to say gone
        ("enforce-eager", 1, 1, "crashes"),
    ]
    assert report["variants"][2]["settled"] == 1
    assert report["variants"][0]["error"] == "cannot launch: --bad"
    # a second run of the same plan reads the journal: only the given-up
    # variant launches again (for its one missing run)
    again = FakeSession()
    second = await vary.run_plan(plan, [0, 1], tmp_path / "v", again, key="k")
    assert [(e.cmd, len(e.runs)) for e in again.envs] == [(VLLM + " --bad", 1)]
    assert second["control"] == report["control"]
    assert second["variants"][1:] == report["variants"][1:]
    # another candidate (key) does not reuse them
    other = FakeSession()
    await vary.run_plan(plan, [0], tmp_path / "v", other, key="k2")
    assert len(other.envs) == 4


def test_an_aborts_variant_is_read_from_a_file_and_refuses_other_values(tmp_path):
    p = tmp_path / "v.toml"
    p.write_text("[[variant]]\nname = 'wait'\naborts = 'complete'\n")
    (v,) = load_file(p)
    assert v.aborts is Aborts.COMPLETE and apply(v, launch()).launch == VLLM
    p.write_text("[[variant]]\nname = 'wait'\naborts = 'never'\n")
    with pytest.raises(UsageError, match="'aborts' must be 'replay' or 'complete'"):
        load_file(p)


class AbortSession(FakeSession):
    """Crashes only when the trial replays the client's aborts."""

    policy = ReplayPolicy()

    async def trial(self, out, *, rows, slot, policy=None, trace=None, chase=None):
        slot.runs.append(out)
        if policy is not None and policy.aborts is Aborts.COMPLETE:
            return TrialResult(Outcome.PASS, None)
        return TrialResult(Outcome.MATCH, None, failure_class="process_exit")


@pytest.mark.parametrize("aborted", [True, False])
async def test_the_aborts_variant_replays_with_complete_and_reads_needs_an_abort(tmp_path, aborted):
    meta = {"abort": {"after_chunks": 3, "after_us": 1000}} if aborted else None
    rec = RequestRecord.from_body(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        request_id="r0",
        session_id="s",
        turn=0,
        start_us=0,
        meta=meta,
    )
    with TraceWriter(tmp_path / "t.arrow", TraceMeta(source="test")) as w:
        w.add(rec)
    trace = Trace.open(tmp_path / "t.arrow")
    plan = make_plan(["default:complete-aborts"], VLLM, 5, environ={})
    f = AbortSession()
    report = await vary.run_plan(
        plan, [0], tmp_path / "v", f, key="k", trace=trace, say=lambda m: None
    )
    (row,) = report["variants"]
    if aborted:
        assert (row["crashes"], row["runs"], row["verdict"]) == (0, 5, "gone")
        assert [e.cmd for e in f.envs] == [VLLM, VLLM]  # the launch as it is
        assert report["reading"] == "needs a client abort"
    else:
        assert row["skipped"] == "no request of the repro was abandoned by its client"
        assert [e.cmd for e in f.envs] == [VLLM]  # the control only


async def test_the_bisect_hook_fills_the_manifest_and_opens_the_readme(tmp_path):
    path = tmp_path / "t.arrow"
    write_trace(path, SynthOptions(sessions=2, turns=3, context=2_000, model="m", seed=1))
    trace = Trace.open(path)
    rows = select(trace)
    culprit = trace.column("request_id")[rows[3]]
    runner = FunctionRunner(lambda t: Outcome.MATCH if culprit in t.request_ids() else Outcome.PASS)
    opts = BisectOptions(calibrate_matches=1, calibrate_runs=2, confirm=5)
    plan = make_plan(["default:no-prefix-caching,no-speculative-decoding"], VLLM, 5, environ={})
    f = FakeSession()
    hook = vary.bisect_hook(plan, f)
    b = Bisect(trace, rows, runner, tmp_path / "b", opts, say=lambda m: None, vary=hook)
    res = await run_bisect(b)
    assert res.status == "complete"
    assert [e.cmd for e in f.envs] == [VLLM + " --no-enable-prefix-caching"]  # confirm: control
    m = orjson.loads((tmp_path / "b" / "bundle" / "manifest.json").read_bytes())
    v = m["variants"]
    assert (v["control"]["source"], v["control"]["crashes"], v["control"]["runs"]) == (
        "confirm",
        5,
        5,
    )
    assert [(r["name"], r["verdict"]) for r in v["variants"]] == [
        ("no-prefix-caching", "gone"),  # 0/5 (upper 45%) below 5/5 (lower 57%)
        ("no-speculative-decoding", "skipped"),
    ]
    assert v["reading"] == "needs a prefix-cache hit; 1 skipped"
    assert orjson.loads((tmp_path / "b" / "variants.json").read_bytes()) == {
        "format_version": 1,
        **v,
    }
    readme = (tmp_path / "b" / "bundle" / "README.md").read_text().splitlines()
    # the threshold line first, then the table (then reliability, signatures)
    assert readme[2].startswith("The requests are shrunk inside")
    at = readme.index("## What makes it go away")
    assert at == 4
    readme = readme[at - 2 :]
    assert readme[:10] == [
        readme[0],
        "",
        "## What makes it go away",
        "",
        "**needs a prefix-cache hit; 1 skipped**",
        "",
        "| variant | change | crashes/runs | 95% interval | verdict |",
        "|---|---|---|---|---|",
        "| unmodified | (as launched) | 5/5 | 57%-100% | control |",
        "| no-prefix-caching | `--no-enable-prefix-caching` | 0/5 | 0%-45% | gone |",
    ]
    assert readme[10] == (
        "| no-speculative-decoding | - | - | - | skipped: speculative decoding "
        "is not configured (no --speculative-config) |"
    )


async def test_on_a_pool_the_variants_run_side_by_side_in_the_servers_places(tmp_path):
    plan = make_plan(["default:no-prefix-caching,enforce-eager"], VLLM, 2, environ={})
    one, two = FakeSession(), FakeSession(width=2)
    r1 = await vary.run_plan(plan, [0, 1], tmp_path / "1", one, key="k", say=lambda m: None)
    r2 = await vary.run_plan(plan, [0, 1], tmp_path / "2", two, key="k", say=lambda m: None)
    # the same report, in the plan's order, whatever ran first
    assert r1 == r2
    assert [v["verdict"] for v in r2["variants"]] == ["quiet", "crashes"]  # 2 runs: not apart
    assert one.peak == 1 and two.peak == 2
    # the control on server 0, then one variant in each server's place
    assert two.servers == {
        VLLM: 0,
        VLLM + " --no-enable-prefix-caching": 0,
        VLLM + " --enforce-eager": 1,
    }
