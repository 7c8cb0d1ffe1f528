"""The simulated engine, driven step by step in-process (no simulated time):
prefix caching, batching limits, chunked prefill, preemption, fault hooks."""

from __future__ import annotations

import pytest

from replayer.emulator.config import EmulatorConfig
from replayer.emulator.engine import Engine
from replayer.emulator.faults import FaultPlan
from replayer.emulator.metrics import Metrics
from replayer.emulator.requestlog import RequestLog
from tests.helpers.engine import add, make

pytestmark = pytest.mark.inprocess


def drain(e: Engine, limit: int = 10_000) -> int:
    steps = 0
    while not e.idle and steps < limit:
        e.step()
        steps += 1
    assert e.idle
    return steps


def test_prefix_hit_is_block_aligned_and_stops_short_of_the_whole_prompt():
    e = make()
    a = add(e, list(range(100)))
    assert a.num_cached == 0
    drain(e)
    again = add(e, list(range(100)))
    assert again.num_cached == 96  # 6 full blocks; block 7 is partial
    exact = add(e, list(range(96)))
    assert exact.num_cached == 80  # all 6 blocks cached, but one token must be recomputed
    longer = add(e, list(range(100)) + [7] * 50)
    assert longer.num_cached == 96
    other = add(e, [5] + list(range(1, 100)))
    assert other.num_cached == 0
    assert e.queries == 100 + 100 + 96 + 150 + 100 and e.hits == 96 + 80 + 96


def test_prefix_caching_off():
    e = make(enable_prefix_caching=False)
    add(e, list(range(64)))
    drain(e)
    assert add(e, list(range(64))).num_cached == 0


def test_requests_generate_max_tokens_and_finish():
    e = make()
    r = add(e, list(range(10)), max_tokens=5)
    steps = drain(e)
    assert steps == 5 and r.num_output == 5 and r.finish == "length"
    out = r.take()
    assert (out.start, out.tokens, out.finish) == (0, 5, "length")
    assert e.pool.num_used == 0


def test_max_num_seqs_keeps_the_rest_waiting():
    e = make(max_num_seqs=2)
    reqs = [add(e, list(range(i * 100, i * 100 + 20)), max_tokens=3) for i in range(3)]
    batch = e.step()
    assert [r.n for r, _ in batch] == [1, 2]
    assert (len(e.running), len(e.waiting)) == (2, 1)
    e.step()
    e.step()  # 1 and 2 finish; 3 starts in the next step
    assert reqs[0].finish == reqs[1].finish == "length" and reqs[2].phase == "waiting"
    assert [r.n for r, _ in e.step()] == [3]


def test_chunked_prefill_respects_the_token_budget():
    e = make(max_num_batched_tokens=32)
    r = add(e, list(range(100)), max_tokens=2)
    sizes = [n for _ in range(4) for (_, n) in e.step()]
    assert sizes == [32, 32, 32, 4]
    assert r.num_output == 1  # the first token comes with the last chunk
    late = add(e, list(range(500, 540)), max_tokens=1)
    batch = e.step()
    assert [(q.n, n) for q, n in batch] == [(1, 1), (2, 31)]  # decode first, then prefill
    assert late.num_output == 0


def test_blocks_register_as_prefill_chunks_complete():
    e = make(max_num_batched_tokens=32)
    add(e, list(range(100)), max_tokens=50)
    e.step()  # 32 tokens computed: two full blocks are now cached
    assert add(e, list(range(100))).num_cached == 32


def test_preemption_recomputes_the_latest_request(tmp_path):
    log = tmp_path / "r.jsonl"
    e = make(num_gpu_blocks=8, faults=["dead when preemption>=1"], log=log)
    a = add(e, list(range(60)), max_tokens=20)
    b = add(e, list(range(100, 160)), max_tokens=20)
    steps = 0
    while e.preemptions == 0 and steps < 20:
        e.step()
        steps += 1
    # 8 blocks: 4 + 4 for the two prompts; a needs a 5th to compute its 65th
    # token, so b (the latest) is preempted then - and the fault kills that step.
    assert e.preemptions == 1 and b.preemptions == 1 and a.preemptions == 0
    assert a.num_computed == 64 and b.phase == "waiting" and list(e.waiting) == [b]
    assert b.num_computed == 0 and b.blocks == []
    import json

    lines = [json.loads(x) for x in log.read_text().splitlines()]
    pre = [x for x in lines if x["event"] == "preemption"]
    trig = [x for x in lines if x["event"] == "trigger"]
    assert [(p["n"], p["preemptions"]) for p in pre] == [(2, 1)]
    assert [(t["n"], t["on"], t["fired"], t["values"]) for t in trig] == [
        (2, "preemption", True, {"preemption": 1})
    ]
    # The effect (engine death) hit the batch that needed the preemption.
    assert e.sink.applied == [("dead", 2, ["r1"])] and e.dead


def test_preempted_request_resumes_with_its_cached_prefix():
    e = make(num_gpu_blocks=8)
    a = add(e, list(range(60)), max_tokens=20)
    b = add(e, list(range(100, 160)), max_tokens=20)
    drain(e)
    assert a.finish == b.finish == "length" and b.preemptions >= 1
    assert a.num_output == b.num_output == 20


def test_sessions_and_turns():
    e = make()
    got = [add(e, [i], session=s) for i, s in enumerate(["a", "b", "a", None, "c", "b"])]
    assert [(r.session_index, r.turn) for r in got] == [
        (1, 1),
        (2, 1),
        (1, 2),
        (0, 0),
        (3, 1),
        (2, 2),
    ]


def test_error_effect_fails_only_its_request():
    e = make(faults=["error when request=2"])
    a, b, c = (add(e, list(range(i, i + 20)), max_tokens=2) for i in (0, 100, 200))
    drain(e)
    assert (a.finish, b.error, c.finish) == ("length", "internal", "length")
    assert b.take().error == "internal"
    # Applied once the batch after b's arrival was scheduled: a, b and c in it.
    assert e.sink.applied == [("error", 2, ["r1", "r2", "r3"])]
    assert e.metrics.success["error"]._value.get() == 1


def test_abort_frees_blocks():
    e = make()
    r = add(e, list(range(40)), max_tokens=10)
    e.step()
    assert e.pool.num_used == 3
    e.abort(r)
    assert e.pool.num_used == 0 and e.idle and r.phase == "finished"


def test_step_time_model_and_slow_down():
    c = EmulatorConfig(decode_time=0.1, prefill_rate=100, batch_slowdown=0.5, speed=2.0)
    e = Engine(c, Metrics(c), FaultPlan([]), RequestLog(None))
    dec1, dec2 = add(e, list(range(20))), add(e, list(range(100, 120)))
    pre = add(e, list(range(200, 260)))
    for r in (dec1, dec2):
        r.num_computed = r.prompt_len  # decoding
    batch = [(dec1, 1), (dec2, 1), (pre, 50)]
    # (0.1 * (1 + 0.5 * (2 - 1)) + 50 / 100) / speed 2
    assert abs(e._step_time(batch) - 0.325) < 1e-9
    e.slow_down(10, 0.2, None)
    assert abs(e._step_time(batch) - (3.25 + 0.2)) < 1e-9
    instant = make()
    instant.slow_down(10, 0.2, None)
    assert instant._step_time(batch) == 0.2  # only the added delay survives --speed instant
