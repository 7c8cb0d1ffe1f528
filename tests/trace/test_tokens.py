"""Token synthesis for blocks payloads: deterministic, shared by hash id,
regenerable from the documented construction alone."""

from __future__ import annotations

import hashlib
import struct

import orjson
import pytest

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
