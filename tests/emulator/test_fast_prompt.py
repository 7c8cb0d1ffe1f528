"""The emulator's fast read of token-id prompts agrees with the full parse on
every body it accepts, declines every body it cannot read exactly, and is
taken for the bodies replayer sends; its vectorized block hashes chain like
vLLM's (a block's hash names the whole prefix)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayer.emulator import tokenizer
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.parsing import fast_token_prompt, parse_generation, parse_json_body
from replayer.trace.tokens import BlockPrompts, TokenSpace

pytestmark = pytest.mark.inprocess

CT = "application/json"
CFG = EmulatorConfig()
MODEL = CFG.served_model_names[0]


def full(raw: bytes) -> bytes:
    return parse_generation(parse_json_body(raw, CT), False, CFG).stream_bytes


def test_replayer_blocks_bodies_take_the_fast_read() -> None:
    for space in (TokenSpace(), TokenSpace(lo=100_000, hi=200_000)):
        prompt = BlockPrompts(space).json([1, 2, 3], 64, 200, "r")
        raw = b'{"model":"%s","prompt":%s,"max_tokens":4}' % (MODEL.encode(), prompt.encode())
        fast = fast_token_prompt(raw, CT)
        assert fast is not None
        body, ids = fast
        assert ids == full(raw) and len(ids) == 8 * 200
        assert body == {"model": MODEL, "prompt": [0], "max_tokens": 4}


def test_bodies_it_cannot_read_exactly_are_left_to_the_full_parse() -> None:
    for raw in (
        b'{"prompt":[1,22,333]}',  # ids of several widths
        b'{"prompt":[ 11,22]}',  # whitespace
        b'{"prompt":[01,22]}',  # a leading zero: invalid JSON, vLLM's error decides
        b'{"prompt":[-1,22]}',
        b'{"prompt":[1.0,2.0]}',
        b'{"prompt":"[11,22]"}',
        b'{"x":{"prompt":[11,22]},"prompt":"hi"}',  # not the top-level prompt
        b'{"prompt":[11,22],"prompt":"hi"}',  # a duplicate key: the last one wins
        b'{"a\\"prompt":[11,22],"prompt":"hi"}',
        b'{"prompt":[11,22]',  # truncated
        b'{"prompt":[]}',
        b'{"prompt":[12345678901234567890]}',  # 20 digits: past 64 bits
    ):
        assert fast_token_prompt(raw, CT) is None, raw
    assert fast_token_prompt(b'{"prompt":[11,22]}', "text/plain") is None


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40),
    width=st.integers(1, 19),
    before=st.fixed_dictionaries(
        {}, optional={"model": st.just(MODEL), "max_tokens": st.integers(1, 9), "n": st.just(1)}
    ),
)
def test_any_same_width_prompt_reads_as_the_full_parse_does(
    ids: list[int], width: int, before: dict[str, object]
) -> None:
    same = [i % 10**width for i in ids]
    if width > 1:
        same = [max(i, 10 ** (width - 1)) for i in same]
    body = {**before, "prompt": same}
    raw = orjson.dumps(body)
    fast = fast_token_prompt(raw, CT)
    assert fast is not None
    assert fast[1] == full(raw)
    assert fast[0] == {**before, "prompt": [0]}


def test_block_hashes_name_the_whole_prefix() -> None:
    a = tokenizer.ids_stream(list(range(64)))
    b = tokenizer.ids_stream([*range(16), 999, *range(17, 64)])
    ha, hb = tokenizer.block_hashes(a, 16), tokenizer.block_hashes(b, 16)
    assert len(ha) == 4 and len(set(ha)) == 4 and all(len(h) == 16 for h in ha)
    assert ha[0] == hb[0] and all(x != y for x, y in zip(ha[1:], hb[1:], strict=True))
    # the same block after a different prefix is another block
    swapped = tokenizer.ids_stream([*range(16, 32), *range(16), *range(32, 64)])
    assert tokenizer.block_hashes(swapped, 16)[2] != ha[2]
    assert tokenizer.block_hashes(a, 16) == ha  # stable
