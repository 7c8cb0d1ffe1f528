"""Trace format v4: the contract every stage reads and writes.

A trace is an Apache Arrow IPC stream or file (zstd-compressed buffers), one
row per request. Row order is storage order; *trace order* is ``start_us``
with ties broken by row (see :attr:`replayer.trace.reader.Trace.order`).

Bodies are delta-encoded: a row stores only what it adds to an earlier row
(``base``), keeping the first ``keep`` units of that row's content (messages
for ``chat`` and ``messages``, input items for ``responses``, characters for
``text``, block ids for ``blocks``) and appending its own. ``params`` holds
the rest of the body as JSON (``system``, ``instructions``, ``tools`` …), in
its recorded key order, with the content key present as ``null`` at its
recorded position; a null ``params`` means "same as the base's". ``raw`` rows
(bodies of no known shape) keep the whole body in ``params`` and never delta.

Every column is a plain Arrow type, so duckdb, polars and pandas read a trace
without replayer. Low-cardinality strings (session, path, kind, model, block
namespace) are dictionary-encoded: zstd cannot compress the offsets of a
million repeated strings, and a dictionary makes them nearly free on disk.
Schema metadata carries ``replayer.format``, ``replayer.schema_version``,
``replayer.provenance`` (JSON) and ``replayer.tokens`` (JSON: the token space
of ``blocks`` rows).

Each record batch's custom metadata carries ``replayer.schema_digest`` and
``replayer.column_digests`` (v2; see :mod:`replayer.trace.digests`). v1 is
v2 without them; v2 is v3 without the ``messages`` and ``responses`` kinds; v3 is v4 without
the ``after`` column (joins: the requests whose end a request waits for);
:mod:`replayer.trace.compat` migrates each on open.
"""

from __future__ import annotations

from enum import StrEnum

import pyarrow as pa

TRACE_SCHEMA_VERSION = 4
FORMAT_NAME = "replayer-trace"

META_FORMAT = b"replayer.format"
META_VERSION = b"replayer.schema_version"
META_PROVENANCE = b"replayer.provenance"
META_TOKENS = b"replayer.tokens"
# per record batch (v2)
META_SCHEMA_DIGEST = b"replayer.schema_digest"
META_COLUMN_DIGESTS = b"replayer.column_digests"
META_BATCH_START = b"replayer.batch_start"
"""Rows written before the batch: absent in traces written before it was
added, which are read as before."""


class Kind(StrEnum):
    """Payload kinds. The content key is where the delta-encoded part lives."""

    CHAT = "chat"
    """OpenAI chat messages (tool calls, tool messages, multi-part content)."""
    TEXT = "text"
    """A completions prompt string."""
    BLOCKS = "blocks"
    """A token-id prompt synthesized from content-block hash ids."""
    MESSAGES = "messages"
    """Anthropic Messages: ``messages`` (content blocks, tool use and results,
    thinking with signatures); ``system``, ``tools``, ``thinking`` … in params."""
    RESPONSES = "responses"
    """OpenAI Responses: the ``input`` items (messages, function calls and
    outputs, reasoning); ``instructions``, ``tools`` … in params."""
    RAW = "raw"
    """Any other JSON body, stored whole in ``params``."""

    @property
    def content_key(self) -> str | None:
        return _CONTENT_KEYS.get(self.value)

    @property
    def itemized(self) -> bool:
        """Content is a list of JSON items (messages or input items), stored
        one JSON text each in the ``messages`` column."""
        return self.value in _ITEMIZED


_CONTENT_KEYS = {
    "chat": "messages",
    "text": "prompt",
    "blocks": "prompt",
    "messages": "messages",
    "responses": "input",
}
_ITEMIZED = frozenset({"chat", "messages", "responses"})


_DICT = pa.dictionary(pa.int32(), pa.string())

FIELDS: list[tuple[str, pa.DataType, bool, str]] = [
    # identity, placement and timing
    ("request_id", pa.string(), False, "stable id; sent as X-Request-Id on replay"),
    ("session_id", _DICT, False, "the agent session (conversation) the request belongs to"),
    ("turn", pa.int32(), False, "0-based index of the request within its session"),
    ("start_us", pa.int64(), False, "recorded start, microseconds from trace start"),
    ("end_us", pa.int64(), True, "recorded end (last byte), microseconds from trace start"),
    (
        "after",
        pa.list_(pa.string()),
        True,
        "joins: request_ids whose end this request waits for on replay, in every order and "
        "timing (a parent's turn after the sub-agents whose results it carries); null = none",
    ),
    ("path", _DICT, False, "endpoint path, e.g. /v1/chat/completions"),
    ("model", _DICT, True, "the body's model"),
    ("kind", _DICT, False, "payload kind: chat | text | blocks | messages | responses | raw"),
    # delta encoding
    ("base", pa.int64(), True, "row index of the delta base (an earlier row), null = keyframe"),
    ("keep", pa.int64(), False, "units of the base's content kept before the appended part"),
    (
        "messages",
        pa.list_(pa.string()),
        True,
        "chat, messages: appended messages; responses: appended input items; one JSON text each",
    ),
    ("text", pa.string(), True, "text: appended prompt characters"),
    ("blocks", pa.list_(pa.int64()), True, "blocks: appended block hash ids"),
    ("block_size", pa.int32(), True, "blocks: tokens per block"),
    ("block_ns", _DICT, True, "blocks: namespace of the hash ids (null = global ids)"),
    ("params", pa.string(), True, "JSON body minus content (content key = null); null = base's"),
    # derived, for queries and planning
    ("input_tokens", pa.int64(), False, "prompt tokens: exact for blocks, else recorded or approx"),
    ("max_tokens", pa.int64(), True, "max_tokens / max_completion_tokens / max_output_tokens"),
    ("stream", pa.bool_(), True, "the body's stream flag"),
    ("body_bytes", pa.int64(), False, "length of the expanded compact JSON body"),
    ("body_sha256", pa.string(), True, "sha256 of the raw body bytes as recorded (recorder only)"),
    # recorded outcome
    ("status", pa.int32(), True, "recorded HTTP status"),
    ("ttft_us", pa.int64(), True, "recorded time to first token"),
    ("finish_reason", pa.string(), True, "recorded finish reason"),
    ("output_text", pa.string(), True, "recorded response text"),
    ("output_tool_calls", pa.string(), True, "recorded response tool calls (JSON)"),
    ("usage_prompt_tokens", pa.int64(), True, "recorded prompt (input) tokens"),
    ("usage_completion_tokens", pa.int64(), True, "recorded completion (output) tokens"),
    ("usage_cached_tokens", pa.int64(), True, "recorded cached prompt tokens"),
    ("error", pa.string(), True, "recorded error message"),
    ("meta", pa.string(), True, "source-specific extras (JSON)"),
]

FIELD_DOCS: dict[str, str] = {name: doc for name, _, _, doc in FIELDS}
NAMES: list[str] = [name for name, _, _, _ in FIELDS]
DICT_COLUMNS: frozenset[str] = frozenset(n for n, t, _, _ in FIELDS if t == _DICT)
CONTENT_COLUMNS: tuple[str, ...] = ("messages", "text", "blocks", "params")
# Columns too big to hold for every row at once; the rest form the index.
HEAVY_COLUMNS: frozenset[str] = frozenset(
    CONTENT_COLUMNS + ("output_text", "output_tool_calls", "error", "meta")
)


def arrow_schema(metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    return pa.schema(
        [pa.field(name, typ, nullable=nullable) for name, typ, nullable, _ in FIELDS],
        metadata=metadata,
    )


SCHEMA = arrow_schema()
