"""The failing request is the one the server was processing when it failed,
by the server's own evidence (an injected fault's record, the scheduler dump
of the failing step), not the first request whose stream reported it: an
engine death reaches every stream in flight at once."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from replayer import api as rapi
from replayer.bundle.export import write_bundle
from replayer.monitor.logs import iter_lines
from replayer.monitor.signature import failing_request, signature_from_log
from replayer.options import ReplayPolicy, Server, WatchConfig
from replayer.replay.summary import name_failing, render
from tests.helpers.net import free_port
from tests.helpers.traces import chat, write

QUICK = WatchConfig(health_interval=0.2, settle=1.0, grace=0.5)


def _dump(new: list[str], cached: list[str]) -> str:
    reqs = ", ".join(
        f"NewRequestData(req_id=chatcmpl-{r}-0123abcd,prompt_token_ids_len=9,"
        "num_computed_tokens=0,lora_request=None)"
        for r in new
    )
    ids = [f"chatcmpl-{r}-0123abcd" for r in cached]
    return (
        "(EngineCore pid=7) ERROR 12-06 10:09:29 [dump_input.py:76] Dumping scheduler output "
        f"for model execution: SchedulerOutput(scheduled_new_reqs=[{reqs}], "
        f"scheduled_cached_reqs=CachedRequestData(req_ids={ids}, "
        f"num_computed_tokens={[5] * len(cached)}), num_scheduled_tokens={{}})\n"
    )


def _fault(rid: str, *, fired: bool = True, effect: str = "raise") -> str:
    rec = {"effect": effect, "fired": fired, "request_id": f"chatcmpl-{rid}-0123abcd", "step": 9}
    return f"(Worker pid=8) replayer-fault: {json.dumps(rec, sort_keys=True)}\n"


KNOWN = ("r1", "r2", "r3", "r4")


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("log", "named"),
    [
        # the step that failed first scheduled r3; r1 and r2 ran through earlier steps
        (_dump(["r3"], ["r1", "r2"]), ("r3", "scheduler dump")),
        # a batch of one
        (_dump([], ["r2"]), ("r2", "scheduler dump")),
        # two arrived together: either could be it, so the dump names none
        (_dump(["r3", "r4"], ["r1"]), None),
        (_dump([], ["r1", "r2"]), None),
        # the fault's own record wins over the dump; a decision that did not
        # fire, and a slow-down, name nothing
        (_fault("r2") + _dump(["r3", "r4"], ["r1"]), ("r2", "fault")),
        (
            _fault("r1", fired=False) + _fault("r4", effect="slow") + _dump(["r3"], []),
            ("r3", "scheduler dump"),
        ),
        ("no evidence at all\n", None),
    ],
)
def test_the_server_log_names_the_failing_request(log, named):
    assert failing_request(list(iter_lines(log)), KNOWN) == named
    sig = signature_from_log(log, failure_class="engine_dead", request_ids=KNOWN)
    assert (sig.failing, sig.failing_evidence) == (named or (None, None))
    # not part of what "the same crash" means
    again = signature_from_log(
        _dump(["r1"], []) if named else log, failure_class="engine_dead", request_ids=KNOWN
    )
    assert again.log_hash == sig.log_hash or named is None or "replayer-fault" in log


@pytest.mark.inprocess
def test_the_named_request_takes_the_first_seen_ones_place():
    sig = signature_from_log(_dump(["r3"], ["r1", "r2"]), failure_class="engine_dead")
    f = {"request_id": "r1", "seq": 1, "request_from": "client", "inflight": ["r2", "r3"]}
    name_failing(f, sig, {"r1": 1, "r2": 2, "r3": 3})
    assert (f["request_id"], f["seq"], f["request_from"]) == ("r3", 3, "scheduler dump")
    assert (f["first_seen_on"], f["inflight"]) == ("r1", ["r1", "r2"])
    assert f["signature"]["failing_request"] == "r3"
    # a request this run never sent is no evidence about it
    g = {"request_id": "r1", "seq": 1, "request_from": "client", "inflight": ["r2"]}
    name_failing(g, sig, {"r1": 1, "r2": 2})
    assert (g["request_id"], g["request_from"], g["inflight"]) == ("r1", "client", ["r2"])


def _line(f):
    summary = {"targets": {"t": {**EMPTY, "failure": f}}}
    return render(summary).splitlines()[1]


EMPTY = {
    "failed": True,
    "sent": 3,
    "requests": 3,
    "status": {},
    "ttft_ms": {"n": 0},
    "e2e_ms": {"n": 0},
    "lag_ms": {"n": 0},
    "throughput_rps": None,
}


@pytest.mark.inprocess
def test_the_summary_says_what_named_the_request():
    base = {"kind": "stream_error", "at_s": 1.0, "message": "dead", "seq": 3, "class": "x"}
    server = {**base, "request_id": "r3", "request_from": "scheduler dump", "inflight": ["r1"]}
    assert _line(server) == (
        "  failure [x]: stream_error at 1.000 s on request r3 (#3), by the only request the "
        "failing step first scheduled (vLLM's scheduler dump): dead"
    )
    client = {**base, "request_id": "r1", "request_from": "client", "inflight": ["r3"]}
    assert (
        _line(client)
        == "  failure [x]: stream_error at 1.000 s first seen on request r1 (#3): dead"
    )
    alone = {**client, "inflight": []}
    assert _line(alone) == "  failure [x]: stream_error at 1.000 s on request r1 (#3): dead"


def _concurrent(tmp_path):
    """Three sessions: each has a short first turn, then a long second turn;
    the third session's second turn (the sixth request) arrives while the
    other two stream."""
    msgs = [{"role": "user", "content": "hello there " * 40}]
    more = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    recs = [
        chat("rec-000001", "a", 0, msgs, start=0, max_tokens=2),
        chat("rec-000002", "b", 0, msgs, start=30_000, max_tokens=2),
        chat("rec-000003", "c", 0, msgs, start=60_000, max_tokens=2),
        chat("rec-000004", "a", 1, more, start=400_000, max_tokens=300),
        chat("rec-000005", "b", 1, more, start=500_000, max_tokens=300),
        chat("rec-000006", "c", 1, more, start=600_000, max_tokens=300),
    ]
    return write(tmp_path / "t.arrow", recs)


FAULTY = ["--served-model-name", "m", "--fault", "dead when request=6"]


def test_concurrent_sessions_name_the_request_the_server_failed_on(tmp_path):
    """The sixth request triggers the fault: the engine's death reaches all
    three streams at once; the replay names the trigger and lists the other
    two in flight."""
    trace = _concurrent(tmp_path)
    port = str(free_port())
    cmd = shlex.join([sys.executable, "-m", "replayer.emulator", "--port", port, *FAULTY])
    res = rapi.replay_sync(
        trace,
        server=Server(launch=cmd),
        policy=ReplayPolicy(timing="recorded"),
        out=tmp_path / "run",
        watch=QUICK,
        say=lambda m: None,
    )
    f = json.loads((tmp_path / "run" / "summary.json").read_text())["targets"]["target"]["failure"]
    assert f["class"] == "engine_dead"
    assert (f["request_id"], f["request_from"]) == ("rec-000006", "scheduler dump"), f
    assert sorted(f["inflight"]) == ["rec-000004", "rec-000005"]
    # whichever stream reported the death first (timing decides) is kept apart
    assert f.get("first_seen_on") in (None, "rec-000004", "rec-000005")
    assert f["seq"] == 5  # dispatch order, from 0
    assert "on request rec-000006 (#5), by the only request" in render(dict(res.summary))


def test_repro_py_names_every_request_in_flight_and_calls_none_the_trigger(
    tmp_path, emulator_factory
):
    """repro.py has no server log: it names the requests in flight when the
    failure came, the first to report it apart, and leaves the verdict to
    the server's log."""
    trace = _concurrent(tmp_path)
    b = write_bundle(
        tmp_path / "bundle",
        trace=trace,
        trace_sha256="x" * 64,
        rows=trace.order,
        manifest={"policy": {"timing": "recorded"}, "signature": None, "prefix_length": 6},
        trials=[],
    )
    emu = emulator_factory(FAULTY)
    run = subprocess.run(
        [sys.executable, "-I", "-S", str(b / "repro.py"), "--url", emu.url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert run.returncode == 1, run.stdout + run.stderr
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith(
        "SERVER FAILED: failure while 3 requests were in flight: "
        "rec-000004, rec-000005, rec-000006 (in send order); first seen on rec-00000"
    ), last
    assert "which one the server was processing, its log says" in last
