"""Tests judge their own processes only. Decoys that look like ours by name
(a ``VLLM::EngineCore`` retitled with ``exec -a``, an unrelated emulator
server in its own session) run beside a tree this test starts; the helpers
that find "leftover processes" see the tree's members and never the decoys,
and killing the tree leaves the decoys running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.helpers.net import free_port
from tests.helpers.target import ProcessTree, alive, emulator_cmd, live_members, titled

pytestmark = pytest.mark.e2e

BOUND = 20.0

# the root: a child retitled like vLLM's engine in its session, and one that
# leaves for a session of its own (as a server replayer launches does)
ROOT = """
import subprocess, sys, time
subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 300"])
subprocess.Popen(["bash", "-c", "exec -a VLLM::Worker_TP0 sleep 300"], start_new_session=True)
print("ready", flush=True)
time.sleep(300)
"""


def until(cond, what: str) -> None:
    deadline = time.monotonic() + BOUND
    for _ in range(int(BOUND / 0.05)):
        if cond() or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert cond(), what


@pytest.fixture
def decoys():
    """Unrelated processes, each in its own session; killed at the end."""
    port = free_port()
    procs = [
        subprocess.Popen(
            ["bash", "-c", "exec -a VLLM::EngineCore sleep 300"], start_new_session=True
        ),
        subprocess.Popen(
            emulator_cmd(port),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        until(lambda: titled([procs[0].pid], b"VLLM::EngineCore") != [], "decoy retitled")
        yield procs, port
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=BOUND)


def test_leftover_helpers_judge_the_tests_own_tree_and_spare_decoys(decoys):
    (engine_decoy, emulator_decoy), port = decoys
    root = subprocess.Popen(
        [sys.executable, "-c", ROOT], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    tree = ProcessTree(root.pid)
    try:
        assert root.stdout is not None and root.stdout.readline() == "ready\n"
        until(lambda: len(titled(tree.alive(), b"VLLM::")) == 2, "both children seen")
        ours = titled(tree.alive(), b"VLLM::")
        root.kill()  # the session-leaving child is orphaned: still ours
        root.wait(timeout=BOUND)
        members = tree.alive()
        assert set(titled(members, b"VLLM::")) == set(ours)
        assert engine_decoy.pid not in members and emulator_decoy.pid not in members
        assert engine_decoy.pid not in live_members(os.getpgid(ours[0]))
        tree.kill()
        until(lambda: tree.alive() == [], "the tree is gone")
    finally:
        tree.kill()
        root.communicate(timeout=BOUND)  # reaped, its pipe closed
    assert alive(engine_decoy.pid) and alive(emulator_decoy.pid)
    assert titled([engine_decoy.pid], b"VLLM::EngineCore") == [engine_decoy.pid]
    for _ in range(int(BOUND / 0.1)):  # the unrelated emulator still serves
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        time.sleep(0.1)
    else:
        raise AssertionError("the decoy emulator stopped serving")
