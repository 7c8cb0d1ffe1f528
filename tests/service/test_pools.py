"""Pools in ``targets.toml``: each mistake refused in one line naming its
table, the listing without commands, a job's share (fair, lowest free
numbers first), its pool file read back as the same servers, pool bisect
requests validated, and the servers' states on the status and the page."""

from __future__ import annotations

import asyncio
import tomllib

import orjson
import pytest

from replayer.errors import UsageError
from replayer.options.pool import PoolSpec
from replayer.service.config import load_targets
from replayer.service.jobs import Job, JobState, JobStore
from replayer.service.page import render_jobs
from replayer.service.pools import allot, servers_line, to_toml, write_pool_file
from replayer.service.progress import ProgressReader
from replayer.service.scheduler import Scheduler
from replayer.service.specs import SpecError, plan_job

pytestmark = pytest.mark.inprocess

POOL = '[pools.gpu4]\nservers = 4\nlaunch = "serve --port {port} --gpus {gpus}"\ngpus = 2\n'


def targets(tmp_path, text):
    p = tmp_path / "targets.toml"
    p.write_text(text)
    return load_targets(p)


def test_pool_tables_refused_in_one_line_naming_the_table(tmp_path):
    cases = [
        ("[pools.p]\nservers = 2\n", r"\[pools.p\]: launch is required"),
        ('[pools.p]\nlaunch = "x {port}"\nshell = "y"\n', r"\[pools.p\]: unknown key\(s\) shell"),
        ('[pools.p]\nlaunch = "x {port}"\nservers = 0\n', r"\[pools.p\]: servers must be"),
        ('[pools.p]\nlaunch = "x {port}"\ngpus = "two"\n', r"\[pools.p\]: invalid literal"),
        ('[pools.p]\nlaunch = "x {port}"\nslots = [0]\n', r"\[pools.p\]: slots is set per job"),
        ('[pools.p]\nlaunch = "x {port}"\ndescription = 3\n', r"\[pools.p\] description"),
        ('[pools.p]\nlaunch = "x {port}"\napi_key_env = "a b"\n', r"\[pools.p\] api_key_env"),
        ('[pools.p]\nlaunch = "x"\n[[pools.p.server]]\nurl = "http://h:1"\n', "not both"),
        ('[pools.p]\nlaunch = "x {port}"\nreset = "often"\n', r"\[pools.p\]: 'often'"),
        ('[pools."a b"]\nlaunch = "x {port}"\n', "pool name 'a b'"),
        ("pools = 3\n", r"\[pools.NAME\] tables expected"),
        ('[targets.p]\nurl = "http://h:1"\n[pools.p]\nlaunch = "x {port}"\n', "a target has"),
    ]
    for text, msg in cases:
        with pytest.raises(UsageError, match=msg) as got:
            targets(tmp_path, text)
        assert "\n" not in str(got.value)
        assert str(got.value).startswith(f"--targets {tmp_path / 'targets.toml'}: ")


def test_the_listing_says_size_and_kind_never_commands(tmp_path):
    t = targets(
        tmp_path,
        POOL + 'description = "node 3"\n'
        '[pools.farm]\nservers = 2\nlaunch = "secret-cmd --port {port}"\n'
        '[pools.farm.slurm]\npartition = "mi355"\n'
        '[pools.lab]\n[[pools.lab.server]]\nurl = "http://n1:8000"\nrestart_cmd = "ssh n1 r"\n'
        '[[pools.lab.server]]\nurl = "http://n2:8000"\nrestart_cmd = "ssh n2 r"\n',
    )
    assert [p.public() for p in t.pools.values()] == [
        {"name": "gpu4", "servers": 4, "kind": "local", "description": "node 3"},
        {"name": "farm", "servers": 2, "kind": "slurm", "description": ""},
        {"name": "lab", "servers": 2, "kind": "servers", "description": ""},
    ]
    with pytest.raises(UsageError, match=r"pool 'x' is not a configured pool \(farm, gpu4, lab\)"):
        t.pool("x")


def test_a_job_gets_its_fair_share_of_the_lowest_free_servers():
    assert allot(4, set(), want=None, sharing=1) == [0, 1, 2, 3]
    assert allot(4, set(), want=None, sharing=2) == [0, 1]
    assert allot(4, {0, 1}, want=None, sharing=2) == [2, 3]
    assert allot(4, {0, 1}, want=1, sharing=2) == [2]
    assert allot(4, {1}, want=None, sharing=3) == [0]  # 4 // 3
    assert allot(4, {0, 2}, want=None, sharing=1) == [1, 3]  # fewer free than the share
    assert allot(3, set(), want=None, sharing=5) == [0]  # at least one
    assert allot(4, {0, 1, 2, 3}, want=None, sharing=1) == []  # full: it waits


