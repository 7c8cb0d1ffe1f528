"""Damaged traces, generated: Hypothesis mutates valid traces (byte flips,
zeroed blocks, cuts at any offset, swapped, duplicated and dropped record
batches, schema metadata edits, footer edits) and every reader of a trace
is run on each mutant.

For every mutant each reader either refuses it with a
:class:`~replayer.errors.TraceError` (the CLI: exit 2, one stderr line) or
reads exactly what the undamaged part says: the rows of the complete
batches, record for record. Nothing else is raised, no call runs past its
bound, and a mutant that fails verification is never replayed: replay and
bisect against a loopback listener that counts connections get zero.

Sources: the trace writer's own output in both IPC forms (the stream form
a recorder segment has, the file form of ``import`` and ``synth``) with
digests, and a committed v1 sample (``traces/``), which has no digests: for
it a mutant must be refused or read without error, as no digest can tell a
flipped byte of content from a recorded one.

Most examples run in process (fast); a sample goes through the real
command line. Derandomized: a failure reproduces as it is printed.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from replayer import api
from replayer.errors import TraceCorruptError, TraceError
from replayer.trace import Trace
from replayer.trace.digests import batch_metadata
from replayer.trace.framing import scan
from replayer.trace.reader import NOTHING_LEFT
from replayer.trace.schema import META_FORMAT, META_PROVENANCE, META_TOKENS, META_VERSION
from tests.helpers.traces import write_current

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "traces" / "blocks-16x12.arrow"
BOUND_S = 60
"""The most one reader may take on one mutant (a few hundred ms when idle)."""


# -- the sources and their layout -------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A valid trace and where its IPC messages lie."""

    name: str
    path: Path
    data: bytes
    form: str
    batches: list[tuple[int, int]]
    """Each record batch message: its first byte and the byte after it."""
    footer: tuple[int, int] | None
    """An IPC file's footer (with its length and the trailing magic)."""
    digests: bool


def _source(name: str, path: Path) -> Source:
    data = path.read_bytes()
    form = "file" if data[:6] == b"ARROW1" else "stream"
    at = 8 if form == "file" else 0
    framing = scan(pa.py_buffer(data[at:]))
    batches = [(at + a, at + b) for m, a, b in framing.messages if m.type == "record batch"]
    footer = (at + framing.end, len(data)) if form == "file" else None
    return Source(name, path, data, form, batches, footer, Trace.open(path).has_digests)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Source]:
    d = tmp_path_factory.mktemp("sources")
    out = {
        "stream": _source("stream", write_current(d / "stream.arrow", form="stream")),
        "file": _source("file", write_current(d / "file.arrow", form="file")),
        "sample-v1": _source("sample-v1", shutil.copyfile(SAMPLE, d / "sample.arrow")),
    }
    assert [len(s.batches) for s in out.values()] == [5, 5, 1]
    return out


# -- mutations ---------------------------------------------------------------------------


class Mutant:
    """A damaged copy of a source; shown by how it was made (a failure
    prints the name, not kilobytes of bytes)."""

    __slots__ = ("name", "data")

    def __init__(self, name: str, data: bytes) -> None:
        self.name = name
        self.data = data

    def __repr__(self) -> str:
        return f"Mutant({self.name!r}, {len(self.data):,} bytes)"


def _flips(draw: st.DrawFn, src: Source, lo: int, hi: int) -> bytes:
    d = bytearray(src.data)
    for _ in range(draw(st.integers(1, 3))):
        off = draw(st.integers(lo, hi - 1))
        d[off] ^= draw(st.integers(1, 255))
    return bytes(d)


def _metadata_edit(src: Source, key: bytes, value: bytes | None, redigest: bool) -> bytes:
    """``src`` rewritten with one schema metadata entry changed (None: removed),
    its batches carrying their stored digests, or (``redigest``) fresh ones, as
    a writer that meant the edit would."""
    buf = pa.py_buffer(src.data)
    reader = ipc.open_file(buf) if src.form == "file" else ipc.open_stream(buf)
    meta = dict(reader.schema.metadata)
    if value is None:
        meta.pop(key, None)
    else:
        meta[key] = value
    schema = reader.schema.with_metadata(meta)
    if src.form == "file":
        pairs = [reader.get_batch_with_custom_metadata(i) for i in range(reader.num_record_batches)]
    else:
        pairs = []
        with contextlib.suppress(StopIteration):
            for _ in range(len(src.batches)):
                pairs.append(reader.read_next_batch_with_custom_metadata())
    sink = pa.BufferOutputStream()
    opts = ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3), emit_dictionary_deltas=True)
    new = ipc.new_file if src.form == "file" else ipc.new_stream
    with new(sink, schema, options=opts) as w:
        for batch, custom in pairs:
            if redigest and src.digests:
                custom = batch_metadata(batch, schema)
            w.write_batch(batch, custom_metadata=custom)
    return bytes(sink.getvalue().to_pybytes())


