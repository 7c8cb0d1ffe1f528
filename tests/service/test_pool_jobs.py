"""Bisect jobs sharing a pool of emulator servers on a real ``replayer serve``.

One service, one 4-server pool (server i on port BASE + i, so two jobs
given one server would collide on its port), four jobs:

* J0 takes the whole pool and is cancelled once A and B wait behind it;
* A and B start together when J0 lets go: 2 servers each, disjoint, and
  both find the planted pair exactly, each trial journaled with its server;
* C (``max_servers`` 1), submitted while A and B hold every server, waits,
  then runs on one server that the first of them let go of.
"""

from __future__ import annotations

import time

import orjson
import pytest

from tests.helpers.net import free_ports
from tests.helpers.service import FAULT, OPTIONS, TERMINAL, emulator_cmd, poll, small_trace

EXPECTED = ["synth-00000-t002", "synth-00000-t003"]
STATES = {"idle", "starting", "ready", "running", "restarting", "failed", "stopped"}


def write_pool_targets(path, base):
    launch = emulator_cmd("{port}", FAULT).replace("'{port}'", "{port}")
    path.write_text(
        "[pools.emu4]\n"
        "servers = 4\n"
        f"port = {base}\n"
        f"launch = '''{launch}'''\n"
        'description = "four emulators"\n'
    )
    return path


def journal_trials(out):
    trials = []
    for line in (out / "journal.jsonl").read_bytes().splitlines():
        e = orjson.loads(line)
        if e["event"] == "trial":
            trials.append(e["record"])
    return trials


@pytest.mark.slow
@pytest.mark.e2e
def test_bisect_jobs_share_a_pool_fairly(serve_factory, tmp_path):
    t0 = time.monotonic()
    data = tmp_path / "data"
    (data / "traces").mkdir(parents=True)
    small_trace(data / "traces" / "t.arrow")
    toml = write_pool_targets(tmp_path / "targets.toml", free_ports(4))
    srv = serve_factory(data=data, targets=toml, args=["--max-concurrent-jobs", "4"])
    try:
        run_jobs(srv, data)
    finally:
        srv.close()
    print(f"\npool jobs: {time.monotonic() - t0:.1f} s")


def run_jobs(srv, data):
    listing = srv.get("/api/targets")
    assert listing.json()["pools"] == [
        {"name": "emu4", "servers": 4, "kind": "local", "description": "four emulators"}
    ]
    assert "replayer.emulator" not in listing.text

    def submit(**kw):
        body = {"kind": "bisect", "trace": "traces/t.arrow", "pool": "emu4", "options": OPTIONS}
        r = srv.post("/api/jobs", json={**body, **kw})
        assert r.status_code == 201, r.text
        return r.json()

    def status(job_id):
        r = srv.get(f"/api/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def ended(job_id):
        return poll(lambda: (s := status(job_id))["state"] in TERMINAL and s, job_id, 120)

    # J0 holds the whole pool; A and B wait behind it
    j0 = submit(label="whole")["id"]
    s0 = poll(lambda: (s := status(j0))["state"] == "running" and s, "J0 to run")
    assert s0["slots"] == [0, 1, 2, 3] and s0["pool"] == "emu4"
    a, b = submit(label="A")["id"], submit(label="B")["id"]
    for job_id, pos in ((a, 1), (b, 2)):
        s = status(job_id)
        assert (s["state"], s["queue_position"], s["slots"]) == ("queued", pos, [])

    # J0 lets go of its servers (cancelled): A and B start at once, 2 each
    assert srv.post(f"/api/jobs/{j0}/cancel").status_code == 202
    assert ended(j0)["state"] == "cancelled"
    sa = poll(lambda: (s := status(a))["state"] == "running" and s, "A to run")
    sb = poll(lambda: (s := status(b))["state"] == "running" and s, "B to run")
    assert (sa["slots"], sb["slots"]) == ([0, 1], [2, 3])

    # C wants one server: none is free while A and B run
    c = submit(label="C", max_servers=1)
    assert (c["state"], c["max_servers"]) == ("queued", 1)
    c = c["id"]

    # A's status says what its servers do, under the pool's numbers
    def busy():
        servers = (status(a).get("progress") or {}).get("servers") or []
        running = [x for x in servers if x["state"] == "running"]
        return running and isinstance(running[0]["trial"], int) and servers

    servers = poll(busy, "a server of A running a trial")
    assert [x["slot"] for x in servers] == [0, 1]
    assert {x["state"] for x in servers} <= STATES

    done = {job_id: ended(job_id) for job_id in (a, b, c)}
    first = min((done[a], done[b]), key=lambda s: s["finished_at"])
    assert done[c]["started_at"] >= first["finished_at"]  # it waited for a free server
    assert len(done[c]["slots"]) == 1 and done[c]["slots"][0] in first["slots"]

    for job_id, width in ((a, 2), (b, 2), (c, 1)):
        d = done[job_id]
        assert (d["state"], d["outcome"], d["exit_code"]) == ("finished", "complete", 0), d
        out = data / "jobs" / job_id / "out"
        manifest = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
        assert manifest["requests"] == EXPECTED
        assert d["result"]["signature"]["class"] == "process_exit"
        trials = journal_trials(out)
        assert trials and all(r["server"] in range(width) for r in trials)
        assert {r["server"] for r in trials} == set(range(width))  # every server it held ran
        logs = {p.name for p in out.glob("target-server-*.log")}
        assert logs == {f"target-server-{slot}.log" for slot in d["slots"]}
        assert [x["state"] for x in d["progress"]["servers"]] == ["stopped"] * width
        assert [x["slot"] for x in d["progress"]["servers"]] == d["slots"]
        pool_file = (data / "jobs" / job_id / "pool.toml").read_text()
        assert f"slots = {d['slots']}" in pool_file

    page = srv.get("/").text
    assert "<td>pool emu4 (0 stopped · 1 stopped)</td>" in page