def test_a_jobs_pool_file_is_the_pools_servers_it_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("K", "sk-k")  # read when the pool's servers are built
    t = targets(
        tmp_path,
        POOL + "port = 8100\nready_timeout = 60\n"
        'api_key_env = "K"\n[pools.gpu4.slurm]\nextra = ["--account", "l\\"ab"]\n',
    )
    conf = t.pool("gpu4")
    path = tmp_path / "pool.toml"
    write_pool_file(conf, [2, 3], path)
    assert path.stat().st_mode & 0o777 == 0o600
    whole = PoolSpec.from_dict(conf.table, "x")
    spec = PoolSpec.load(path)
    # the same servers as in the whole pool: numbers, ports and GPUs kept
    assert spec.members == whole.members[2:]
    assert [(m.slot, m.port, m.gpus) for m in spec.members] == [(2, 8102, "4,5"), (3, 8103, "6,7")]
    assert spec.slurm is not None and spec.slurm.extra == ("--account", 'l"ab')
    assert {m.server.api_key for m in spec.members} == {"sk-k"}


def test_toml_holds_every_value_a_pool_table_can_hold():
    table = {
        "launch": 'a "b" \\ c\n\t\x7f é',
        "n": -3,
        "x": 0.5,
        "ok": True,
        "inf": float("inf"),
        "list": [1, "two", [3]],
        "sub": {"plain": 1, "odd key": "v"},
        "server": [{"url": "http://a"}, {"url": "http://b"}],
    }
    assert tomllib.loads(to_toml(table)) == table
    with pytest.raises(TypeError, match="cannot hold"):
        to_toml({"when": object()})


def plan(tmp_path, body, text=POOL):
    t = targets(tmp_path, text + '[targets.ctl]\nurl = "http://c:8000"\nrestart_cmd = "r"\n')
    trace = tmp_path / "t.arrow"
    return plan_job(body, t, lambda field, value: (trace, value), tmp_path / "jobs" / "j" / "out")


def test_a_bisect_names_a_pool_and_the_worker_gets_its_pool_file(tmp_path):
    p = plan(
        tmp_path,
        {"kind": "bisect", "trace": "t", "pool": "gpu4", "max_servers": 2, "control": "ctl"},
        POOL + 'api_key_env = "K"\n',
    )
    pool_file = tmp_path / "jobs" / "j" / "pool.toml"
    assert (p.pool, p.max_servers, p.targets) == ("gpu4", 2, ("ctl",))
    assert p.argv[:4] == [
        "bisect",
        str(tmp_path / "t.arrow"),
        f"--pool={pool_file}",
        "--api-key-env=K",
    ]
    assert p.spec["options"]["pool"] == str(pool_file)
    assert p.spec["pool"] == {"name": "gpu4", "api_key_env": "K"}
    assert p.spec["servers"] == [] and p.spec["control"]["name"] == "ctl"
    assert "pool" not in p.options  # what the job shows: what was asked
    whole = plan(tmp_path, {"kind": "bisect", "trace": "t", "pool": "gpu4"})
    assert whole.max_servers is None and whole.spec["control"] is None


def test_pool_requests_refused_in_one_line(tmp_path):
    b = {"kind": "bisect", "trace": "t"}
    cases = [
        ({**b, "pool": "nope"}, r"pool 'nope' is not a configured pool \(gpu4\)"),
        ({**b, "pool": "gpu4", "target": "ctl"}, "pool and target are exclusive"),
        ({**b, "pool": "gpu4", "max_servers": 0}, "max_servers: want a whole number from 1 to 4"),
        ({**b, "pool": "gpu4", "max_servers": 5}, "pool gpu4 has 4 server"),
        ({**b, "pool": "gpu4", "max_servers": True}, "max_servers: want a whole number"),
        ({**b, "pool": "gpu4", "max_servers": "2"}, "max_servers: want a whole number"),
        ({**b, "target": "ctl", "max_servers": 2}, "max_servers: only with pool"),
        ({**b, "pool": "gpu4", "control": "nope"}, "control 'nope' is not a configured target"),
        ({"kind": "verify", "bundle": "b", "pool": "gpu4"}, "only bisect jobs run on a pool"),
        ({"kind": "replay", "trace": "t", "pool": "gpu4"}, "only bisect jobs run on a pool"),
        ({**b, "target": "ctl", "options": {"pool": "/etc/x.toml"}}, "naming a pool"),
        ({**b, "target": "ctl", "options": {"servers": 4}}, "naming a pool"),
        ({**b, "target": "ctl", "options": {"control-pool": "x"}}, "naming a pool"),
    ]
    for body, msg in cases:
        with pytest.raises(SpecError, match=msg) as got:
            plan(tmp_path, body)
        assert "\n" not in str(got.value)


