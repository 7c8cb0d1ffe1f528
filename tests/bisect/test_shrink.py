"""The shrink stage, in-process: what an edit does to each kind of body, and
whole bisects whose oracle crashes on a context length (and a prefix-cache
hit, and a least max_tokens) it checks on the bodies it is given, so the
exact thresholds are known: the bundle's crashing request holds N to N + one
unit, the shared prefix survives, and the reported line says where."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from replayer.bisect.edit import Edit, capped, digest, turns
from replayer.bisect.oracle import Outcome
from replayer.bisect.pipeline import Bisect, BisectOptions, run_bisect
from replayer.bisect.runner import FunctionRunner, Observation, Trial
from replayer.bisect.shrink import threshold_line
from replayer.replay.plan import select
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.schema import Kind
from tests.helpers.bisect import BS, blocks_trace, long_prompt_after_a_hit

pytestmark = pytest.mark.inprocess

OPTS = BisectOptions(calibrate_matches=2, calibrate_runs=3, confirm=2)


def _bundle(out):
    lines = (out / "bundle" / "requests.jsonl").read_bytes().splitlines()
    return {e["request_id"]: e["body"] for e in map(orjson.loads, lines)}


# -- token-id prompts -----------------------------------------------------------------


async def test_context_and_the_cache_hit_shrink_to_their_thresholds(tmp_path):
    t = blocks_trace(tmp_path)
    out = tmp_path / "b"
    calls: list[Trial] = []

    def oracle(trial: Trial) -> Observation:
        calls.append(trial)
        return long_prompt_after_a_hit(trial)

    b = Bisect(t, select(t), FunctionRunner(oracle), out, OPTS, say=lambda m: None)
    res = await run_bisect(b)
    assert res.status == "complete" and res.requests == ["a0", "b0"]
    got = _bundle(out)
    # the crashing request: 94 blocks (1,504 tokens, the least >= 1,500); its
    # cache source cut to 30 blocks (480 tokens), still its prefix
    assert len(got["b0"]["prompt"]) == 94 * BS
    assert len(got["a0"]["prompt"]) == 30 * BS
    assert got["b0"]["prompt"][: 30 * BS] == got["a0"]["prompt"]
    assert got["a0"]["max_tokens"] == got["b0"]["max_tokens"] == 1
    m = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    assert m["shrink"]["text"] == (
        "crashes at >= 1,504 prompt tokens, not at 1,488 prompt tokens; "
        "its prefix-cache source a0 crashes at >= 480 tokens, not at 464 tokens; "
        "max_tokens 1 crashes (recorded 8)"
    )
    assert m["shrink"]["context"]["crashes_at"] == {
        "units": 94,
        "prompt_tokens": 1504,
        "tokens_from": "trace",
        "estimate": 1504,
    }
    readme = (out / "bundle" / "README.md").read_text()
    assert "crashes at >= 1,504 prompt tokens, not at 1,488" in readme
    # the confirm runs replayed the shrunk bodies, and they crashed
    assert res.reproduction == (2, 2)
    assert [len(x["prompt"]) for x in calls[-1].bodies()] == [480, 1504]
    # the source trace is untouched: the edits live in the candidates
    assert len(t.body(t.order[3])["prompt"]) == 111 * BS


@pytest.mark.parametrize("kill_at", [14, 22])
async def test_a_killed_shrink_resumes_without_repeating_a_trial(tmp_path, kill_at):
    t = blocks_trace(tmp_path)
    ref_calls: list[Trial] = []

    def ref(trial: Trial) -> Observation:
        ref_calls.append(trial)
        return long_prompt_after_a_hit(trial)

    ref_b = Bisect(t, select(t), FunctionRunner(ref), tmp_path / "ref", OPTS, say=lambda m: None)
    want = await run_bisect(ref_b)
    assert ref_calls[kill_at - 1].stage.startswith("shrink")

    out = tmp_path / "b"
    calls: list[Trial] = []

    class Killed(Exception):
        pass

    killed: list[int] = []

    def dies(trial: Trial) -> Observation:
        if len(calls) + 1 == kill_at and not killed:
            killed.append(kill_at)
            raise Killed
        calls.append(trial)
        return long_prompt_after_a_hit(trial)

    with pytest.raises(Killed):
        await run_bisect(Bisect(t, select(t), FunctionRunner(dies), out, OPTS, say=lambda m: None))
    again = Bisect(t, select(t), FunctionRunner(dies), out, OPTS, say=lambda m: None)
    res = await run_bisect(again)
    assert (res.best, res.trials) == (want.best, want.trials)
    assert len(calls) == want.trials  # no trial ran twice
    assert [c.bodies() for c in calls] == [c.bodies() for c in ref_calls]
    assert _bundle(out) == _bundle(tmp_path / "ref")


# -- conversations --------------------------------------------------------------------


def agent_trace(tmp_path, turns_: int = 6) -> Trace:
    """One agent session: a system prompt, a task, then turns of a tool call
    and its (long) result; request k sends the first k turns. A second
    session says something else."""
    system = {"role": "system", "content": "You are a coding agent. " * 40}
    task = {"role": "user", "content": "Fix the failing test."}
    msgs: list[dict[str, object]] = [system, task]
    p = tmp_path / "agent.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for k in range(turns_):
            w.add(
                RequestRecord.from_body(
                    {"model": "m", "messages": list(msgs), "max_tokens": 16},
                    request_id=f"a-{k}",
                    session_id="a",
                    turn=k,
                    start_us=k * 20_000,
                )
            )
            w.add(
                RequestRecord.from_body(
                    {"model": "m", "messages": [task], "max_tokens": 16},
                    request_id=f"z-{k}",
                    session_id="z",
                    turn=k,
                    start_us=k * 20_000 + 10_000,
                )
            )
            call = {"id": f"call_{k}", "type": "function"}
            call["function"] = {"name": "read", "arguments": orjson.dumps({"n": k}).decode()}
            msgs += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call_{k}", "content": f"line {k} " * 300},
            ]
    return Trace.open(p)


N_CHARS = 5_000


def long_chat_after_a_hit(trial: Trial) -> Observation:
    """Crashes when a conversation of >= N_CHARS characters of JSON extends
    an earlier request's (a cache hit of >= 3 messages) and may write >= 3
    tokens."""
    bodies = trial.bodies()
    ids = trial.request_ids()
    for i, body in enumerate(bodies):
        msgs = body["messages"]
        hit = any(
            len(b["messages"]) >= 3 and msgs[: len(b["messages"])] == b["messages"]
            for b in bodies[:i]
        )
        if len(orjson.dumps(msgs)) >= N_CHARS and hit and body["max_tokens"] >= 3:
            return Observation(Outcome.MATCH, signature="planted", failed_request=ids[i])
    return Observation(Outcome.PASS)


def tool_calls_paired(msgs: list[dict[str, object]]) -> bool:
    open_ids: set[object] = set()
    for m in msgs:
        if m["role"] == "assistant":
            open_ids = {c["id"] for c in m.get("tool_calls") or ()}  # type: ignore[union-attr]
        elif m["role"] == "tool" and m["tool_call_id"] not in open_ids:
            return False
    return True


async def test_a_conversation_loses_old_turns_and_text_down_to_the_threshold(tmp_path):
    t = agent_trace(tmp_path)
    out = tmp_path / "b"
    b = Bisect(t, select(t), FunctionRunner(long_chat_after_a_hit), out, OPTS, say=lambda m: None)
    res = await run_bisect(b)
    assert res.status == "complete"
    before, last = res.requests
    got = _bundle(out)
    msgs, prev = got[last]["messages"], got[before]["messages"]
    size = len(orjson.dumps(msgs))
    m = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    ctx = m["shrink"]["context"]
    # the least that crashes, to one step of the cut text
    assert N_CHARS <= size < N_CHARS + ctx["step"]
    assert ctx["quiet_at"]["units"] == ctx["crashes_at"]["units"] - ctx["step"]
    # still a valid conversation, and the cache hit survived the shrink
    assert msgs[0]["role"] == "system" and msgs[1]["content"] == "Fix the failing test."
    assert tool_calls_paired(msgs)
    assert msgs[: len(prev)] == prev and len(prev) >= 3
    # the max_tokens grid 1, 2, 4, 8, 16: 4 crashes, 2 does not
    assert got[last]["max_tokens"] == 4
    assert m["shrink"]["max_tokens"] == {"crashes_at": 4, "quiet_at": 2, "recorded": 16}
    assert m["shrink"]["text"].startswith("crashes at >= ~")
    assert res.reproduction == (2, 2)


# -- edits, one kind at a time ------------------------------------------------------------


def rec(kind: Kind, content: object, **params: object) -> RequestRecord:
    return RequestRecord(
        request_id="r",
        session_id="s",
        turn=0,
        start_us=0,
        kind=kind,
        params={"model": "m", **params},
        content=content,
        body_sha256="abc",
    )


def texts(items: list[dict[str, object]]) -> list[str]:
    return [orjson.dumps(m).decode() for m in items]


def test_chat_turns_keep_the_head_the_last_turn_and_tool_pairs():
    items = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "assistant", "content": "thinking aloud"},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c2"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
    ]
    # what the model said and what answered it; the head and the last turn stay
    assert turns(Kind.CHAT, texts(items)) == [(2, 4), (4, 6)]
    first = digest(texts(items)[2:4])
    got = Edit(drop=(first,)).apply(rec(Kind.CHAT, texts(items)))
    assert [orjson.loads(m) for m in got.content] == items[:2] + items[4:]
    assert got.body_sha256 is None and got.input_tokens is None


def test_messages_turns_keep_roles_alternating_and_tool_results_with_their_use():
    items = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        {"role": "assistant", "content": "done?"},
        {"role": "user", "content": "yes"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2"}]},
    ]
    spans = turns(Kind.MESSAGES, texts(items))
    assert spans == [(1, 3), (3, 5)]
    for s, e in spans:
        got = Edit(drop=(digest(texts(items)[s:e]),)).apply(rec(Kind.MESSAGES, texts(items)))
        roles = [orjson.loads(m)["role"] for m in got.content]
        assert all(a != b for a, b in zip(roles, roles[1:], strict=False))


def test_responses_turns_hold_a_call_with_its_output():
    items = [
        {"type": "message", "role": "user", "content": "task"},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "f1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "f1", "output": "x" * 50},
        {"type": "function_call", "call_id": "f2", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "f2", "output": "y"},
    ]
    assert turns(Kind.RESPONSES, texts(items)) == [(1, 4)]


def test_trims_cut_the_longest_prose_and_never_tool_arguments():
    item = {
        "role": "assistant",
        "content": "short",
        "tool_calls": [{"function": {"arguments": '{"k": "' + "v" * 90 + '"}'}}],
    }
    tool = {"role": "tool", "tool_call_id": "c", "content": "z" * 40}
    content = texts([{"role": "user", "content": "u"}, item, tool])
    got = Edit(trims=((digest([content[2]]), 7),)).apply(rec(Kind.CHAT, content))
    assert orjson.loads(got.content[2])["content"] == "z" * 7
    assert got.content[:2] == content[:2]  # the arguments, and the other items, as they were


def test_token_and_text_cuts_are_trailing():
    blocks = replace(rec(Kind.BLOCKS, list(range(10))), block_size=16, input_tokens=150)
    got = Edit(cuts=(("r", 4),)).apply(blocks)
    assert (got.content, got.input_tokens) == ([0, 1, 2, 3], 64)
    assert Edit(cuts=(("r", 9),)).apply(blocks).input_tokens == 144
    assert Edit(cuts=(("other", 1),)).apply(blocks) is blocks  # untouched: the same record
    text = Edit(cuts=(("r", 3),)).apply(rec(Kind.TEXT, "abcdef"))
    assert text.content == "abc"


def test_max_tokens_caps_every_spelling_and_adds_one_where_missing():
    assert capped({"max_tokens": 100, "min_tokens": 50}, Kind.CHAT, 4) == {
        "max_tokens": 4,
        "min_tokens": 4,
    }
    assert capped({"max_completion_tokens": 2}, Kind.CHAT, 4) == {"max_completion_tokens": 2}
    assert capped({}, Kind.RESPONSES, 8) == {"max_output_tokens": 8}
    assert capped({}, Kind.MESSAGES, 8) == {"max_tokens": 8}


def test_an_edit_is_canonical_text_and_parses_back():
    e = Edit(max_tokens=3, cuts=(("b", 2), ("a", 5)), drop=("x", "w"), trims=(("t", 1),))
    assert e.text() == (
        '{"cuts":[["a",5],["b",2]],"drop":["w","x"],"max_tokens":3,"trims":[["t",1]]}'
    )
    assert Edit.parse(e.text()).text() == e.text()
    assert Edit().text() == "" and Edit.parse("") == Edit()
    assert e.cut("a", 1).text() == Edit(3, (("b", 2), ("a", 1)), e.drop, e.trims).text()


def test_the_line_for_people():
    report = {
        "request": "r",
        "context": {
            "unit": "block",
            "crashes_at": {"units": 20, "prompt_tokens": 327_680, "tokens_from": "trace"},
            "quiet_at": {"units": 19, "prompt_tokens": 327_168, "tokens_from": "trace"},
        },
    }
    assert (
        threshold_line(report)
        == "crashes at >= 327,680 prompt tokens, not at 327,168 prompt tokens"
    )