_VALUES = {
    META_VERSION: [b"0", b"1", b"2", b"99", b"-1", b"x", b""],
    META_FORMAT: [b"other", b""],
    META_PROVENANCE: [b"[]", b"3", b'"s"', b"{", b"null", b'{"t0_unix_us": "x"}'],
    META_TOKENS: [b"[]", b'{"lo": "a"}', b'{"lo": 5, "hi": 1}', b"null", b"{", b'{"x": 1}'],
}


@st.composite
def mutations(draw: st.DrawFn, src: Source) -> Mutant:
    """One damaged copy of ``src``, and how it was made."""
    n = len(src.data)
    kind = draw(
        st.sampled_from(
            ["flip", "zero", "cut", "swap", "duplicate", "drop", "metadata"]
            + (["footer"] if src.footer else [])
        )
    )
    k = len(src.batches)
    if kind == "flip":
        return Mutant(kind, _flips(draw, src, 0, n))
    if kind == "zero":
        off = draw(st.integers(0, n - 1))
        size = draw(st.integers(1, 512))
        zeros = b"\0" * min(size, n - off)
        return Mutant(f"zero {off}+{size}", src.data[:off] + zeros + src.data[off + size :])
    if kind == "cut":
        at = draw(st.integers(0, n - 1))
        return Mutant(f"cut {at}", src.data[:at])
    if kind == "footer":
        assert src.footer is not None
        lo, hi = src.footer
        if draw(st.booleans()):
            return Mutant("footer flip", _flips(draw, src, lo, hi))
        d = bytearray(src.data)
        d[n - 10 : n - 6] = struct.pack("<i", draw(st.integers(-(2**31), 2**31 - 1)))
        return Mutant("footer length", bytes(d))
    if kind == "metadata":
        key = draw(st.sampled_from(sorted(_VALUES)))
        value = draw(st.sampled_from([None, *_VALUES[key]]))
        redigest = draw(st.booleans())
        return Mutant(
            f"metadata {key!r}={value!r} redigest={redigest}",
            _metadata_edit(src, key, value, redigest),
        )
    msgs = [src.data[a:b] for a, b in src.batches]
    i = draw(st.integers(0, k - 1))
    if kind == "swap":
        j = draw(st.integers(0, k - 1))
        msgs[i], msgs[j] = msgs[j], msgs[i]
    elif kind == "duplicate":
        msgs.insert(i, msgs[i])
    else:
        del msgs[i]
    return Mutant(f"{kind} {i}", _with_batches(src, msgs))


def _with_batches(src: Source, msgs: list[bytes]) -> bytes:
    """``src`` with its record batch messages replaced, in order, by ``msgs``
    (fewer: the last places left empty; more: the rest after the last one);
    every other message, and the footer, where it was."""
    out, at = bytearray(), 0
    for idx, (a, b) in enumerate(src.batches):
        out += src.data[at:a] + (msgs[idx] if idx < len(msgs) else b"")
        at = b
    for m in msgs[len(src.batches) :]:
        out += m
    return bytes(out + src.data[at:])


# -- what the undamaged trace says ------------------------------------------------------


def _rows(t: Trace) -> list[tuple[object, ...]]:
    return [(t.record(r), t.body_json(r)) for r in range(len(t))]


@pytest.fixture(scope="module")
def truth(sources: dict[str, Source]) -> dict[str, tuple[list[tuple[object, ...]], list[int]]]:
    """Each source's rows, and the row counts a torn tail may leave."""
    out = {}
    for name, src in sources.items():
        t = Trace.open(src.path)
        ends, n = [], 0
        for length in t._batch_lengths:
            n += length
            ends.append(n)
        out[name] = (_rows(t), ends)
    return out


# -- a listener that counts connections -------------------------------------------------


