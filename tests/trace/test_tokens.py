"""Token synthesis for blocks payloads: deterministic, shared by hash id,
regenerable from the documented construction alone."""

from __future__ import annotations

import hashlib
import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayer.trace.tokens import (
    BlockPrompts,
    TokenSpace,
    approx_message_tokens,
    approx_text_tokens,
)

pytestmark = pytest.mark.inprocess


def documented_block(salt: str, key: str, size: int, lo: int, hi: int) -> list[int]:
    """The construction as the module docstring states it (what repro.py will do)."""
    raw = hashlib.shake_128(f"{salt}:{key}:{size}".encode()).digest(4 * size)
    return [lo + v % (hi - lo) for v in struct.unpack(f"<{size}I", raw)]


def test_block_tokens_follow_the_documented_construction():
    space = TokenSpace()
    assert space.block(7, 16) == documented_block("replayer", "7", 16, 10_000, 32_000)
    assert space.block(7, 16, "trace_0001") == documented_block(
        "replayer", "trace_0001:7", 16, 10_000, 32_000
    )
    assert space.block(7, 16, "trace_0001") != space.block(7, 16, "trace_0002")
    assert space.block(7, 16) == space.block(7, 16)
    assert space.block(7, 16) != space.block(8, 16)
    assert all(10_000 <= t < 32_000 for t in space.block(123456789, 512))
    other = TokenSpace(lo=100, hi=200, salt="x")
    assert other.block(7, 16) == documented_block("x", "7", 16, 100, 200)


def test_golden_values_never_change():
    # Bundles regenerate prompts from ids: changing these breaks every old trace.
    assert TokenSpace().block(0, 4) == [23327, 29570, 16768, 27393]


def test_prompt_shapes():
    bp = BlockPrompts()
    s = bp.space
    # exact multiple of the block size
    assert bp.tokens([1, 2], 4, 8, "r") == s.block(1, 4) + s.block(2, 4)
    # Mooncake: the last block is partial, a prefix of its full block
    assert bp.tokens([1, 2], 4, 6, "r") == s.block(1, 4) + s.block(2, 4)[:2]
    # kv-cache-tester / Azure: tokens past the last block are unique to the request
    tail = bp.tokens([1], 4, 7, "r")
    assert tail[:4] == s.block(1, 4) and tail[4:] == s.tail("r", 3)
    assert bp.tokens([1], 4, 7, "r2")[4:] != tail[4:]
    assert bp.tokens([], 4, 3, "r") == s.tail("r", 3)


@pytest.mark.parametrize("ids,n", [([1, 2], 8), ([1, 2], 6), ([1], 7), ([], 5), ([], 0)])
def test_json_equals_serialized_tokens_and_length_is_predicted(ids, n):
    bp = BlockPrompts()
    text = bp.json(ids, 4, n, "req")
    assert text == orjson.dumps(bp.tokens(ids, 4, n, "req")).decode()
    assert bp.json_len(n) == len(text)


@settings(max_examples=150, deadline=None)
@given(
    turns=st.lists(
        st.tuples(
            st.integers(0, 3),  # which session
            st.integers(0, 12),  # blocks it keeps of its last prompt
            st.integers(0, 4),  # blocks it adds
            st.integers(0, 7),  # tokens past its last full block
        ),
        min_size=1,
        max_size=30,
    ),
    space=st.sampled_from([TokenSpace(), TokenSpace(lo=3, hi=1_000), TokenSpace(lo=0, hi=2**40)]),
    cache=st.sampled_from([0, 2_000, 1 << 20]),
)
def test_agent_sessions_build_the_derivation_bytes_through_any_cache(turns, space, cache):
    """Sessions that grow, cut back, fork and share a start, through caches
    that hold nothing, a prompt or two, or everything: always the bytes of
    the token-by-token derivation."""
    bp = BlockPrompts(space, cache_bytes=cache)
    ref = BlockPrompts(space)
    ctx: dict[int, list[int]] = {}
    fresh = iter(range(1_000, 10_000))
    for i, (s, keep, add, extra) in enumerate(turns):
        ids = [0, *ctx.get(s, [])[1:keep], *(next(fresh) for _ in range(add))]
        ctx[s] = ids
        n = 4 * len(ids) + extra if extra < 4 else 4 * (len(ids) - 1) + extra
        ns = "t" if s % 2 else None
        got = bp.json_bytes(ids, 4, max(n, 1), f"r{i}", ns)
        assert got == orjson.dumps(ref.tokens(ids, 4, max(n, 1), f"r{i}", ns))
    assert bp._prompts.size <= cache
    assert sum(bp.stats.values()) > 0


def test_a_turn_reuses_its_session_s_last_prompt():
    bp = BlockPrompts()
    bp.json_bytes(list(range(100)), 64, 6_400, "a")
    bp.json_bytes(list(range(100)) + [7, 8], 64, 6_500, "b")  # 101 whole blocks and 36 ids
    assert bp.stats == {"reused_blocks": 100, "drawn_blocks": 101}


def test_fixed_width_only_for_single_width_ranges():
    assert TokenSpace().fixed_width == 5
    assert TokenSpace(lo=5, hi=50).fixed_width is None
    assert BlockPrompts(TokenSpace(lo=5, hi=50)).json_len(3) is None


def test_empty_range_is_refused():
    with pytest.raises(ValueError, match="empty"):
        TokenSpace(lo=5, hi=5)


