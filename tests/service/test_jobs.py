"""Jobs on disk: one folder per job and one atomic state file; a change is on
disk before it is visible, a restarted store reads back every job (and
skips what is not one), the API's view carries no argv."""

from __future__ import annotations

import calendar

import orjson
import pytest

from replayer.service.jobs import Job, JobState, JobStore, new_job_id, write_json_atomic

pytestmark = pytest.mark.inprocess


def create(store: JobStore, job_id: str, **kw) -> Job:
    return store.create(
        job_id=job_id,
        kind=kw.pop("kind", "bisect"),
        argv=["bisect", "t.arrow", "--launch=vllm serve m"],
        targets=["mi355"],
        inputs={"trace": "t.arrow"},
        options={"confirm": 3},
        **kw,
    )


def test_a_job_is_on_disk_when_created_and_after_every_change(tmp_path):
    store = JobStore(tmp_path / "jobs")
    job = create(store, "j1", label="first")
    state = tmp_path / "jobs" / "j1" / "state.json"
    assert orjson.loads(state.read_bytes()) == job.to_json()
    assert (job.state, job.attempts, [e["note"] for e in job.events]) == (
        JobState.QUEUED,
        0,
        ["submitted"],
    )
    store.update(job, state=JobState.RUNNING, attempts=1, note="worker 42")
    store.update(job, worker_pid=42)  # no state change, no note: no event
    on_disk = orjson.loads(state.read_bytes())
    assert (on_disk["state"], on_disk["attempts"], on_disk["worker_pid"]) == ("running", 1, 42)
    assert [(e["state"], e["note"]) for e in on_disk["events"]] == [
        ("queued", "submitted"),
        ("running", "worker 42"),
    ]
    assert sorted(p.name for p in state.parent.iterdir()) == ["state.json"]


def test_a_restarted_store_reads_every_job_back_and_skips_what_is_not_one(tmp_path):
    root = tmp_path / "jobs"
    store = JobStore(root)
    a = create(store, "20260101-000000-aaaaaa")
    b = create(store, "20260101-000001-bbbbbb", kind="replay")
    store.update(b, state=JobState.FINISHED, exit_code=0, outcome="clean")
    (root / "junk").mkdir()  # no state.json
    (root / "torn").mkdir()
    (root / "torn" / "state.json").write_text("{")
    (root / "alias").mkdir()  # a state naming another job
    (root / "alias" / "state.json").write_bytes(orjson.dumps(a.to_json()))
    (root / b.id / ".state.json.99.tmp").write_text("half")  # a write cut by a crash
    again = JobStore(root)
    assert sorted(again.jobs) == [a.id, b.id]
    assert again.jobs[b.id] == b
    assert again.jobs[b.id].terminal and not again.jobs[a.id].terminal
    assert not (root / b.id / ".state.json.99.tmp").exists()
    assert again.by_state() == {("bisect", "queued"): 1, ("replay", "finished"): 1}
    assert [j.id for j in again.listing()] == [b.id, a.id]  # newest first


def test_paths_notes_and_the_public_view(tmp_path):
    store = JobStore(tmp_path / "jobs")
    job = create(store, "j1")
    d = tmp_path / "jobs" / "j1"
    assert (store.dir(job), store.out("j1"), store.log_path(job)) == (d, d / "out", d / "job.log")
    store.note(job, "started worker 7")
    store.note(job, "cancel requested")
    lines = store.log_path(job).read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == ["started worker 7", "cancel requested"]
    assert all(line.startswith("== serve ") for line in lines)
    public = job.public()
    assert "argv" not in public and "spec" not in public
    assert (public["state"], public["inputs"], public["options"]) == (
        "queued",
        {"trace": "t.arrow"},
        {"confirm": 3},
    )


def test_from_json_ignores_fields_it_does_not_know():
    d = Job("x", "replay", [], [], {}, {}).to_json() | {"from_the_future": 1}
    assert Job.from_json(d) == Job("x", "replay", [], [], {}, {}, created_at=d["created_at"])


def test_write_json_atomic_is_sorted_indented_json(tmp_path):
    p = tmp_path / "s.json"
    write_json_atomic(p, {"b": 1, "a": [1]})
    assert p.read_text() == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}\n'
    assert [x.name for x in tmp_path.iterdir()] == ["s.json"]


def test_job_ids_sort_by_submission_time():
    t = calendar.timegm((2026, 3, 4, 5, 6, 7, 0, 0, 0))
    a, b = new_job_id(t), new_job_id(t + 61)
    assert a.startswith("20260304-050607-") and len(a) == len("20260304-050607-") + 6
    assert b.startswith("20260304-050708-") and a < b