class Listener:
    """A loopback port that accepts and counts connections (and answers none)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 3600
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def connections(self) -> int:
        """Connections accepted so far, after one of our own: the backlog is
        first in, first out, so nothing made before it is still unaccepted."""
        want = self.accepted + 1
        with socket.create_connection(self.sock.getsockname(), timeout=10):
            pass
        deadline = time.monotonic() + 10
        while self.accepted < want and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.accepted >= want, "the listener stopped accepting"
        return self.accepted - want


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    lis = Listener()
    yield lis
    lis.stop.set()
    lis.thread.join(timeout=10)
    lis.sock.close()


# -- running the readers ----------------------------------------------------------------


class Hung(Exception):
    pass


@contextlib.contextmanager
def bounded(what: str, seconds: float = BOUND_S) -> Iterator[None]:
    """Fail, naming ``what``, if the block runs past ``seconds``."""

    def alarm(signum: int, frame: FrameType | None) -> None:
        raise Hung(f"{what} ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _call(what: str, fn: Callable[[], object]) -> object | TraceError:
    """``fn()``'s result, or the TraceError it raised; anything else fails."""
    with bounded(what):
        try:
            return fn()
        except TraceError as exc:
            assert "\n" not in str(exc), (what, str(exc))
            return exc


def _verdict(path: Path) -> Trace | TraceError:
    """The mutant as a replay sees it first: opened and verified in full."""

    def run() -> Trace:
        t = Trace.open(path)
        t.verify()
        return t

    got = _call("open and verify", run)
    assert isinstance(got, Trace | TraceError)
    return got


def check_mutant(
    src: Source,
    name: str,
    data: bytes,
    work: Path,
    truth: tuple[list[tuple[object, ...]], list[int]],
    listener: Listener | None,
    *,
    readers: bool = True,
) -> bool:
    """Run every reader on ``data``; return whether it was refused."""
    for old in work.iterdir():
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    m = work / f"{src.name}.arrow"
    m.write_bytes(data)
    verdict = _verdict(m)
    refused = isinstance(verdict, TraceError)
    if not refused:
        assert isinstance(verdict, Trace)
        _matches_truth(src, name, verdict, truth)
    if readers:
        results = {
            "inspect": _call("inspect", lambda: api.inspect(m)),
            "inspect --verify": _call("inspect --verify", lambda: api.inspect(m, verify=True)),
            "export": _call("export", lambda: api.export(m, work / "x.jsonl")),
            "trace convert": _call("convert", lambda: api.convert(m, work / "c.arrow")),
            "trace merge": _call("merge", lambda: api.merge([m], work / "g.arrow")),
        }
        for cmd, got in results.items():
            if cmd == "inspect" and not src.digests and refused and not isinstance(got, TraceError):
                # a v1 trace has no digests: plain inspect reads its index, and
                # damage inside a body or outcome shows only when one is rebuilt
                # (inspect --verify, export, convert, merge, replay)
                continue
            # every reader agrees with verification: a refused trace is refused everywhere
            assert isinstance(got, TraceError) == refused, (name, cmd, got, verdict)
        if not refused:
            assert isinstance(verdict, Trace)
            info = results["inspect"]
            assert isinstance(info, dict) and info["requests"] == len(verdict)
            _outputs_match(src, name, verdict, work, truth)
    if refused and readers:
        assert listener is not None
        before = listener.connections()
        got = _call(
            "replay",
            lambda: api.replay_sync(m, listener.url, out=work / "r", watch=None, say=_quiet),
        )
        assert isinstance(got, TraceError), (name, "replay", got)
        got = _call(
            "bisect",
            lambda: api.bisect_sync(
                m, api.Server(url=listener.url, restart_cmd="true"), work / "b", say=_quiet
            ),
        )
        assert isinstance(got, TraceError), (name, "bisect", got)
        assert listener.connections() == before, (name, "a refused trace was sent")
    return refused


def _quiet(_: str) -> None:
    pass


