"""The tokenizer stand-in: counts equal the documented approximation exactly;
shared text means shared tokens; hashes chain."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replayer.emulator import tokenizer as tk
from replayer.trace.tokens import approx_message_tokens, approx_text_tokens

pytestmark = pytest.mark.inprocess

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=200)
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.just({"url": "x"})}),
)
calls = st.fixed_dictionaries(
    {
        "id": st.just("c1"),
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": texts, "arguments": texts}),
    }
)
messages = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool"]),
        "content": st.one_of(st.none(), texts, st.lists(parts, max_size=3)),
    },
    optional={"tool_calls": st.lists(calls, max_size=2)},
)


@given(texts)
def test_text_count_is_the_documented_approximation(text):
    assert tk.count(tk.text_stream(text)) == approx_text_tokens(text)


@given(messages)
def test_message_count_is_the_documented_approximation(message):
    assert tk.count(tk.message_stream(message)) == approx_message_tokens(message)


@given(st.lists(messages, min_size=1, max_size=5))
def test_chat_count_is_the_sum_over_messages(msgs):
    assert tk.count(tk.chat_stream(msgs)) == sum(approx_message_tokens(m) for m in msgs)


@given(st.lists(messages, min_size=2, max_size=5), st.integers(min_value=1, max_value=4))
def test_shared_messages_share_their_tokens(msgs, k):
    k = min(k, len(msgs) - 1)
    shared = sum(approx_message_tokens(m) for m in msgs[:k])
    a = tk.token_ids(tk.chat_stream(msgs[:k]))
    b = tk.token_ids(tk.chat_stream(msgs))
    assert b[:shared] == a


def test_text_piece_ids_are_the_utf8_bytes_little_endian():
    assert tk.token_ids(tk.text_stream("abcdef")) == [
        struct.unpack("<I", b"abcd")[0],
        struct.unpack("<I", b"ef\0\0")[0],
    ]


def test_message_framing_is_four_special_tokens():
    ids = tk.token_ids(tk.message_stream({"role": "user", "content": "abcd"}))
    assert len(ids) == 5
    assert ids[0] == tk.IM_START and ids[2] == tk.IM_MIDDLE and ids[-1] == tk.IM_END
    assert ids[1] == tk.role_id("user") != tk.role_id("assistant")
    assert all(i >= tk.SPECIAL_BASE for i in (ids[0], ids[1], ids[2], ids[4]))


def test_token_id_prompts_are_exact():
    assert tk.token_ids(tk.ids_stream([0, 1, 2**40, 7])) == [0, 1, 2**40, 7]


@given(st.text(alphabet=st.characters(exclude_characters="\0", exclude_categories=("Cs",))))
def test_detokenize_inverts_text(text):
    assert tk.detokenize(tk.token_ids(tk.text_stream(text))) == text


def test_detokenize_names_specials():
    ids = tk.token_ids(tk.message_stream({"role": "user", "content": "hi"}))
    assert tk.detokenize(ids).startswith("<|im_start|>")
    assert tk.detokenize(ids).endswith("hi<|im_end|>")


def test_block_hashes_chain_over_full_blocks_only():
    base = tk.ids_stream(list(range(40)))
    hashes = tk.block_hashes(base, 16)
    assert len(hashes) == 2  # 40 tokens: two full blocks, the tail is not hashed
    longer = tk.ids_stream(list(range(40)) + [99] * 30)
    assert tk.block_hashes(longer, 16)[:2] == hashes
    changed = tk.ids_stream([1000] + list(range(1, 40)))
    other = tk.block_hashes(changed, 16)
    # A change in block 0 changes every later hash (the chain), not just block 0.
    assert other[0] != hashes[0] and other[1] != hashes[1]
