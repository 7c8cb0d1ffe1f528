"""A damaged trace, read by every command that reads one: one byte flipped
in the header, the first, middle and last batch, or the footer. Each command
exits 2 with exactly one stderr line naming the file and the damaged part,
prints nothing else, writes no output, and sends nothing to the target.

The commands run in process (``replayer.cli.main``); two also run as real
subprocesses. A flip in alignment padding decodes to nothing and reads as
the clean trace (``test_digests`` proves that content is identical), so no
offset here lands in padding.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import signal
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from replayer.cli import main
from replayer.testing.emulator import EmulatorProcess
from replayer.trace import Trace
from replayer.trace.framing import scan
from tests.helpers.traces import write_current


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_current(tmp_path_factory.mktemp("clean") / "t.arrow", flush_rows=3)


def _offsets(path: Path) -> dict[str, tuple[int, str]]:
    """Where to flip a byte, and the part of the trace the error must name."""
    data = path.read_bytes()
    framing = scan(pa.py_buffer(data[8:]))
    batches = [(m, a, b) for m, a, b in framing.messages if m.type == "record batch"]
    assert len(batches) == 5
    t = Trace.open(path)

    def middle_of_batch(k: int) -> tuple[int, str]:
        msg, _, end = batches[k]
        start, n = 3 * k, t._batch_lengths[k]
        return 8 + end - msg.body.size // 2, f"batch {k} (rows {start}..{start + n - 1})"

    source = data.index(b'"source":"test-fixture"') + len(b'"source":"test-')
    table = data.rindex(struct.pack("<q", 8 + batches[0][1]))  # footer: batch 0's offset
    return {
        "header": (source, "header"),
        "first-batch": middle_of_batch(0),
        "middle-batch": middle_of_batch(2),
        "last-batch": middle_of_batch(4),
        "footer": (table, "file footer"),
    }


OFFSETS = ("header", "first-batch", "middle-batch", "last-batch", "footer")


@pytest.fixture(scope="module")
def damaged(clean: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    out = {}
    d = tmp_path_factory.mktemp("damaged")
    data = clean.read_bytes()
    for name, (off, where) in _offsets(clean).items():
        b = bytearray(data)
        b[off] ^= 0x01
        (d / f"{name}.arrow").write_bytes(bytes(b))
        out[name] = (d / f"{name}.arrow", where)
    return out


class Target:
    """One emulator for the module, and a way to tell it received nothing."""

    def __init__(self, emu: EmulatorProcess) -> None:
        self.emu = emu
        self.n = 0

    def traffic(self) -> int:
        """HTTP requests it has answered, after a barrier request of our own
        has been logged (so nothing sent earlier is still unlogged)."""
        self.n += 1
        with urllib.request.urlopen(f"{self.emu.url}/health?barrier={self.n}", timeout=10):
            pass
        self.emu.wait_log(f"barrier={self.n}")
        return self.emu.log_path.read_text().count(' HTTP/1.1" ') - self.n


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    emu = EmulatorProcess(["--speed", "instant"], workdir=tmp_path_factory.mktemp("emu"))
    emu.start()
    try:
        yield Target(emu)
    finally:
        emu.stop()


def _commands(trace: Path, url: str, tmp: Path) -> dict[str, list[str]]:
    bundle = tmp / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_bytes(orjson.dumps({"policy": {"timing": "asap"}}))
    shutil.copyfile(trace, bundle / "trace.arrow")
    t, o = str(trace), str(tmp)
    return {
        "inspect": ["inspect", t],
        "inspect --verify": ["inspect", t, "--verify"],
        "export": ["export", t, "-o", f"{o}/x.jsonl"],
        "replay": ["replay", t, "--target", url, "--timing", "asap", "--out", f"{o}/r", "--quiet"],
        "check": ["check", t, "--url", url, "--timing", "asap", "--out", f"{o}/c"],
        "bisect": ["bisect", t, "--restart-cmd", "true", "--url", url, "--out", f"{o}/b"],
        "soak": ["soak", t, "--url", url, "--runs", "1", "--out", f"{o}/s"],
        "bundle verify": ["bundle", "verify", str(bundle), "--url", url, "--out", f"{o}/v"],
        "sweep": ["sweep", t, "--target", url, "--max-inflight", "1,2", "--out", f"{o}/w"],
    }


COMMANDS = (
    "inspect",
    "inspect --verify",
    "export",
    "replay",
    "check",
    "bisect",
    "soak",
    "bundle verify",
    "sweep",
)


@pytest.fixture
def restore_sigterm() -> Iterator[None]:
    """main() turns SIGTERM into Ctrl-C for the commands that run servers."""
    old = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, old)


def _in_process(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_reader_refuses_a_damaged_trace_before_sending(
    damaged, target, tmp_path, command, offset, restore_sigterm
):
    bad, where = damaged[offset]
    args = _commands(bad, target.emu.url, tmp_path)[command]
    before = target.traffic()
    rc, out, err = _in_process(args)
    assert rc == 2, (rc, err)
    (line,) = err.strip().splitlines()
    read = tmp_path / "bundle" / "trace.arrow" if command == "bundle verify" else bad
    prefix = f"replayer {args[0]}: error: {read}: corrupt trace: {where}: "
    assert line.startswith(prefix), line
    assert out == ""
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "r").exists()
    assert target.traffic() == before
    assert target.emu.events("request") == []


def test_the_clean_trace_passes_every_reader(clean, emulator, tmp_path, restore_sigterm):
    """The control: the same commands on the undamaged trace get past the
    check (inspect and export succeed; replay sends every request)."""
    cmds = _commands(clean, emulator.url, tmp_path)
    for name in ("inspect", "inspect --verify", "export"):
        rc, _, err = _in_process(cmds[name])
        assert rc == 0, (name, err)
    assert len((tmp_path / "x.jsonl").read_bytes().splitlines()) == 14
    rc, _, err = _in_process(cmds["replay"])
    assert rc == 0, err
    assert len(emulator.events("request")) == 14


@pytest.mark.parametrize("command", ["inspect", "replay"])
def test_a_real_process_prints_one_line_and_no_traceback(damaged, target, tmp_path, command):
    bad, where = damaged["middle-batch"]
    args = _commands(bad, target.emu.url, tmp_path)[command]
    before = target.traffic()
    res = subprocess.run(
        [sys.executable, "-m", "replayer", *args], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert f"corrupt trace: {where}: " in res.stderr
    assert target.traffic() == before
