"""``kill -9`` of ``replayer serve``, and of its worker, while a bisect job runs.

One bisect job is killed at 20 seeded instants in turn, spread over its
start-up (the worker launching its emulator, calibrating), its steady state
(trials being journaled) and its clean-up (the bundle written, the worker
ending): the service itself (restarted on the same ``--data`` each time) or
the job's worker. After every kill the job is in a true state: a restarted
service puts the bisect back in the queue or runs a new worker for it, never
shows the dead worker's attempt as running; a killed worker's bisect is
requeued the same way. In the end it finishes with the same result as the
same job run without a kill, its journal repeats no decided candidate and
reuses no trial number, and no process the test started is left: every
process of the test carries an environment mark (inherited by ``serve``,
its workers and the emulators they launch), so the check judges exactly
those, whatever their process group or session.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from replayer.service.launcher import ServeProcess
from tests.helpers.net import free_port
from tests.helpers.service import (
    FAULT,
    OPTIONS,
    TERMINAL,
    TOKEN,
    Serve,
    emulator_cmd,
    poll,
    small_trace,
    write_targets,
)
from tests.helpers.target import alive

SEED = 20261206
KILLS = 20
MARK = "REPLAYER_TEST_FAULTS_MARK"


def plan(seed: int) -> list[tuple[str, str, float]]:
    """``(who, phase, delay)`` per kill: who is ``serve`` or ``worker``;
    the last two are clean-up kills. No three worker kills in a row outside
    the steady state (a bisect whose workers keep dying before finishing a
    trial fails by design, see replayer.service.scheduler)."""
    rng = random.Random(seed)
    out, unproductive = [], 0
    for i in range(KILLS):
        phase = "clean-up" if i >= KILLS - 2 else rng.choice(["start-up", "steady"])
        who = rng.choice(["serve", "serve", "worker"])
        if who == "worker" and phase != "steady":
            if unproductive == 2:
                who = "serve"
            else:
                unproductive += 1
        elif who == "worker":
            unproductive = 0
        delay = {"start-up": 1.5, "steady": 1.0, "clean-up": 0.3}[phase] * rng.random()
        out.append((who, phase, round(delay, 3)))
    return out


def status(srv, job_id):
    r = srv.get(f"/api/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()


def state_file(data: Path, job_id: str) -> dict:
    return orjson.loads((data / "jobs" / job_id / "state.json").read_bytes())


def journal(path: Path) -> list[dict]:
    out = []
    if not path.exists():
        return out
    for line in path.read_bytes().splitlines():
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            break  # a torn last line (the kill): the reader stops there too
    return out


def finished(path: Path) -> list[tuple[str, str, str]]:
    """``(stage, candidate key, outcome)`` of every finished trial, in order."""
    return [
        (e["record"]["stage"], e["record"]["key"], e["record"]["outcome"])
        for e in journal(path)
        if e["event"] == "trial"
    ]


def trials(path: Path) -> int:
    return sum(1 for e in journal(path) if e["event"] == "trial")


def marked(mark: str) -> set[int]:
    """The live processes carrying ``MARK=mark`` (zombies have no environ)."""
    want = f"{MARK}={mark}".encode()
    got = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if want in (proc / "environ").read_bytes().split(b"\0"):
                got.add(int(proc.name))
        except OSError:
            continue
    return got


def port_closed(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def setup(tmp_path, name):
    data = tmp_path / name
    (data / "traces").mkdir(parents=True)
    small_trace(data / "traces" / "t.arrow")
    port = free_port()
    toml = write_targets(tmp_path / f"{name}.toml", {"emu": {"launch": emulator_cmd(port, FAULT)}})
    return data, toml, port


def submit(srv):
    r = srv.post(
        "/api/jobs",
        json={"kind": "bisect", "trace": "traces/t.arrow", "target": "emu", "options": OPTIONS},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def wait_phase(srv, data, job_id, phase, attempt, trials_before):
    """Block until the job's current attempt is in ``phase``; False if it ended first."""
    jpath = data / "jobs" / job_id / "out" / "journal.jsonl"
    manifest = data / "jobs" / job_id / "out" / "bundle" / "manifest.json"

    def ready():
        s = status(srv, job_id)
        if s["state"] in TERMINAL:
            return "ended"
        if s["state"] != "running" or s["attempts"] < attempt:
            return None
        if phase == "start-up":
            return "ok"
        if phase == "steady":
            return "ok" if trials(jpath) > trials_before else None
        return "ok" if manifest.exists() else None

    return poll(ready, f"{phase} of attempt {attempt}", 120) == "ok"


def kill_worker(data, job_id):
    pid = state_file(data, job_id).get("worker_pid")
    if pid is None:
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if str(data / "jobs" / job_id).encode() not in cmd:
        return False  # the worker ended, its pid reused
    os.kill(pid, signal.SIGKILL)
    return True


@pytest.fixture
def serve_factory():
    """Started services, stopped at the end (a killed one is simply gone)."""
    started: list[Serve] = []

    def make(data, targets, env):
        srv = Serve(ServeProcess(data, targets=targets, token=TOKEN, env=env).start())
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.close()
        srv.proc.stop(timeout=60)


