"""make_target: which target the options describe, and the usage errors."""

from __future__ import annotations

import pytest

from replayer.errors import UsageError
from replayer.target import (
    ExternalTarget,
    LaunchedTarget,
    RestartableTarget,
    make_target,
    url_from_command,
)

pytestmark = pytest.mark.inprocess


def test_launch_reads_the_url_from_the_command(tmp_path):
    t = make_target(
        launch="VLLM_SERVER_DEV_MODE=1 vllm serve m --host 0.0.0.0 --port 8123",
        log_path=tmp_path / "server.log",
        env={"NCCL_DEBUG": "INFO"},
        model="m",
    )
    assert isinstance(t, LaunchedTarget)
    assert t.url == "http://127.0.0.1:8123"
    assert t.argv == ["vllm", "serve", "m", "--host", "0.0.0.0", "--port", "8123"]
    assert t.env == {"VLLM_SERVER_DEV_MODE": "1", "NCCL_DEBUG": "INFO"}
    assert t.can_restart and t.model == "m" and t.log_path == tmp_path / "server.log"
    explicit = make_target(launch=["vllm", "serve"], url="http://h:1/", log_path=tmp_path / "s")
    assert explicit.url == "http://h:1"


@pytest.mark.parametrize(
    ("argv", "url"),
    [
        (["vllm", "serve", "m"], "http://127.0.0.1:8000"),
        (["vllm", "serve", "--port=9001", "--host=10.0.0.3"], "http://10.0.0.3:9001"),
        (["vllm", "serve", "--host", "::"], "http://127.0.0.1:8000"),
        (["vllm", "serve", "--host", "::1", "--port", "1"], "http://[::1]:1"),
    ],
)
def test_url_from_command(argv, url):
    assert url_from_command(argv) == url


def test_restart_cmd_and_url(tmp_path):
    t = make_target(
        restart_cmd="docker restart vllm",
        url="http://h:8000",
        log_cmd="docker logs vllm",
        log_path=tmp_path / "s.log",
    )
    assert isinstance(t, RestartableTarget)
    assert (t.restart_cmd, t.log_cmd, t.log_path) == (
        "docker restart vllm",
        "docker logs vllm",
        tmp_path / "s.log",
    )
    bare = make_target(
        restart_cmd="docker restart vllm", url="http://h:8000", log_path=tmp_path / "s.log"
    )
    assert isinstance(bare, RestartableTarget) and bare.log_path is None


def test_url_alone():
    t = make_target(url="http://h:8000")
    assert isinstance(t, ExternalTarget) and not t.can_restart


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"launch": "vllm serve", "restart_cmd": "x"},
            "launch and restart_cmd are exclusive: give one",
        ),
        ({"launch": "vllm serve"}, "launch needs a log file (the run directory's server.log)"),
        (
            {"launch": "vllm serve", "log_cmd": "cat x", "log_path": "p"},
            "log_cmd is for restart_cmd or url: a launched server's log is captured already",
        ),
        ({"launch": "  ", "log_path": "p"}, "--launch: empty command"),
        (
            {"launch": "vllm 'serve", "log_path": "p"},
            '--launch: cannot split "vllm \'serve": No closing quotation',
        ),
        (
            {"launch": "vllm --port x", "log_path": "p"},
            "launch cannot read a port from --port 'x'; give url",
        ),
        ({"restart_cmd": "x"}, "restart_cmd needs url (where the restarted server listens)"),
        ({}, "launch or restart_cmd with url, or url alone: no server given"),
        ({"url": "http://h", "env": {"A": "1"}}, "env applies only to a launched server (launch)"),
    ],
)
def test_usage_errors(kw, message):
    with pytest.raises(UsageError) as err:
        make_target(**kw)
    assert str(err.value) == message
