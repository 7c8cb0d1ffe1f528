"""Joins found from recorded bodies: a sub-agent's first request joins on the
parent request whose tool call carried its prompt (fan-out), the parent's
request whose tool result carries the sub-agent's final answer joins on the
sub-agent's last request (fan-in), in the three APIs; and nothing is joined
on text that is short, unknown yet, ambiguous, the session's own, inside a
word, no longer the sub-agent's last word, or only in earlier turns."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from replayer.record.sessions import JOIN_MIN_CHARS, SessionTracker, TextIndex

pytestmark = pytest.mark.inprocess

SYSTEM = {"role": "system", "content": "You are the lead agent."}
TASK = {"role": "user", "content": "Fix the failing build in the repository."}
PROMPT = "Find every caller of parse_config in src/ and list the files with line numbers."
ANSWER = "parse_config is called in src/app.py:12, src/cli.py:40 and src/jobs/run.py:7."


def call(name: str, args: dict[str, Any], cid: str) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
    }


def chat_run(tracker: SessionTracker, answer: str = ANSWER, wrap: str = "{}") -> dict[str, Any]:
    """Parent turn 0 launches a sub-agent (Task tool), the sub-agent takes two
    turns, the parent's turn 1 carries its answer: the assignments by name."""
    out: dict[str, Any] = {}
    parent = [SYSTEM, TASK]
    out["p0"] = tracker.assign("p0", {"messages": parent})
    launch = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("Task", {"prompt": PROMPT}, "c1")],
    }
    tracker.complete("p0", launch, ok=True)
    sub = [
        {"role": "system", "content": "You are a search agent."},
        {"role": "user", "content": PROMPT},
    ]
    out["s0"] = tracker.assign("s0", {"messages": sub})
    grep = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("grep", {"q": "parse_config"}, "g1")],
    }
    tracker.complete("s0", grep, ok=True)
    sub = [*sub, grep, {"role": "tool", "tool_call_id": "g1", "content": "src/app.py:12: ..."}]
    out["s1"] = tracker.assign("s1", {"messages": sub})
    tracker.complete("s1", {"role": "assistant", "content": answer}, ok=True)
    result = {"role": "tool", "tool_call_id": "c1", "content": wrap.format(answer)}
    parent = [*parent, launch, result]
    out["p1"] = tracker.assign("p1", {"messages": parent})
    done = {"role": "assistant", "content": "Fixed: the three callers now pass a path."}
    tracker.complete("p1", done, ok=True)
    parent = [*parent, done, {"role": "user", "content": "thanks, now run the tests"}]
    out["p2"] = tracker.assign("p2", {"messages": parent})
    return out


def test_chat_fan_out_and_fan_in():
    a = chat_run(SessionTracker())
    assert (a["p0"].after, a["s1"].after, a["p2"].after) == (None, None, None)
    assert a["s0"].after == ["p0"] and a["s0"].joins == (("p0", "prompt"),)
    assert a["s0"].session_id == "s-s0" and a["s0"].turn == 0
    assert a["p1"].after == ["s1"] and a["p1"].joins == (("s1", "result"),)
    # the join does not move the request out of its session
    assert (a["p1"].session_id, a["p1"].turn, a["p1"].parent) == ("s-p0", 1, "p0")


@pytest.mark.parametrize(
    "wrap",
    ["{}", "  {}\n", "Sub-agent result:\n{}\n(agentId: a1)", "<result>{}</result>", '"{}"'],
)
def test_an_answer_wrapped_in_the_result_still_joins(wrap):
    assert chat_run(SessionTracker(), wrap=wrap)["p1"].after == ["s1"]


@pytest.mark.parametrize(
    ("answer", "wrap"),
    [
        ("Done: all tests pass now.", "{}"),  # too short to name anything
        (ANSWER, "x{}"),  # inside a word
        (ANSWER, ANSWER[:-2]),  # only part of it
    ],
)
def test_no_join_on_short_partial_or_mid_word_text(answer, wrap):
    a = chat_run(SessionTracker(), answer=answer, wrap=wrap)
    assert a["p1"].after is None and a["s0"].after == ["p0"]