def _matches_truth(
    src: Source, name: str, t: Trace, truth: tuple[list[tuple[object, ...]], list[int]]
) -> None:
    """An accepted mutant reads as the undamaged part of ``src``: every row,
    or (a torn tail, said so) the rows of its first complete batches. The
    last batch dropped whole from a closed stream is the one loss no byte
    shows (a stream does not count its batches, and every batch says the row
    it starts at, so one dropped before others is seen): every row left is
    still exactly as recorded."""
    rows, ends = truth
    assert len(t) > 0, (name, "an empty read must be refused")
    if not src.digests:
        return  # v1: no digest tells a flipped byte of content from a recorded one
    got = _rows(t)
    if name.startswith("drop ") and len(t) < len(rows):
        k = int(name.split()[1])
        assert k == len(ends) - 1, (name, "a batch went missing before others, unseen")
        assert got == rows[: ends[k - 1] if k else 0], name
        return
    assert len(t) in ends, (name, len(t), ends)
    assert len(t) == len(rows) or t.torn_tail, (name, "rows lost without a torn tail")
    assert got == rows[: len(t)], name


def _outputs_match(
    src: Source, name: str, t: Trace, work: Path, truth: tuple[list[tuple[object, ...]], list[int]]
) -> None:
    """What export, convert and merge wrote is the accepted rows'."""
    if not src.digests:
        return
    rows = _rows(t)
    ids = {rec.request_id for rec, _ in rows}  # type: ignore[attr-defined]
    lines = [orjson.loads(x) for x in (work / "x.jsonl").read_bytes().splitlines()]
    assert {x["request_id"] for x in lines} == ids, name
    assert _rows(Trace.open(work / "c.arrow")) == rows, name
    merged = Trace.open(work / "g.arrow")
    assert set(merged.column("request_id")) == ids, name


# -- the properties ---------------------------------------------------------------------


