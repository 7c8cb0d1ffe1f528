"""The emulator as a process: vLLM's start-up (refused connections while
loading, then the ready lines), graceful SIGTERM, and the CLI's one-line
errors."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys

import pytest

from replayer.cli import build_parser
from replayer.testing.emulator import EmulatorProcess, poll_until
from tests.helpers.emulator import in_order

pytestmark = pytest.mark.e2e


def test_port_refuses_connections_until_loaded(tmp_path):
    emu = EmulatorProcess(["--speed", "instant", "--load-time", "1.5"], workdir=tmp_path)
    try:
        emu.launch()
        emu.wait_log("GPU KV cache size: 1,048,576 tokens")  # loading has begun
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", emu.port), timeout=5).close()
        assert "Starting vLLM server" not in emu.read_log()
        emu.wait_ready()
        assert emu.health() == 200
        in_order(
            emu.read_log(),
            "vLLM server version 0.33.0, serving model moonshotai/Kimi-K3",
            "non-default args: {'port': 0, 'load_time': 1.5, 'speed': 0.0}",
            "Initializing a V1 LLM engine (v0.33.0) with config: model='moonshotai/Kimi-K3'",
            f"Starting vLLM server on http://127.0.0.1:{emu.port}",
            "Available routes are:",
            "Route: /health, Methods: GET",
            "Route: /v1/chat/completions, Methods: POST",
            f"INFO:     Started server process [{emu.pid}]",
            "INFO:     Waiting for application startup.",
            "INFO:     Application startup complete.",
        )
    finally:
        assert emu.stop() == 0
    in_order(
        emu.read_log(),
        "INFO:     Shutting down",
        "Application shutdown complete.",
        f"Finished server process [{emu.pid}]",
    )


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replayer", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--fault", "boom"],
            "replayer emulate: error: bad fault spec 'boom': unknown effect "
            "'boom'; have exit, dead, hang, cut, slow, error",
        ),
        (["--fault", "exit when colour>=2"], "unknown variable 'colour'"),
        (["--speed", "fast"], "argument --speed: expected 'instant' or a number, got 'fast'"),
        (["--max-model-len", "lots"], "argument --max-model-len: not an integer: 'lots'"),
        (["--fault-file", "/nonexistent/faults.toml"], "bad fault file /nonexistent/faults.toml"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(args, message):
    r = run_cli("emulate", "--port", "0", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and message in r.stderr
    assert "Traceback" not in r.stderr


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = run_cli("emulate", "--host", "127.0.0.1", "--port", str(s.getsockname()[1]))
    assert r.returncode == 2 and r.stderr.startswith("replayer emulate: error: cannot bind")
    assert r.stderr.count("\n") == 1


def test_help_documents_every_option():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    emulate = sub.choices["emulate"]
    for action in emulate._actions:
        assert action.help, f"{action.option_strings} has no help"
    r = run_cli("emulate", "--help")
    assert r.returncode == 0
    for action in emulate._actions:
        assert action.option_strings[-1] in r.stdout
    assert "fault examples:" in r.stdout and "exit code=1 gpu=cuda" in r.stdout


def test_the_cli_entry_point_serves(tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "emulate",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--speed",
            "instant",
            "--disable-uvicorn-access-log",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        poll_until(lambda: port_file.exists() and port_file.read_text().endswith("\n"), 30)
        port = int(port_file.read_text())

        def ok() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", "/health")
                return conn.getresponse().status == 200
            except OSError:
                return False
            finally:
                conn.close()

        poll_until(ok, 30)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert b"Application startup complete." in out and b'"GET /health' not in out