def test_no_join_before_the_answer_is_known_or_once_the_sub_agent_went_on():
    tracker = SessionTracker()
    sub = [{"role": "user", "content": "Search the repo for every caller of parse_config."}]
    tracker.assign("s0", {"messages": sub})
    parent = [TASK, {"role": "assistant", "tool_calls": [call("Task", {"x": 1}, "c1")]}]
    result = {"role": "tool", "tool_call_id": "c1", "content": ANSWER}
    # s0 is still in flight: its answer is not known
    assert tracker.assign("p-early", {"messages": [*parent, result]}).after is None
    tracker.complete("s0", {"role": "assistant", "content": ANSWER}, ok=True)
    # the sub-agent's session went on past that answer: it was not its last word
    more = [*sub, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "more"}]
    tracker.assign("s1", {"messages": more})
    assert tracker.assign("p-late", {"messages": [TASK, parent[1], result]}).after is None


def test_failed_replies_and_answers_with_tool_calls_are_not_final():
    tracker = SessionTracker()
    tracker.assign("s0", {"messages": [{"role": "user", "content": "one"}]})
    tracker.complete("s0", {"role": "assistant", "content": ANSWER}, ok=False)
    tracker.assign("t0", {"messages": [{"role": "user", "content": "two"}]})
    with_call = {"role": "assistant", "content": ANSWER, "tool_calls": [call("f", {}, "c")]}
    tracker.complete("t0", with_call, ok=True)
    result = {"role": "tool", "tool_call_id": "c1", "content": ANSWER}
    parent = [TASK, {"role": "assistant", "tool_calls": [call("Task", {}, "c1")]}, result]
    assert tracker.assign("p", {"messages": parent}).after is None


def test_the_same_answer_from_two_exchanges_is_ambiguous():
    tracker = SessionTracker()
    for rid in ("s0", "t0"):
        tracker.assign(rid, {"messages": [{"role": "user", "content": f"go {rid}"}]})
        tracker.complete(rid, {"role": "assistant", "content": ANSWER}, ok=True)
    result = {"role": "tool", "tool_call_id": "c1", "content": ANSWER}
    parent = [TASK, {"role": "assistant", "tool_calls": [call("Task", {}, "c1")]}, result]
    assert tracker.assign("p", {"messages": parent}).after is None


def test_own_session_and_old_results_do_not_join():
    tracker = SessionTracker()
    a0 = tracker.assign("a0", {"messages": [TASK]})
    reply = {"role": "assistant", "content": ANSWER}
    tracker.complete("a0", reply, ok=True)
    # its own answer echoed back by a tool in the same session
    echo = [TASK, reply, {"role": "user", "content": "cat notes"}]
    e = tracker.assign("a1", {"messages": echo})
    assert e.session_id == a0.session_id and e.after is None
    # a session named by a header: its own latest answer in a tool result
    tracker.assign("h0", {"messages": [{"role": "user", "content": "go"}]}, "H")
    tracker.complete("h0", {"role": "assistant", "content": ANSWER + "!"}, ok=True)
    mine = [{"role": "tool", "tool_call_id": "c", "content": ANSWER + "!"}]
    assert tracker.assign("o1", {"messages": mine}, "O").after == ["h0"]
    assert tracker.assign("h1", {"messages": mine}, "H").after is None
    # a result that joined once is history for the turns after it
    a = chat_run(SessionTracker())
    assert a["p1"].after == ["s1"] and a["p2"].after is None


def test_fan_out_needs_a_first_turn_and_the_whole_prompt():
    tracker = SessionTracker()
    tracker.assign("p0", {"messages": [TASK]})
    launch = {"role": "assistant", "tool_calls": [call("Task", {"prompt": PROMPT}, "c1")]}
    tracker.complete("p0", launch, ok=True)
    half = tracker.assign("h0", {"messages": [{"role": "user", "content": PROMPT[:40]}]})
    assert half.after is None
    # the prompt wrapped in a reminder block, as Claude Code sends it
    blocks = [{"type": "text", "text": "<system-reminder>be brief</system-reminder>"}]
    blocks.append({"type": "text", "text": PROMPT})
    first = tracker.assign(
        "s0", {"messages": [{"role": "user", "content": blocks}]}, api="messages"
    )
    assert first.after == ["p0"]