@pytest.mark.slow
@pytest.mark.e2e
def test_kill_9_serve_and_worker_during_a_bisect(serve_factory, tmp_path):
    mark = secrets.token_hex(8)
    env = {MARK: mark}
    data, toml, port = setup(tmp_path, "killed")
    ref_data, ref_toml, ref_port = setup(tmp_path, "reference")
    ref = serve_factory(data=ref_data, targets=ref_toml, env=env)
    srv = serve_factory(data=data, targets=toml, env=env)
    ref_job, job = submit(ref), submit(srv)
    jpath = data / "jobs" / job / "out" / "journal.jsonl"
    done, prefixes = [], []
    for i, (who, phase, delay) in enumerate(plan(SEED)):
        s = status(srv, job)
        if s["state"] in TERMINAL:
            break
        attempt = max(1, s["attempts"])
        if not wait_phase(srv, data, job, phase, attempt, trials(jpath)):
            break
        time.sleep(delay)  # the seeded instant itself, not a wait for a condition
        attempts = state_file(data, job)["attempts"]
        prefixes.append(finished(jpath))
        if who == "serve":
            srv.proc.kill()
            srv.close()
            srv = serve_factory(data=data, targets=toml, env=env)
        elif not kill_worker(data, job):
            continue

        def settled(attempts=attempts, srv=srv):
            # a true state: back in the queue, a new worker, or ended; never
            # the killed attempt shown as running
            s = status(srv, job)
            if s["state"] in TERMINAL or s["state"] == "queued":
                return s
            return s if s["state"] == "running" and s["attempts"] > attempts else None

        got = poll(settled, f"kill {i} ({who}, {phase}): the job settles", 90)
        assert got["state"] != "failed", (i, who, phase, got)
        done.append((who, phase))

    final = poll(lambda: (s := status(srv, job))["state"] in TERMINAL and s, "the killed job", 150)
    expected = poll(lambda: (s := status(ref, ref_job))["state"] in TERMINAL and s, "reference", 60)
    assert len(done) >= 15, done  # most instants came before the job ended
    assert {p for _, p in done} >= {"start-up", "steady"}
    assert {w for w, _ in done} == {"serve", "worker"}
    for s in (final, expected):
        assert (s["state"], s["outcome"], s["exit_code"]) == ("finished", "complete", 0), s
    assert final["result"]["requests"] == expected["result"]["requests"]
    assert final["result"]["signature"] == expected["result"]["signature"]
    assert final["attempts"] > 1

    # the journal: what was finished before each kill is kept as it was (a
    # resume rewrites nothing); a candidate both runs reached was decided
    # with as many finished trials as the unkilled run needed (a resume
    # repeats no finished trial and skips none: a boundary length is run
    # three times in both); a trial a kill cut short is journaled as
    # cancelled, its number never reused. (The candidates themselves need
    # not be the unkilled run's one for one: where a crash lands in a run
    # moves with the machine's load, and the cuts follow it.)
    end = finished(jpath)
    for before in prefixes:
        assert end[: len(before)] == before
    ref_journal = ref_data / "jobs" / ref_job / "out" / "journal.jsonl"
    ran = Counter((st, key) for st, key, _ in end)
    ref_ran = Counter((st, key) for st, key, _ in finished(ref_journal))
    both = set(ran) & set(ref_ran)
    assert len(both) >= 3, (ran, ref_ran)
    assert {k: ran[k] for k in both} == {k: ref_ran[k] for k in both}
    numbers = [
        e["record"]["trial"] if e["event"] == "trial" else e["trial"]
        for e in journal(jpath)
        if e["event"] in ("trial", "cancelled")
    ]
    assert sorted(numbers) == list(range(1, len(numbers) + 1))

    # nothing the test started is left once the two services stop
    for s in (srv, ref):
        s.close()
        s.proc.stop(timeout=60)
    poll(lambda: not marked(mark), "no process of the test left", 30)
    assert port_closed(port) and port_closed(ref_port)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_bisect_whose_workers_keep_dying_before_a_trial_fails_and_leaves_no_server(
    serve_factory, tmp_path
):
    """A worker killed while its server still loads is requeued (the bisect
    resumes) and the server it launched is killed with it; the third death in
    a row with no trial finished fails the job, saying so, instead of
    relaunching forever."""
    data = tmp_path / "data"
    (data / "traces").mkdir(parents=True)
    small_trace(data / "traces" / "t.arrow")
    pids = tmp_path / "pids"
    pids.mkdir()
    # a server that never becomes ready: each launch leaves its pid behind
    launch = f"sh -c 'echo $$ > {pids}/$$; exec sleep 600'"
    toml = write_targets(tmp_path / "t.toml", {"slow": {"launch": launch, "ready_timeout": 600}})
    srv = serve_factory(data=data, targets=toml, env={})
    r = srv.post(
        "/api/jobs",
        json={"kind": "bisect", "trace": "traces/t.arrow", "target": "slow", "options": OPTIONS},
    )
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    launched: list[int] = []
    for n in range(1, 4):

        def loading(n=n):
            s = status(srv, job)
            have = sorted(int(p.name) for p in pids.iterdir())
            worker = state_file(data, job).get("worker_pid")
            return s["state"] == "running" and len(have) == n and worker and have[-1]

        launched.append(poll(loading, f"launch {n}", 60))
        assert kill_worker(data, job)
        if n < 3:
            s = poll(lambda n=n: (s := status(srv, job))["attempts"] > n and s, f"requeue {n}", 60)
            assert s["state"] in ("queued", "running"), s
    final = poll(lambda: (s := status(srv, job))["state"] in TERMINAL and s, "the job ends", 60)
    assert final["state"] == "failed", final
    assert "killed by signal 9 (3 times in a row, no trial finished)" in final["message"]
    # every server a dead worker launched was stopped with it
    poll(lambda: not any(alive(p) for p in launched), "the launched servers are gone", 30)
