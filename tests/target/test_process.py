"""LaunchedTarget against real emulator subprocesses on 127.0.0.1: launch,
readiness, crash and exit codes, restarts, stop escalation, launch failures,
and no leaked processes or ports."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from replayer.errors import LaunchError, ModelNotServed, TargetError
from replayer.monitor.signature import signature_from_log
from replayer.target import ExitInfo, LaunchedTarget
from replayer.target.process import group_members, split_command
from tests.helpers.net import free_port
from tests.helpers.target import (
    MODEL,
    assert_group_gone,
    assert_port_free,
    chat,
    emulator_cmd,
    live_members,
    until_up,
)

pytestmark = pytest.mark.e2e

READY, EXIT = 120.0, 60.0
"""Bounds on how long an emulator may take to start or to exit: generous,
because a loaded machine is slow, and never reached when things work."""


async def test_launch_crash_restart_three_times(launched):
    t = launched("--fault", "exit code=3 when request=1", load_time=1.0)
    port = int(t.url.rsplit(":", 1)[1])
    pgids = []
    await t.start()
    for cycle in range(1, 4):
        assert t.launches == cycle
        assert t.alive() is True
        assert t.exit_info is None
        await t.wait_ready(READY)
        pgids.append(t.pid)
        async with httpx.AsyncClient(base_url=t.url, timeout=10) as c:
            assert (await c.get("/health")).status_code == 200
            r = await c.post(
                "/v1/chat/completions",
                json=chat(max_tokens=2),
                headers={"X-Request-Id": f"c{cycle}"},
            )
        assert r.status_code == 500  # the dead engine; vLLM then shuts down
        info = await t.wait_exit(EXIT)
        assert (info.code, info.signal, info.text) == (3, None, "code 3")
        assert t.alive() is False
        assert_group_gone(pgids[-1])
        assert_port_free(port)
        sig = signature_from_log(
            await t.collect_log(), failure_class="process_exit", exit_code=info.code
        )
        assert sig.suspects == (f"c{cycle}",)  # only this launch's log is read
        if cycle < 3:
            await t.restart()
    assert await t.stop() == info  # stopping an exited target changes nothing
    assert len(set(pgids)) == 3
    for pgid in pgids:
        assert_group_gone(pgid)
    assert_port_free(port)
    text = t.log_file.read_text()
    assert [ln.split(" at ")[0] for ln in text.splitlines() if ln.startswith("==> ")] == [
        "==> replayer launch 1",
        "==> replayer launch 2",
        "==> replayer launch 3",
    ]
    assert text.count("Finished server process") == 3
    assert text.count("EngineCore encountered a fatal error.") == 3


async def test_stop_is_sigterm_and_graceful(launched):
    t = launched()
    await t.start()
    await t.wait_ready(READY)
    pgid = t.pid
    info = await t.stop()
    assert info is not None and (info.code, info.signal) == (0, None)  # vLLM-style clean exit
    assert_group_gone(pgid)
    assert_port_free(int(t.url.rsplit(":", 1)[1]))
    assert "Finished server process" in t.log_file.read_text()


async def test_killed_server_reports_the_signal(launched):
    t = launched("--fault", "cut kill=1 when request=1")
    await t.start()
    await t.wait_ready(READY)
    async with httpx.AsyncClient(base_url=t.url, timeout=10) as c:
        with pytest.raises(httpx.TransportError):
            async with c.stream(
                "POST", "/v1/chat/completions", json=chat(stream=True, max_tokens=50)
            ) as r:
                async for _ in r.aiter_bytes():
                    pass
    info = await t.wait_exit(EXIT)
    assert (info.code, info.signal, info.text) == (None, signal.SIGKILL, "signal SIGKILL")


STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print("CHILD-PID:" + str(child.pid), flush=True)
time.sleep(600)
"""