def test_messages_api_task_tool():
    tracker = SessionTracker()
    parent: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "fix the build"}]}]
    tracker.assign("p0", {"messages": parent}, api="messages")
    use = {"type": "tool_use", "id": "toolu_1", "name": "Task", "input": {"prompt": PROMPT}}
    launch = {"role": "assistant", "content": [{"type": "text", "text": "Delegating."}, use]}
    tracker.complete("p0", launch, ok=True)
    sub = [{"role": "user", "content": PROMPT}]
    assert tracker.assign("s0", {"messages": sub}, api="messages").after == ["p0"]
    tracker.complete(
        "s0", {"role": "assistant", "content": [{"type": "text", "text": ANSWER}]}, ok=True
    )
    content = [{"type": "text", "text": ANSWER}, {"type": "text", "text": "agentId: a1f"}]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": content}
    p1 = tracker.assign(
        "p1", {"messages": [*parent, launch, {"role": "user", "content": [result]}]}, api="messages"
    )
    assert (p1.after, p1.session_id, p1.turn) == (["s0"], "s-p0", 1)


def test_responses_api_agent_as_tool():
    tracker = SessionTracker()
    parent: list[Any] = [{"type": "message", "role": "user", "content": "fix the build"}]
    tracker.assign("p0", {"input": parent}, api="responses")
    fc = {
        "type": "function_call",
        "call_id": "fc1",
        "name": "searcher",
        "arguments": orjson.dumps({"input": PROMPT}).decode(),
    }
    tracker.complete("p0", [fc], ok=True)
    assert tracker.assign("s0", {"input": PROMPT}, api="responses").after == ["p0"]
    msg = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": ANSWER}],
    }
    tracker.complete("s0", [msg], ok=True)
    out = {"type": "function_call_output", "call_id": "fc1", "output": ANSWER}
    p1 = tracker.assign("p1", {"input": [*parent, fc, out]}, api="responses")
    assert (p1.after, p1.session_id) == (["s0"], "s-p0")


def test_parallel_sub_agents_each_join():
    tracker = SessionTracker()
    answers = [f"{ANSWER} (part {k})" for k in range(3)]
    for k, text in enumerate(answers):
        tracker.assign(f"s{k}", {"messages": [{"role": "user", "content": f"part {k}"}]})
        tracker.complete(f"s{k}", {"role": "assistant", "content": text}, ok=True)
    calls = [call("Task", {}, f"c{k}") for k in range(3)]
    results = [{"role": "tool", "tool_call_id": f"c{k}", "content": answers[k]} for k in (2, 0, 1)]
    p = tracker.assign(
        "p", {"messages": [TASK, {"role": "assistant", "tool_calls": calls}, *results]}
    )
    assert p.after == ["s2", "s0", "s1"]


def test_text_index_finds_exact_containment_and_forgets_oldest():
    idx = TextIndex(memory=2)
    texts = [f"{k} " + "the quick brown fox jumps over the lazy dog" for k in range(3)]
    for k, t in enumerate(texts):
        idx.add(t, f"r{k}")
    idx.add("x" * (JOIN_MIN_CHARS - 1), "short")
    assert idx.find("say: " + texts[2] + ".") == ["r2"]
    assert idx.find(texts[1] + "\n" + texts[2]) == ["r1", "r2"]
    assert idx.find(texts[0]) == []  # forgotten: memory 2
    assert idx.find("x" * 64) == []
    assert idx.find(texts[2][:-1]) == []


# -- through the recording proxy, with the Anthropic SDK, and replayed --------


