"""A vLLM OpenAI-compatible server emulator with fault injection.

The embedded default target of replayer: every replay, monitor and bisect
test, the demo and the benchmarks run against it. It matches vLLM 0.33 on the
wire (``../shared/VLLM.md`` is the spec; older variants via
``--vllm-version``; ``--vllm-version 0.32.0`` is what a real vLLM 0.32 did,
measured, and tests/conformance checks it against one), simulates the engine
(tokenizer stand-in, paged KV cache with prefix caching, scheduler with
chunked prefill and preemption, a speed model) and injects faults that fail
the way vLLM fails.

Modules, by responsibility:

* :mod:`.config` - the configuration value and its command-line options;
* :mod:`.tokenizer` - exact token counts and stable token identities;
* :mod:`.kvcache` - blocks, the free LRU queue, the prefix-cache index;
* :mod:`.engine` - the scheduler and step loop, fault hooks;
* :mod:`.faults` - the fault-rule grammar and trigger decisions;
* :mod:`.effects` - what each failure mode does;
* :mod:`.parsing`, :mod:`.wire` - request validation and response bytes;
* :mod:`.app`, :mod:`.generate` - the aiohttp routes;
* :mod:`.metrics`, :mod:`.logs`, :mod:`.requestlog` - observable outputs;
* :mod:`.runtime`, :mod:`.server` - state, lifecycle, the process entry.

It depends on nothing in replayer but the error types (its token counts
equal :mod:`replayer.trace.tokens`'s, which the tests check); nothing in the
core imports it.
``replayer.testing.emulator`` runs it as a subprocess for tests.
"""

from __future__ import annotations

from replayer.emulator.config import EmulatorConfig

__all__ = ["EmulatorConfig"]