def test_servers_from_servers_json_with_the_pools_numbers(tmp_path):
    reader = ProgressReader()
    assert reader.servers(tmp_path, [2, 3]) is None
    rows = [
        {"server": 0, "url": "http://h:1", "state": "running", "trial": 12, "reason": None},
        {"server": 1, "url": "http://h:2", "state": "failed", "trial": None, "reason": "oom"},
    ]
    (tmp_path / "servers.json").write_bytes(orjson.dumps({"pool": "target", "servers": rows}))
    got = reader.servers(tmp_path, [2, 3])
    assert got == [
        {"server": 0, "slot": 2, "state": "running", "trial": 12, "reason": None},
        {"server": 1, "slot": 3, "state": "failed", "trial": None, "reason": "oom"},
    ]
    assert servers_line(got) == "2 running trial 12 · 3 failed: oom"
    p = reader.progress("bisect", tmp_path, tmp_path / "job.log", slots=[2, 3])
    assert p["servers"] == got
    (tmp_path / "servers.json").write_text("{torn")
    assert reader.servers(tmp_path, [2, 3]) is None
    assert "servers" not in reader.progress("bisect", tmp_path, tmp_path / "job.log")


def test_the_page_shows_a_pool_jobs_servers_escaped():
    evil = '<script>alert("x")</script>'
    j = Job("j1", "bisect", [], ["ctl"], {}, {}, state=JobState.RUNNING, pool="gpu4", slots=[1])
    plain = Job("j2", "bisect", [], ["mi355"], {}, {})
    rows = [
        {"server": 0, "slot": 1, "state": "stopped", "trial": None, "reason": evil},
    ]
    page = render_jobs([j, plain], lambda job, name: False, lambda job: rows)
    assert "<script" not in page
    assert "<td>pool gpu4, ctl (1 stopped: &lt;script&gt;alert(&quot;x&quot;)" in page
    assert "<td>mi355</td>" in page


def test_an_old_state_file_loads_without_pool_fields():
    old = {
        "id": "j", "kind": "bisect", "argv": ["bisect"], "targets": ["t"], "inputs": {},
        "options": {}, "state": "running",
    }  # fmt: skip
    job = Job.from_json(old)
    assert (job.pool, job.max_servers, job.slots) == (None, None, [])
    assert Job.from_json(orjson.loads(orjson.dumps(job.to_json()))) == job


# -- the scheduler's shares, with workers faked in this process ------------------------


class FakeWorkers(Scheduler):
    """Each job's worker is an event the test sets to end it."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.ends: dict[str, asyncio.Event] = {}

    async def _run_worker(self, job):
        if job.pool not in self.pools:
            return await super()._run_worker(job)  # fails it before any process starts
        self.store.update(job, state=JobState.RUNNING)
        await self.ends.setdefault(job.id, asyncio.Event()).wait()
        self.store.update(job, state=JobState.FINISHED)


async def until(what, fn):
    for _ in range(1000):
        if fn():
            return
        await asyncio.sleep(0)  # let the scheduler's tasks run; bounded
    raise AssertionError(f"never: {what}")


def pool_job(store, job_id, pool="gpu4", **kw):
    return store.create(
        job_id=job_id, kind="bisect", argv=["bisect"], targets=[], inputs={}, options={},
        pool=pool, **kw,
    )  # fmt: skip


async def test_jobs_share_a_pool_and_wait_for_a_free_server(tmp_path):
    store = JobStore(tmp_path / "jobs")
    sched = FakeWorkers(store, max_concurrent=4, pools=targets(tmp_path, POOL).pools)
    a, b = pool_job(store, "a"), pool_job(store, "b")
    sched.start()
    sched.kick()
    await until("a and b run", lambda: a.state == b.state == JobState.RUNNING)
    assert (a.slots, b.slots) == ([0, 1], [2, 3])
    assert sched.held() == {"gpu4": {0, 1, 2, 3}}
    c = pool_job(store, "c", max_servers=1)
    sched.kick()
    await until("c is looked at", lambda: not sched._wake.is_set())
    assert c.state is JobState.QUEUED  # no free server
    sched.ends["b"].set()
    await until("c runs", lambda: c.state is JobState.RUNNING)
    assert c.slots == [2] and sched.held() == {"gpu4": {0, 1, 2}}
    # what a job holds is in its state file
    assert JobStore(tmp_path / "jobs").jobs["c"].slots == [2]
    gone = pool_job(store, "gone", pool="removed")
    sched.kick()
    await until("gone fails", lambda: gone.state is JobState.FAILED)
    assert gone.message == "pool removed is not in targets.toml any more"
    for e in sched.ends.values():
        e.set()
    await until("all end", lambda: not sched.running)
    assert sched.held() == {}
    await sched.shutdown()


async def test_a_restart_requeues_a_pool_bisect_and_allots_it_again(tmp_path):
    store = JobStore(tmp_path / "jobs")
    job = pool_job(store, "a")
    store.update(job, state=JobState.RUNNING, slots=[2, 3])
    store = JobStore(tmp_path / "jobs")  # serve restarted
    sched = FakeWorkers(store, max_concurrent=4, pools=targets(tmp_path, POOL).pools)
    await sched.recover()
    job = store.jobs["a"]
    assert (job.state, job.slots) == (JobState.QUEUED, [])
    sched.start()
    sched.kick()
    await until("a runs", lambda: job.state is JobState.RUNNING)
    assert job.slots == [0, 1, 2, 3]  # alone on the pool now: all of it
    sched.ends["a"].set()
    await until("a ends", lambda: not sched.running)
    await sched.shutdown()
