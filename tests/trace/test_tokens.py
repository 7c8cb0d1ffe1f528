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