async def test_stop_escalates_to_sigkill_for_the_whole_group(tmp_path, caplog):
    log = tmp_path / "server.log"
    t = LaunchedTarget([sys.executable, "-c", STUBBORN], "http://127.0.0.1:9", log, stop_grace=0.3)
    await t.start()
    pgid = t.pid
    assert pgid is not None
    for _ in range(1000):  # bounded: until the child is up
        found = re.search(r"^CHILD-PID:(\d+)$", log.read_text(), re.MULTILINE)
        if found:
            break
        await asyncio.sleep(0.01)
    assert found is not None
    child = int(found[1])
    assert sorted(live_members(pgid)) == sorted([pgid, child])
    with caplog.at_level(logging.WARNING, logger="replayer.target"):
        info = await t.stop()
    assert info is not None and (info.code, info.signal) == (None, signal.SIGKILL)
    # SIGKILL once the 0.3 s grace was up, not after the 600 s sleep
    assert [r.getMessage() for r in caplog.records] == [
        f"{sys.executable}: SIGKILL after 0.3s of SIGTERM"
    ]
    assert live_members(pgid) == []
    assert group_members(pgid) == []
    assert t.alive() is False


async def test_launch_failure_is_reported_at_once_with_the_log_tail(launched):
    t = launched("--no-such-option")
    await t.start()
    started = time.monotonic()
    with pytest.raises(LaunchError) as err:
        await t.wait_ready(600)
    assert time.monotonic() - started < 600  # at the exit, not the timeout (exact: test_base)
    msg = str(err.value)
    first, _, tail = msg.partition("\n")
    assert first.startswith(f"{sys.executable} exited (code 2) ")
    assert first.endswith(f"after launch 1, before it was ready; log tail ({t.log_file}):")
    assert "unrecognized arguments: --no-such-option" in tail
    assert "==> replayer launch" not in tail
    assert t.exit_info is not None and t.exit_info.code == 2


async def test_unknown_executable_fails_at_start(tmp_path):
    t = LaunchedTarget(["/nonexistent/vllm", "serve"], "http://127.0.0.1:9", tmp_path / "s.log")
    with pytest.raises(LaunchError, match=r"^cannot launch '/nonexistent/vllm': No such file"):
        await t.start()
    assert "replayer: cannot launch" in (tmp_path / "s.log").read_text()
    assert t.alive() is False


async def test_a_start_cancelled_mid_launch_leaves_no_process(tmp_path):
    # a pool closed (or a trial cancelled) while a server launches: the launch
    # goes on in its thread, and stop() ends what it made
    from replayer._async import spawn

    t = LaunchedTarget([sys.executable, "-c", "import time; time.sleep(60)"],
                       "http://127.0.0.1:9", tmp_path / "s.log")  # fmt: skip
    task = spawn(t.start(), name="start")
    for _ in range(1000):  # until the launch is under way (loop passes, bounded)
        if t._launching is not None:
            break
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    await t.stop()
    proc = t._proc
    assert proc is not None and proc.returncode is not None  # made, stopped and reaped
    assert_group_gone(proc.pid)


async def test_a_start_after_a_cancelled_one_stops_what_that_one_made(tmp_path):
    # a trial cancelled mid-restart, then the next trial starts the server
    # again without a stop: the cancelled launch's process is stopped, never
    # left running under the new one (nor put in its place)
    from replayer._async import spawn

    t = LaunchedTarget([sys.executable, "-c", "import time; time.sleep(60)"],
                       "http://127.0.0.1:9", tmp_path / "s.log")  # fmt: skip
    task = spawn(t.start(), name="start")
    for _ in range(1000):  # until the launch is under way (loop passes, bounded)
        if t._launching is not None:
            break
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    first = t._launching
    await t.start()
    assert first is not None and first.done()
    old = first.result()
    assert isinstance(old, subprocess.Popen) and old.returncode is not None
    assert_group_gone(old.pid)
    new = t._proc
    assert new is not None and new is not old and t.alive()
    await t.stop()
    assert new.returncode is not None
    assert_group_gone(new.pid)


