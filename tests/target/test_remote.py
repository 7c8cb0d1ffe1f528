"""RestartableTarget driven by a small restart script that plays the part of
``docker restart`` (kill the old server, start a new one detached), with
``--log-cmd`` fetching the server's log; and the restart command's failures."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from replayer.errors import TargetError
from replayer.monitor.logs import last_launch
from replayer.monitor.signature import signature_from_log
from replayer.target import RestartableTarget
from replayer.target.remote import run_command
from tests.helpers.net import free_port
from tests.helpers.target import MODEL, assert_port_free, chat, live_members

pytestmark = pytest.mark.e2e

RESTART = """
import os, signal, subprocess, sys, time
from pathlib import Path
state, port = Path(sys.argv[1]), sys.argv[2]
pidfile, log = state / "pid", state / "emulator.log"
if pidfile.exists():
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    for _ in range(1000):  # bounded: until the old server is gone (or a zombie)
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.01)
with log.open("wb") as out:  # a fresh container log
    proc = subprocess.Popen(
        [sys.executable, "-m", "replayer.emulator", "--port", port, "--load-time", "0.3",
         "--speed", "instant", *sys.argv[3:]],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
pidfile.write_text(str(proc.pid))
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def remote_server(tmp_path):
    """A server someone else runs: a restart command and a log command for it."""
    state = tmp_path / "host"
    state.mkdir()
    script = tmp_path / "restart.py"
    script.write_text(RESTART)
    port = free_port()
    fault = "exit when request=1"
    cmd = shlex.join([sys.executable, str(script), str(state), str(port), "--fault", fault])
    subprocess.run(shlex.split(cmd), check=True, timeout=30)  # the server was already up
    yield {"restart": cmd, "log": f"cat {state / 'emulator.log'}", "port": port, "state": state}
    pid = int((state / "pid").read_text())
    started = live_members(pid)
    if started:
        os.killpg(pid, signal.SIGKILL)
    for _ in range(500):  # bounded: until the last server is gone
        if _gone(pid):
            break
        time.sleep(0.01)
    assert _gone(pid)
    assert_port_free(port)


async def test_restart_cmd_target_crash_log_restart_ready(remote_server, tmp_path):
    port = remote_server["port"]
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "run" / "server.log"
    t = RestartableTarget(
        remote_server["restart"], url, log_cmd=remote_server["log"], log_path=log_path, model=MODEL
    )
    assert t.can_restart is True and t.alive() is None
    await t.start()
    await t.wait_ready(120)
    first_pid = int((remote_server["state"] / "pid").read_text())
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        r = await c.post("/v1/chat/completions", json=chat(), headers={"X-Request-Id": "turn-7"})
    assert r.status_code == 500
    text = await t.collect_log()
    assert "EngineCore encountered a fatal error." in text
    assert signature_from_log(text, failure_class="process_exit").suspects == ("turn-7",)

    await t.restart()
    assert t.launches == 2
    await t.wait_ready(120)
    assert int((remote_server["state"] / "pid").read_text()) != first_pid
    assert _gone(first_pid)
    text = await t.collect_log()
    assert "Application startup complete." in text
    assert "EngineCore encountered a fatal error." not in text
    whole = log_path.read_text()
    markers = [ln for ln in whole.splitlines() if ln.startswith("==> replayer launch")]
    assert [m.split(" at ")[0] for m in markers] == [
        "==> replayer launch 1",
        "==> replayer launch 2",
    ]
    assert markers[0].endswith(f": attach {url}")
    assert markers[1].endswith(": " + remote_server["restart"])
    first_launch = whole.split(markers[1])[0]  # kept by the restart: the crash's log
    assert first_launch.count("EngineCore encountered a fatal error.") == 1
    assert last_launch(whole) == text
    facts = await t.facts()
    assert facts.command == {
        "kind": "RestartableTarget",
        "log_cmd": remote_server["log"],
        "launches": 2,
        "restart_cmd": remote_server["restart"],
    }
    assert [m["id"] for m in facts.models] == [MODEL]


async def test_restart_cmd_failure_is_one_line(tmp_path):
    t = RestartableTarget("echo starting; echo 'no such container: vllm' >&2; exit 7", "http://x")
    with pytest.raises(TargetError) as err:
        await t.restart()
    assert str(err.value) == "--restart-cmd exited with code 7: no such container: vllm"


async def test_restart_cmd_timeout_kills_its_process_group(tmp_path):
    pidfile = tmp_path / "pid"
    t = RestartableTarget(f"echo $$ > {pidfile}; exec sleep 60", "http://x", command_timeout=2.0)
    started = time.monotonic()
    with pytest.raises(TargetError) as err:
        await t.restart()
    assert time.monotonic() - started < 60  # killed, not waited for
    assert str(err.value) == "--restart-cmd did not finish within 2s"
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


async def test_log_command_placeholders(tmp_path):
    t = RestartableTarget(
        "true",
        "http://x",
        log_cmd="docker logs --since {since} vllm # {since_unix}",
        log_path=tmp_path / "s.log",
    )
    t.since = 1785379867.5
    assert t.log_command() == "docker logs --since 2026-07-30T02:51:07Z vllm # 1785379867"


async def test_run_command_captures_output():
    res = await run_command("echo out; echo err >&2; exit 3", within=10)
    assert (res.code, res.stderr, res.stdout, res.last_line) == (3, "err\n", "out\n", "err")
    res = await run_command("echo out", within=10)
    assert (res.code, res.last_line) == (0, "out")


async def test_log_cmd_failures_keep_what_there_is(tmp_path, caplog):
    log_path = tmp_path / "server.log"
    t = RestartableTarget("true", "http://x", log_cmd="echo partial; exit 3", log_path=log_path)
    with caplog.at_level("WARNING", logger="replayer.target"):
        assert await t.collect_log() == "partial\n"  # never started: attaches first
    assert t.launches == 1
    # its stdout went to the log file; stderr was empty
    assert [r.getMessage() for r in caplog.records] == ["--log-cmd exited with code 3"]
    slow = RestartableTarget(
        "true",
        "http://x",
        log_cmd="echo early; exec sleep 30",
        log_path=log_path,
        command_timeout=0.3,
    )
    await slow.start()
    assert await slow.collect_log() == "early\n"
    assert log_path.read_text().count("==> replayer launch 1 ") == 2  # one per target
    with pytest.raises(ValueError, match="log_cmd needs a log_path"):
        RestartableTarget("true", "http://x", log_cmd="cat log")
    plain = RestartableTarget("true", "http://x")
    assert await plain.collect_log() == "" and plain.log_command() is None
    assert (await run_command("true", within=5)).last_line == ""