class SubAgentUpstream:
    """A Messages server whose reply follows from the body: the lead's first
    turn launches a sub-agent (Task tool), the sub-agent greps then answers,
    the lead finishes. It logs each request's start and end by name."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.url = ""
        self._runner: Any = None

    @staticmethod
    def name(body: dict[str, Any]) -> str:
        first = body["messages"][0]["content"]
        lead = first == "fix the build, delegate the search"
        return ("p" if lead else "s") + str((len(body["messages"]) - 1) // 2)

    async def start(self) -> SubAgentUpstream:
        from aiohttp import web

        async def messages(request: web.Request) -> web.Response:
            body = await request.json()
            name = self.name(body)
            self.log.append(("start", name))
            tool = {"type": "tool_use", "id": "toolu_" + name}
            content: list[Any] = {
                "p0": [{**tool, "name": "Task", "input": {"prompt": PROMPT}}],
                "s0": [{**tool, "name": "grep", "input": {"q": "parse_config"}}],
                "s1": [{"type": "text", "text": ANSWER}],
            }.get(name, [{"type": "text", "text": "Fixed."}])
            stop = "tool_use" if content[0]["type"] == "tool_use" else "end_turn"
            reply = {
                "id": "msg_" + name, "type": "message", "role": "assistant", "model": "m",
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 5},
            }  # fmt: skip
            self.log.append(("end", name))
            return web.json_response(reply)

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

        app = web.Application()
        app.router.add_post("/v1/messages", messages)
        app.router.add_get("/v1/models", models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()


async def lead_with_sub_agent(url: str) -> None:
    """What Claude Code does: the lead's Task call runs a sub-agent to its
    answer, which goes back to the lead as the tool result."""
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-test", max_retries=0)
    try:
        lead: list[Any] = [{"role": "user", "content": "fix the build, delegate the search"}]
        kw: dict[str, Any] = {"model": "m", "max_tokens": 64}
        r = await client.messages.create(messages=lead, **kw)
        task = r.content[0].model_dump(exclude_none=True)
        sub: list[Any] = [{"role": "user", "content": task["input"]["prompt"]}]
        r = await client.messages.create(messages=sub, **kw)
        grep = r.content[0].model_dump(exclude_none=True)
        sub += [{"role": "assistant", "content": [grep]}]
        sub += [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": grep["id"], "content": "src/app.py:12"}
        ]}]  # fmt: skip
        r = await client.messages.create(messages=sub, **kw)
        answer = [
            {"type": "text", "text": r.content[0].text},
            {"type": "text", "text": "agentId: 1"},
        ]
        lead += [{"role": "assistant", "content": [task]}]
        lead += [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": task["id"], "content": answer}
        ]}]  # fmt: skip
        await client.messages.create(messages=lead, **kw)
    finally:
        await client.close()


async def test_recorded_sub_agent_joins_and_replay_waits_for_them(proxy_factory, tmp_path):
    import asyncio
    import contextlib
    import io

    from replayer.cli import main
    from replayer.trace.reader import Trace

    up = await SubAgentUpstream().start()
    try:
        proxy = await proxy_factory(up.url)
        await lead_with_sub_agent(proxy.url)
        await proxy.stop()
        t = Trace.open(proxy.config.output)
        rows = {SubAgentUpstream.name(t.body(r)): r for r in t.order}
        rid = {n: t.column("request_id")[r] for n, r in rows.items()}
        after = {n: t.record(r).after for n, r in rows.items()}
        assert after == {"p0": None, "s0": [rid["p0"]], "s1": None, "p1": [rid["s1"]]}
        assert t.meta(rows["p1"])["joins"] == {rid["s1"]: "result"}
        assert t.meta(rows["s0"])["joins"] == {rid["p0"]: "prompt"}
        sessions = {n: t.column("session_id")[r] for n, r in rows.items()}
        assert sessions["p0"] == sessions["p1"] != sessions["s0"] == sessions["s1"]

        # replayed as fast as each session allows: without the joins the
        # sub-agent's first turn would go out with the lead's first, and the
        # lead's second right after its first
        up.log.clear()
        out, err = io.StringIO(), io.StringIO()

        def replay() -> int:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                return main([
                    "replay", str(proxy.config.output), "--target", up.url, "--timing", "asap",
                    "--order", "session", "--no-force-stream", "--out", str(tmp_path / "run"),
                ])  # fmt: skip

        assert await asyncio.to_thread(replay) == 0, err.getvalue()
        assert up.log == [
            ("start", "p0"), ("end", "p0"), ("start", "s0"), ("end", "s0"),
            ("start", "s1"), ("end", "s1"), ("start", "p1"), ("end", "p1"),
        ]  # fmt: skip
    finally:
        await up.stop()
