"""Bodies sent are byte-identical to the documented derivation, whatever makes
them faster: fixed digests of every body of reference traces and prompt
shapes, taken from the derivation before any cache or vectorized path
existed. A bundle's stdlib ``repro.py`` regenerates the same bytes; a change
here breaks every recorded trace and every bundle already handed out."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from replayer.cli import build_parser
from replayer.trace import Trace
from replayer.trace.tokens import BlockPrompts, TokenSpace

pytestmark = pytest.mark.inprocess

REPO = Path(__file__).resolve().parents[2]

SHAPES = [
    ([1, 2, 3], 64, 192, "r0", None),  # whole blocks
    ([1, 2, 3], 64, 150, "r1", None),  # Mooncake: a partial last block
    ([1, 2, 3], 64, 230, "r2", "t7"),  # kv-cache-tester: a namespace and a tail
    ([], 64, 37, "r3", None),  # Azure: a tail only
    ([9], 512, 700, "r4", "ns"),
    (list(range(100, 400)), 16, 300 * 16 + 5, "r5", "big"),
]


def body_digest(trace: Trace) -> str:
    h = hashlib.sha256()
    for _, body in trace.iter_json():
        h.update(body)
    return h.hexdigest()


def shapes_digest(space: TokenSpace) -> str:
    bp = BlockPrompts(space)
    h = hashlib.sha256()
    for ids, size, n, rid, ns in SHAPES * 2:  # twice: the second pass reads any cache
        h.update(bp.json(ids, size, n, rid, ns).encode())
        h.update(b"|")
    return h.hexdigest()


@pytest.mark.parametrize(
    "space,digest",
    [
        (TokenSpace(), "06afaf0cd41bc7089b5a9222c880844d86eb5894ecdff052ec1fa4d9e95398c9"),
        (
            TokenSpace(lo=0, hi=151_936, salt="x"),  # ids of every width
            "9dae7271807008925e59f1f27de4a87a7646fff9096b2cee3256f80bcd549906",
        ),
    ],
)
def test_prompt_shapes_keep_their_bytes(space: TokenSpace, digest: str) -> None:
    assert shapes_digest(space) == digest


def test_sample_traces_keep_their_bodies() -> None:
    blocks = Trace.open(REPO / "traces" / "blocks-16x12.arrow")
    recorded = "6a1ccbc050e6afe26260c2d45d9829a422299dbba76b81c218026876077d6eb6"
    assert body_digest(blocks) == recorded
    tiny = blocks.configured(tokens=TokenSpace(lo=3, hi=1000))  # a tiny model's vocabulary
    assert body_digest(tiny) == "1740233960c4bd876d7964424d74afda83794bce0532c3925e819b8990f29b88"
    assert body_digest(blocks) == recorded  # the sibling's range is its own
    chat = Trace.open(REPO / "traces" / "agents-8x10.arrow")
    assert body_digest(chat) == "b93fd00de68a95b4775f8e60209ae425f9cf21b0f0ede2a21ee142b863d9db1b"


def test_imported_claude_code_sessions_keep_their_bodies(shared_data: Path, tmp_path: Path) -> None:
    src = shared_data / "kv_cache_tester_claude_code"
    out = tmp_path / "kv.arrow"
    args = build_parser().parse_args(
        ["import", "kv-cache-tester", str(src / "trace_0001.json.gz"),
         str(src / "trace_0002.json.gz"), "-o", str(out)]
    )  # fmt: skip
    assert args.func(args) == 0
    assert body_digest(Trace.open(out)) == (
        "e887598974a9036c9125d47a2db7ec470f499f2be2711e8d207b4dcf9ee290ee"
    )


@pytest.mark.parametrize("cache", [0, 4_000, 64 << 10, 512 << 20])
def test_a_replay_s_builder_sends_the_same_bytes_through_any_cache(cache: int) -> None:
    """The replay's path (a planned builder, block ids held compact, a cache
    that keeps what is built again soonest) in dispatch order: every body is
    the derivation's, and nothing is left in the cache once the plan is built."""
    blocks = Trace.open(REPO / "traces" / "blocks-16x12.arrow")
    want = dict(blocks.iter_json())
    blocks = blocks.configured(body_cache_bytes=cache)
    order = list(blocks.order)
    builder = blocks.builder(order)
    assert len(builder._keys) == len(order)  # every row has a whole block
    for row in order:
        assert builder.json(row) == want[row], row
    assert len(blocks._prompts._prompts) == 0
    assert blocks._prompts._prompts._pending == {}


def test_prompt_keys_are_the_keys_bodies_are_built_under() -> None:
    blocks = Trace.open(REPO / "traces" / "blocks-16x12.arrow")
    c = blocks.column
    keys = blocks.prompt_keys(range(len(blocks)))
    for row in range(len(blocks)):
        ids = blocks.content(row)
        whole = min(len(ids), c("input_tokens")[row] // c("block_size")[row])
        expected = (c("block_ns")[row], c("block_size")[row], ids[0]) if whole else None
        assert keys.get(row) == expected


def test_a_builder_stopped_early_takes_its_plan_back() -> None:
    blocks = Trace.open(REPO / "traces" / "blocks-16x12.arrow")
    order = list(blocks.order)
    builder = blocks.builder(order)
    for row in order[:20]:
        builder.json(row)
    assert blocks._prompts._prompts._pending  # the rest of the plan
    builder.close()
    assert blocks._prompts._prompts._pending == {}
    assert len(blocks._prompts._prompts) > 0  # what was built stays, to age as any
