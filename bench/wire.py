"""The wire layer's cost per streamed event, next to the openai SDK's decoder.

``python -m bench wire``

One vLLM-shaped chat stream (256 content chunks, a usage chunk, ``[DONE]``),
fed in three read sizes: one event per read (a slow server), 16 events per
read, the whole stream at once (a fast one). Per event: replayer's
``SSEDecoder`` alone, decoder plus the chat accumulator (what the replay
client and the recorder run: text, hash, token times, usage), and the openai
SDK's ``SSEDecoder.iter_bytes`` (decode only), the peer a user's client runs
on the same bytes. Best of 5 repeats; one core, whatever else runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from replayer.wire import Api, SSEDecoder, accumulator

EVENTS = 256


def stream() -> list[bytes]:
    """The stream as one bytes object per event."""
    out = []
    for i in range(EVENTS):
        chunk = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [
                {"index": 0, "delta": {"content": f"tok{i} "}, "logprobs": None,
                 "finish_reason": None}
            ],
        }  # fmt: skip
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": EVENTS}}
    out.append(b"data: " + orjson.dumps(usage) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def reads(events: list[bytes], per_read: int) -> list[bytes]:
    return [b"".join(events[i : i + per_read]) for i in range(0, len(events), per_read)]


def _best(fn: Callable[[], int], repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main(argv: list[str]) -> dict[str, Any]:
    from openai._streaming import SSEDecoder as OpenAIDecoder

    events = stream()
    n = len(events)
    figures: dict[str, Any] = {"events": n}
    print("| reads | replayer decode (µs/event) | + chat accumulator | openai SDK decode | "
          "decode ratio replayer/openai |")  # fmt: skip
    print("|---|---|---|---|---|")
    for label, per in (("1 event/read", 1), ("16 events/read", 16), ("whole stream", n)):
        chunks = reads(events, per)

        def ours(chunks: list[bytes] = chunks) -> int:
            for _ in range(20):
                dec = SSEDecoder()
                for c in chunks:
                    dec.feed(c)
            return 20 * n

        def ours_acc(chunks: list[bytes] = chunks) -> int:
            for _ in range(20):
                dec = SSEDecoder()
                acc = accumulator(Api.CHAT)
                t = 0.0
                for c in chunks:
                    for ev in dec.feed(c):
                        acc.event(ev, t)
                        t += 0.001
            return 20 * n

        def theirs(chunks: list[bytes] = chunks) -> int:
            for _ in range(20):
                for _ev in OpenAIDecoder().iter_bytes(iter(chunks)):
                    pass
            return 20 * n

        a, b, c = _best(ours), _best(ours_acc), _best(theirs)
        figures[label] = {"decode_us": round(a, 2), "decode_accumulate_us": round(b, 2),
                          "openai_decode_us": round(c, 2), "ratio": round(a / c, 3)}  # fmt: skip
        print(f"| {label} | {a:.2f} | {b:.2f} | {c:.2f} | {a / c:.2f} |")
    return figures
