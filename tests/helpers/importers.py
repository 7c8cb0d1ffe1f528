"""Test helpers shared by the importer tests: running the CLI (in process and
as a real subprocess), making bad inputs, and *independent* implementations
of the documented rules an importer's expected bodies depend on (block and
tail token synthesis, the chars/4 token approximation). Nothing here calls
replayer's own helpers, so a bug there cannot hide behind a matching bug here.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import hashlib
import io
import json
import math
import random
import struct
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest

from replayer.cli import build_parser, main
from replayer.errors import ImportFormatError
from replayer.trace import Trace
from tests.helpers.cli import run

LO, HI, SALT = 10_000, 32_000, "replayer"


def import_trace(fmt: str, sources: list[Path], out: Path, *options: str) -> Trace:
    """``replayer import`` in process (fast), returning the opened trace."""
    args = build_parser().parse_args(
        ["import", fmt, *map(str, sources), "-o", str(out), "--force", *options]
    )
    assert args.func(args) == 0
    return Trace.open(out)


def inspect_cli(path: Path) -> dict[str, Any]:
    res = run("inspect", path, "--json")
    assert res.returncode == 0, res.stderr
    info: dict[str, Any] = orjson.loads(res.stdout)
    return info


def assert_import_fails(
    fmt: str, src: Path, tmp_path: Path, *fragments: str, options: tuple[str, ...] = ()
) -> str:
    """Importing ``src`` as ``fmt`` exits 2 with exactly one stderr line that
    names the file (and the given fragments), and writes no output."""
    out = tmp_path / f"fail-{fmt}-{src.name}.arrow"
    # in process, through the CLI's own entry point (what exits 2 with one line):
    # these tables are long, and a subprocess costs half a second of imports each
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(["import", fmt, str(src), "-o", str(out), *options])
        except SystemExit as exc:  # argparse's own usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    stderr = err.getvalue()
    assert rc == 2, (rc, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("replayer import: error: "), line
    assert str(src) in line, line
    for f in fragments:
        assert f in line, line
    assert not out.exists()
    assert not list(tmp_path.glob(f".{out.name}.tmp*"))
    return line


def import_error(fmt: str, src: Path, tmp_path: Path, *options: str) -> str:
    """In process (fast, for tables of bad rows): the import raises
    :class:`ImportFormatError`, naming the file, and writes no output."""
    out = tmp_path / f"fail-{fmt}-{src.name}.arrow"
    args = build_parser().parse_args(["import", fmt, str(src), "-o", str(out), *options])
    with pytest.raises(ImportFormatError) as info:
        args.func(args)
    assert not out.exists()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(src)), msg
    return msg


def raw_bytes(src: Path) -> bytes:
    data = src.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def garbage_file(tmp_path: Path, name: str = "garbage.bin") -> Path:
    """Deterministic binary noise (not UTF-8, not gzip, not JSON)."""
    p = tmp_path / name
    p.write_bytes(b"\xff\xfe\x00\x81" + hashlib.shake_128(b"garbage").digest(4096))
    return p


def truncated_file(src: Path, tmp_path: Path, n: int, name: str | None = None) -> Path:
    """The first ``n`` bytes of the (decompressed) source, as a plain file."""
    p = tmp_path / (name or f"truncated-{src.name.removesuffix('.gz')}")
    p.write_bytes(raw_bytes(src)[:n])
    return p


def truncated_gzip(src: Path, tmp_path: Path, name: str | None = None) -> Path:
    """The source gzipped and cut in the middle of the compressed stream."""
    p = tmp_path / (name or f"cut-{src.name.removesuffix('.gz')}.gz")
    z = gzip.compress(raw_bytes(src))
    p.write_bytes(z[: len(z) // 2])
    return p


# -- independent implementations of documented rules -------------------------


def _draw(seed: str, n: int) -> list[int]:
    raw = hashlib.shake_128(seed.encode()).digest(4 * n)
    return [LO + v % (HI - LO) for v in struct.unpack(f"<{n}I", raw)]


@cache
def block_tokens(block_id: int, size: int, ns: str | None = None) -> tuple[int, ...]:
    key = str(block_id) if ns is None else f"{ns}:{block_id}"
    return tuple(_draw(f"{SALT}:{key}:{size}", size))


def tail_tokens(request_id: str, n: int) -> list[int]:
    return _draw(f"{SALT}:tail:{request_id}", n) if n > 0 else []


def blocks_prompt(
    ids: list[int], size: int, n_tokens: int, request_id: str, ns: str | None = None
) -> list[int]:
    """The documented token-id prompt of a blocks request: the named blocks
    (the last one cut to fit; ``ns`` scopes the ids), then unique tail tokens
    up to ``n_tokens``."""
    out: list[int] = []
    for b in ids:
        if len(out) >= n_tokens:
            break
        out.extend(block_tokens(b, size, ns)[: n_tokens - len(out)])
    return out + tail_tokens(request_id, n_tokens - len(out))


def approx_tokens(messages: list[dict[str, Any]]) -> int:
    """The writer's documented chat approximation: per message 4, plus
    ceil(UTF-8 bytes / 4) of each text (content, text parts, tool-call name,
    tool-call arguments)."""

    def t(s: str) -> int:
        return math.ceil(len(s.encode()) / 4)

    total = 0
    for m in messages:
        total += 4
        c = m.get("content")
        if isinstance(c, str):
            total += t(c)
        elif isinstance(c, list):
            total += sum(t(p["text"]) for p in c if isinstance(p.get("text"), str))
        for call in m.get("tool_calls") or []:
            total += t(call["function"]["name"]) + t(call["function"]["arguments"])
    return total


def nearest_rank(values: list[int], p: float) -> int:
    s = sorted(values)
    return s[max(1, math.ceil(p / 100 * len(s))) - 1]


@cache
def block(key: int | str, size: int) -> tuple[int, ...]:
    """The documented construction: key is the id, or "ns:id" within a namespace."""
    raw = hashlib.shake_128(f"replayer:{key}:{size}".encode()).digest(4 * size)
    return tuple(10_000 + v % 22_000 for v in struct.unpack(f"<{size}I", raw))


# -- malformed input: deterministic structural mutations ---------------------

ODD_VALUES: list[Any] = [None, 5, -1, 2**70, 1.5, "x", "", [], {}, [1, "a"], {"a": 1}, True]


def mutants(doc: Any, seed: int, n: int) -> list[Any]:
    """``n`` copies of a JSON document, each with 1-3 nodes (among the first
    six children at every level) replaced by a value of another type or
    deleted. Seeded, so a failure names a reproducible input."""
    rng = random.Random(seed)

    def paths(x: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        out = [at]
        items = (
            x.items() if isinstance(x, dict) else enumerate(x[:6]) if isinstance(x, list) else ()
        )
        for k, v in items:
            out += paths(v, at + (k,))
        return out

    every = paths(doc)[1:]
    result = []
    for _ in range(n):
        m = copy.deepcopy(doc)
        for _ in range(rng.randint(1, 3)):
            p = rng.choice(every)
            cur = m
            try:
                for k in p[:-1]:
                    cur = cur[k]
                if isinstance(cur, dict) and rng.random() < 0.3:
                    cur.pop(p[-1], None)
                else:
                    cur[p[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
            except (KeyError, IndexError, TypeError):
                pass  # an earlier mutation removed the path
        result.append(m)
    return result


def assert_fails_cleanly_or_imports(
    fmt: str, docs: list[Any], tmp_path: Path, suffix: str, *options: str
) -> tuple[int, int]:
    """Each document is either imported (and every body of the result then
    reconstructs) or refused with ImportFormatError, never another exception.
    Returns (imported, refused)."""
    ok = refused = 0
    for i, doc in enumerate(docs):
        src = tmp_path / f"mutant{i}{suffix}"
        if suffix.endswith("jsonl"):
            src.write_text("".join(json.dumps(r) + "\n" for r in doc))
        else:
            src.write_text(json.dumps(doc))
        out = tmp_path / f"mutant{i}.arrow"
        args = build_parser().parse_args(["import", fmt, str(src), "-o", str(out), *options])
        try:
            args.func(args)
        except ImportFormatError as exc:
            assert str(exc).startswith(str(src)) and "\n" not in str(exc), exc
            assert not out.exists()
            refused += 1
            continue
        t = Trace.open(out)
        assert all(isinstance(t.body(r), dict) for r in range(len(t)))
        ok += 1
    return ok, refused
