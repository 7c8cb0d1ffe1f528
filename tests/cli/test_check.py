"""``replayer check`` (one trial, git-bisect / reducer exit codes) and
``replayer replay --launch``, against emulators the commands launch."""

from __future__ import annotations

import shlex
import socket
import sys

import orjson
import pytest

from tests.helpers.cli import SAMPLE, assert_one_line_error, run
from tests.helpers.net import free_port


def launch(port, *fault):
    args = [sys.executable, "-m", "replayer.emulator", "--port", str(port), "--speed", "instant"]
    for f in fault:
        args += ["--fault", f]
    return shlex.join(args)


def check(tmp_path, *extra, fault=(), name="r"):
    port = free_port()
    res = run(
        "check",
        SAMPLE,
        "--launch",
        launch(port, *fault),
        "--limit",
        "12",
        "--timing",
        "asap",
        "--settle",
        "3",
        "--health-interval",
        "0.2",
        "--out",
        tmp_path / name,
        *extra,
    )
    # the launched server is stopped afterwards: its port is free again
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return res


@pytest.mark.parametrize(
    "convention,fault,extra,code",
    [
        ("bisect", (), (), 0),
        ("bisect", ("exit when request=4",), (), 1),
        ("bisect", ("exit when request=4",), ("--signature", "CUDA error"), 125),
        ("reduce", (), (), 1),
        ("reduce", ("exit when request=4",), ("--signature", "Memory access fault"), 0),
        (
            "reduce",
            ("exit when request=4",),
            ("--signature", "nope", "--also-interesting", "77"),
            77,
        ),
    ],
    ids=["pass", "match", "other", "r-pass", "r-match", "r-also"],
)
def test_exit_codes(tmp_path, convention, fault, extra, code):
    res = check(tmp_path, "--convention", convention, *extra, fault=fault)
    assert res.returncode == code, res.stdout + res.stderr
    if fault:
        sig = orjson.loads((tmp_path / "r" / "signature.json").read_bytes())
        assert sig["failure_class"] == "process_exit"
        assert "Memory access fault by GPU" in sig["text"]
        assert (tmp_path / "r" / "server.log").stat().st_size > 0


def test_launch_failure_is_infrastructure(tmp_path):
    res = run(
        "check",
        SAMPLE,
        "--launch",
        f"{sys.executable} -m replayer.emulator --port {free_port()} --no-such-option",
        "--limit",
        "3",
        "--out",
        tmp_path / "r",
    )
    assert res.returncode == 125
    assert "outcome: INFRA" in res.stdout


def test_replay_launch_reports_the_signature(tmp_path):
    port = free_port()
    res = run(
        "replay",
        SAMPLE,
        "--launch",
        launch(port, "dead when request=5"),
        "--limit",
        "12",
        "--timing",
        "asap",
        "--settle",
        "2",
        "--out",
        tmp_path / "r",
        "--quiet",
    )
    assert res.returncode == 1, res.stderr
    summary = orjson.loads((tmp_path / "r" / "summary.json").read_bytes())
    f = summary["targets"]["target"]["failure"]
    assert f["class"] == "engine_dead"
    assert f["signature"]["failure_class"] == "engine_dead"
    assert f["signature"]["suspects"]  # the scheduler dump named the batch
    assert "signature" in res.stdout


@pytest.mark.parametrize("command", ["replay", "check", "bisect"])
def test_a_launch_serving_another_model_fails_at_once_with_replays_message(tmp_path, command):
    """The launched server lists other models than the trace's: one line and
    exit 2 as soon as ``/v1/models`` answers (bisect used to wait out
    ``--ready-timeout`` in silence), and the server is stopped."""
    port = free_port()
    cmd = launch(port) + " --served-model-name other-model"
    res = run(
        command, SAMPLE, "--launch", cmd, "--ready-timeout", "600", "--timing", "asap",
        "--out", tmp_path / "out", timeout=120,
    )  # fmt: skip
    assert_one_line_error(
        res,
        "does not serve model moonshotai/Kimi-K3 (it serves other-model); pass --model other-model",
    )
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