async def test_a_launch_no_start_kept_is_stopped_with_the_target(tmp_path):
    # however a launch's start comes to lose it (cancelled, overtaken, its
    # task dropped at loop shutdown), the launching thread noted the process:
    # stop() ends it with the current one, none outlives the target unowned
    t = LaunchedTarget([sys.executable, "-c", "import time; time.sleep(60)"],
                       "http://127.0.0.1:9", tmp_path / "s.log")  # fmt: skip
    await t.start()
    current = t._proc
    stray = await asyncio.to_thread(t._popen)  # a launch whose start never saw it
    assert isinstance(stray, subprocess.Popen) and current is not None
    assert t._proc is current
    await t.stop()
    assert current.returncode is not None and stray.returncode is not None
    assert_group_gone(current.pid)
    assert_group_gone(stray.pid)


async def test_ready_timeout_while_loading(launched):
    t = launched(load_time=30.0)
    await t.start()
    started = time.monotonic()
    with pytest.raises(LaunchError) as err:
        await t.wait_ready(1.0)
    assert time.monotonic() - started >= 1.0  # the schedule itself: test_base, exactly
    assert str(err.value).startswith(f"{t.url} not ready after 1s: connection refused")
    info = await t.stop()  # no SIGTERM handler while "loading": the default action
    assert info == ExitInfo(None, signal.SIGTERM, info.at)


async def test_a_launch_serving_another_model_fails_at_its_first_model_list(launched):
    # it used to wait out the whole ready timeout (30 min by default) in silence
    t = launched("--served-model-name", "other-model")
    await t.start()
    await until_up(t.url, READY)  # else a slow start fails the probes first
    with pytest.raises(ModelNotServed) as err:
        await t.wait_ready(600.0)  # bounded by the test's own timeout, never reached
    assert str(err.value) == (
        f"target {t.url} does not serve model {MODEL} (it serves other-model); "
        "pass --model other-model"
    )
    assert (err.value.missing, err.value.served, err.value.exit_code) == (
        [MODEL],
        ["other-model"],
        2,
    )


async def test_start_twice_is_an_error(launched):
    t = launched()
    await t.start()
    with pytest.raises(TargetError, match="already running"):
        await t.start()


def test_split_command_takes_leading_assignments_as_env():
    argv, env = split_command(
        "VLLM_ROCM_USE_AITER=1 HIP_VISIBLE_DEVICES=0,1 vllm serve m --port 8001"
    )
    assert argv == ["vllm", "serve", "m", "--port", "8001"]
    assert env == {"VLLM_ROCM_USE_AITER": "1", "HIP_VISIBLE_DEVICES": "0,1"}
    assert split_command(["a", "X=1"]) == (["a", "X=1"], {})


def test_emulator_cmd_port_is_free():
    port = free_port()
    assert emulator_cmd(port)[4] == str(port)
    assert_port_free(port)


async def test_waiting_on_a_target_that_is_not_running(tmp_path, launched):
    idle = LaunchedTarget(["true"], "http://127.0.0.1:9", tmp_path / "s.log")
    with pytest.raises(TargetError, match="^not started$"):
        await idle.wait_exit(1)
    with pytest.raises(TargetError, match="^the target was not started$"):
        await idle.wait_ready(1)
    assert await idle.stop() is None and idle.alive() is False and idle.tail() == ""
    t = launched()
    await t.start()
    with pytest.raises(TimeoutError, match=r"still running after 0.2s$"):
        await t.wait_exit(0.2)
    pgid = t.pid
    assert pgid is not None
    t.kill()  # the interpreter-exit path: SIGKILL now, no waiting beyond a second
    assert t.exit_info is not None and t.exit_info.signal == signal.SIGKILL
    assert_group_gone(pgid)