def _fuzz(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # a mutant's name says what it is: no shrinking
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mutants")


@pytest.mark.inprocess
@pytest.mark.parametrize("source", ["stream", "file", "sample-v1"])
@_fuzz(300)
@given(data=st.data())
def test_a_mutant_is_refused_or_reads_as_its_undamaged_part(source, sources, truth, work, data):
    """Many mutants, opened and verified as a replay does first (fast)."""
    src = sources[source]
    mutant = data.draw(mutations(src), label="mutant")
    check_mutant(src, mutant.name, mutant.data, work, truth[source], None, readers=False)


@pytest.mark.inprocess
@pytest.mark.parametrize("source", ["stream", "file", "sample-v1"])
@_fuzz(40)
@given(data=st.data())
def test_every_reader_agrees_and_a_refused_trace_is_never_sent(
    source, sources, truth, listener, work, data
):
    """Fewer mutants, through every reader in replayer.api: inspect, export,
    convert and merge refuse exactly what verification refuses (and write
    what it accepts), replay and bisect of a refused one connect nowhere."""
    src = sources[source]
    mutant = data.draw(mutations(src), label="mutant")
    check_mutant(src, mutant.name, mutant.data, work, truth[source], listener)


@pytest.mark.slow
@pytest.mark.inprocess
@pytest.mark.parametrize("source", ["stream", "file", "sample-v1"])
@_fuzz(400)
@given(data=st.data())
def test_many_mutants_through_every_reader(source, sources, truth, listener, work, data):
    src = sources[source]
    mutant = data.draw(mutations(src), label="mutant")
    check_mutant(src, mutant.name, mutant.data, work, truth[source], listener)


# -- the real command line --------------------------------------------------------------


def _fixed_mutants(sources: dict[str, Source]) -> dict[str, tuple[bytes, str]]:
    """A sample of mutants for the subprocess runs, and the part each error names."""
    stream, file = sources["stream"], sources["file"]
    a, b = file.batches[2]
    flipped = bytearray(file.data)
    flipped[(a + b) // 2] ^= 0x10
    msgs = [stream.data[x:y] for x, y in stream.batches]
    return {
        "flip": (bytes(flipped), "corrupt trace: "),
        "nothing left": (stream.data[: stream.batches[0][1] - 1], "corrupt trace: batch 0: "),
        "duplicate": (_with_batches(stream, [msgs[0], *msgs]), "corrupt trace: batch 1 "),
        "drop": (_with_batches(stream, [msgs[0], *msgs[2:]]), "corrupt trace: batch 1 "),
        "version": (
            _metadata_edit(file, META_VERSION, b"99", redigest=True),
            "schema v99",
        ),
    }


def _cli(cmd: str, trace: Path, url: str, out: Path) -> list[str]:
    o = str(out)
    return {
        "inspect": ["inspect", str(trace)],
        "export": ["export", str(trace), "-o", f"{o}/x.jsonl"],
        "trace convert": ["trace", "convert", str(trace), "-o", f"{o}/c.arrow"],
        "trace merge": ["trace", "merge", str(trace), "-o", f"{o}/g.arrow"],
        "replay": ["replay", str(trace), "--target", url, "--out", f"{o}/r", "--quiet"],
        "bisect": ["bisect", str(trace), "--restart-cmd", "true", "--url", url, "--out", f"{o}/b"],
    }[cmd]


CLI = ("inspect", "export", "trace convert", "trace merge", "replay", "bisect")
MUTANTS = ("flip", "nothing left", "duplicate", "drop", "version")


def _run_cli(
    sources: dict[str, Source], listener: Listener, tmp_path: Path, cmd: str, mutant: str
) -> None:
    data, fragment = _fixed_mutants(sources)[mutant]
    m = tmp_path / "m.arrow"
    m.write_bytes(data)
    out = tmp_path / "out"
    before = listener.connections()
    args = _cli(cmd, m, listener.url, out)
    res = subprocess.run(
        [sys.executable, "-m", "replayer", *args], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2, (res.returncode, res.stderr)
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"replayer {args[0]}: error: {m}: "), line
    assert fragment in line, line
    assert res.stdout == ""
    assert not out.exists() or not any(out.rglob("*.arrow")) and not any(out.rglob("*.jsonl"))
    assert listener.connections() == before


SAMPLED = (
    ("inspect", "nothing left"),
    ("export", "duplicate"),
    ("trace convert", "version"),
    ("trace merge", "flip"),
    ("replay", "duplicate"),
    ("inspect", "drop"),
    ("bisect", "nothing left"),
)
"""One mutant each: the issue's cases (a cut with nothing left for inspect
and bisect, a repeated batch replay would send twice, a batch gone from the
middle of a stream)."""


@pytest.mark.parametrize(("cmd", "mutant"), SAMPLED)
def test_the_command_line_says_one_line_and_exits_2(sources, listener, tmp_path, cmd, mutant):
    _run_cli(sources, listener, tmp_path, cmd, mutant)


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MUTANTS)
@pytest.mark.parametrize("cmd", CLI)
def test_every_command_on_every_sampled_mutant(sources, listener, tmp_path, cmd, mutant):
    _run_cli(sources, listener, tmp_path, cmd, mutant)


# -- a trace with nothing left ----------------------------------------------------------


@pytest.mark.inprocess
@pytest.mark.parametrize("form", ["stream", "file"])
def test_a_trace_torn_before_its_first_batch_is_refused_everywhere(sources, tmp_path, form):
    """Cut anywhere between the end of the schema and the end of the first
    batch: nothing is left, and every reader (inspect and export too) says
    so as the others do, instead of reading an empty trace."""
    src = sources[form]
    at = 8 if form == "file" else 0
    first = next(b for m, _, b in scan(pa.py_buffer(src.data[at:])).messages if m.type == "schema")
    m = tmp_path / "cut.arrow"
    for cut in (at + first, (at + first + src.batches[0][1]) // 2, src.batches[0][1] - 1):
        m.write_bytes(src.data[:cut])
        readers: dict[str, Callable[[], object]] = {
            "open": lambda: Trace.open(m),
            "inspect": lambda: api.inspect(m),
            "export": lambda: api.export(m, tmp_path / "x.jsonl", force=True),
            "convert": lambda: api.convert(m, tmp_path / "c.arrow", force=True),
            "merge": lambda: api.merge([m], tmp_path / "g.arrow", force=True),
        }
        for what, fn in readers.items():
            with pytest.raises(TraceCorruptError) as err:
                fn()
            assert str(err.value) == f"{m}: corrupt trace: batch 0: {NOTHING_LEFT}", (what, cut)
        assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "c.arrow").exists()


@pytest.mark.inprocess
def test_a_torn_segment_keeps_its_complete_batches_with_a_warning(sources, tmp_path, caplog):
    """The documented recovery: a recorder segment killed in its third batch."""
    src = sources["stream"]
    m = tmp_path / "seg.arrow"
    m.write_bytes(src.data[: src.batches[2][0] + 40])
    with caplog.at_level("WARNING", logger="replayer.trace"):
        info = api.inspect(m)
    assert (info["requests"], info["torn_tail"]) == (6, True)
    assert (
        "incomplete tail dropped (writer was interrupted); 2 complete batches kept" in caplog.text
    )