def test_text_approximation():
    assert approx_text_tokens("") == 0
    assert approx_text_tokens("abcd") == 1
    assert approx_text_tokens("abcde") == 2
    assert approx_text_tokens("ü") == 1  # two UTF-8 bytes
    assert approx_message_tokens({"role": "user", "content": "abcdefgh"}) == 6
    assert (
        approx_message_tokens(
            {"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]}
        )
        == 5
    )
    call = {"function": {"name": "ls", "arguments": '{"p":1}'}}
    assert (
        approx_message_tokens({"role": "assistant", "content": None, "tool_calls": [call]})
        == 4 + 1 + 2
    )


def _session(first: int, n: int = 10) -> list[int]:
    return [first, *range(first * 100 + 1, first * 100 + n)]


def _room_for(prompts: int) -> int:
    """A cache bound that holds ``prompts`` of :func:`_session`'s shape, not one more."""
    probe = BlockPrompts()
    probe.json_bytes(_session(1), 4, 40, "probe")
    return int((prompts + 0.5) * probe._prompts.size)


def test_the_prompt_built_again_soonest_stays_when_sessions_outgrow_the_cache():
    """A replay's schedule is known: with room for two of three sessions, the
    one whose next turn is farthest leaves, not the least recent (which an
    LRU would drop, just before its next turn)."""
    bp = BlockPrompts(cache_bytes=_room_for(2))
    key = {s: (None, 4, s) for s in (1, 2, 3)}
    plan = [1, 2, 3, 1, 3, 2]  # sessions by position
    bp.expect((key[s], pos) for pos, s in enumerate(plan))
    for pos, s in enumerate(plan):
        before = bp.stats["reused_blocks"]
        bp.json_bytes(_session(s, 10 + pos), 4, 4 * (10 + pos), f"r{pos}")
        bp.built(key[s], pos)
        reused = bp.stats["reused_blocks"] - before
        # 0, 1, 2: first turns. 3: session 1 kept (session 2, next at 5, left);
        # 4: session 3 kept; 5: session 2 was dropped, drawn again
        assert reused == [0, 0, 0, 10, 12, 0][pos], pos
    assert len(bp._prompts) == 0  # every planned build done: nothing is kept


def test_a_finished_session_s_prompts_leave_at_its_last_turn():
    bp = BlockPrompts()
    a, b = (None, 4, 1), ("ns", 4, 2)
    bp.expect([(a, 0), (b, 1), (a, 2)])
    bp.json_bytes(_session(1), 4, 40, "r0")
    bp.built(a, 0)
    bp.json_bytes(_session(2), 4, 40, "r1", "ns")
    bp.built(b, 1)
    assert len(bp._prompts) == 1  # b had one planned build
    bp.json_bytes(_session(1, 12), 4, 48, "r2")
    assert bp.stats["reused_blocks"] == 10
    bp.built(a, 2)
    assert len(bp._prompts) == 0


def test_builds_taken_back_leave_their_prompts_to_age_like_any():
    bp = BlockPrompts(cache_bytes=_room_for(1))
    a, b = (None, 4, 1), (None, 4, 2)
    bp.expect([(a, 0), (a, 5)])
    bp.json_bytes(_session(1), 4, 40, "r0")
    bp.built(a, 0)
    bp.expect([(a, 5)], -1)  # the replay stopped before position 5
    assert bp._prompts._pending == {}
    bp.json_bytes(_session(1), 4, 40, "again")
    assert bp.stats["reused_blocks"] == 10  # still kept, now unplanned
    bp.json_bytes(_session(2), 4, 40, "other")  # room for one: the oldest unplanned leaves
    assert [k for k, _ in bp._prompts._filed.values()] == [b]


def test_unplanned_prompts_leave_before_planned_ones():
    bp = BlockPrompts(cache_bytes=_room_for(2))
    planned, late = (None, 4, 1), (None, 4, 3)
    bp.expect([(planned, 0), (planned, 99)])
    bp.json_bytes(_session(1), 4, 40, "r0")
    bp.built(planned, 0)
    bp.json_bytes(_session(2), 4, 40, "loose")
    bp.json_bytes(_session(3), 4, 40, "late")
    # the planned prompt is the oldest and its next build the farthest; it stays
    assert sorted(k for k, _ in bp._prompts._filed.values()) == [planned, late]


def test_a_fork_ages_out_while_its_session_goes_on():
    """A prompt a later turn was cut short of (a compaction) stays beside the
    new one, but building from it does not make it recent: it leaves first."""
    bp = BlockPrompts(cache_bytes=_room_for(3))

    def kept() -> list[int]:
        return [len(p.ids) // 8 for _, p in bp._prompts._filed.values()]

    bp.json_bytes(_session(1, 20), 4, 80, "long")
    bp.json_bytes(_session(1, 10), 4, 40, "cut")  # a prefix of the long one
    assert kept() == [20, 10]
    bp.json_bytes(_session(1, 12), 4, 48, "next")  # built from the long one
    assert bp.stats["reused_blocks"] == 10 + 12
    assert kept() == [10, 12]  # no room for all three: the long one, filed first, left


@pytest.mark.parametrize("sessions,kept", [(1, [12]), (2, [10, 12])])
def test_a_key_keeps_one_prompt_for_each_session_that_builds_under_it(sessions, kept):
    """A session's compaction leaves a cut-short prompt; when the session is
    the key's only builder, the longer one it was cut from leaves at once."""
    bp = BlockPrompts()
    key = (None, 4, 1)
    bp.expect([(key, 0), (key, 1), (key, 2), (key, 9)], sessions={key: sessions})
    for pos, n in enumerate((20, 10, 12)):
        bp.json_bytes(_session(1, n), 4, 4 * n, f"r{pos}")
        bp.built(key, pos)
    assert [len(p.ids) // 8 for _, p in bp._prompts._filed.values()] == kept
