"""A bisect job survives ``serve`` being killed mid-run: the restarted
service resumes it from its journal and it ends with the same bundle (same
request ids, same signature) as the same job run without interruption.

Both jobs run at once (two services, two emulator ports), so the test costs
one bisect's time, not two."""

from __future__ import annotations

import io
import socket
import tarfile

import orjson
import pytest

from tests.helpers.net import free_port
from tests.helpers.service import (
    FAULT,
    OPTIONS,
    TERMINAL,
    emulator_cmd,
    poll,
    small_trace,
    write_targets,
)


def setup_service(tmp_path, name, port):
    data = tmp_path / name
    (data / "traces").mkdir(parents=True)
    small_trace(data / "traces" / "t.arrow")
    toml = write_targets(tmp_path / f"{name}.toml", {"emu": {"launch": emulator_cmd(port, FAULT)}})
    return data, toml


def submit(srv):
    r = srv.post(
        "/api/jobs",
        json={"kind": "bisect", "trace": "traces/t.arrow", "target": "emu", "options": OPTIONS},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def status(srv, job_id):
    r = srv.get(f"/api/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()


def port_closed(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def journal(path):
    out = []
    for line in path.read_bytes().splitlines():
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            break
    return out


@pytest.mark.slow
@pytest.mark.e2e
def test_bisect_resumes_after_serve_is_killed(serve_factory, tmp_path):
    port_a, port_b = free_port(), free_port()
    data_a, toml_a = setup_service(tmp_path, "a", port_a)
    data_b, toml_b = setup_service(tmp_path, "b", port_b)
    a = serve_factory(data=data_a, targets=toml_a)
    b = serve_factory(data=data_b, targets=toml_b)
    job_a, job_b = submit(a), submit(b)

    # kill serve A (SIGKILL: no goodbye) once a few trials are journaled
    poll(lambda: (status(a, job_a).get("progress") or {}).get("trials", 0) >= 4, "4 trials")
    a.proc.kill()
    a.close()
    jpath = data_a / "jobs" / job_a / "out" / "journal.jsonl"
    # the worker dies with serve (PR_SET_PDEATHSIG) and stops its emulator
    poll(lambda: port_closed(port_a), "emulator A to stop", 30)
    before = journal(jpath)
    decided = {e["key"] for e in before if e["event"] == "verdict"}

    a2 = serve_factory(data=data_a, targets=toml_a)
    done_a = poll(lambda: (s := status(a2, job_a))["state"] in TERMINAL and s, "job A", 150)
    done_b = poll(lambda: (s := status(b, job_b))["state"] in TERMINAL and s, "job B", 150)

    for done in (done_a, done_b):
        assert done["state"] == "finished", done
        assert done["outcome"] == "complete"
        assert done["exit_code"] == 0
    assert done_a["attempts"] == 2
    assert done_b["attempts"] == 1
    # the same bundle: the same requests, in order, and the same crash signature
    expected = ["synth-00000-t002", "synth-00000-t003"]
    assert done_a["result"]["requests"] == expected
    assert done_b["result"]["requests"] == expected
    assert done_a["result"]["signature"]["hash"] == done_b["result"]["signature"]["hash"]
    assert done_a["result"]["signature"]["class"] == "process_exit"

    # the resumed run continued the journal: trial numbers go on, no decided
    # candidate ran again
    after = journal(jpath)
    trials = [e["record"]["trial"] for e in after if e["event"] == "trial"]
    # a trial the kill stopped is journaled as cancelled and its number (and
    # its trials/NNNN directory) never reused
    cancelled = [e["trial"] for e in after if e["event"] == "cancelled"]
    assert sorted(trials + cancelled) == list(range(1, len(trials) + len(cancelled) + 1))
    assert len(set(trials)) == len(trials)
    new = [e for e in after[len(before) :] if e["event"] == "trial"]
    assert new and not [e for e in new if e["record"]["key"] in decided]
    log = a2.get(f"/api/jobs/{job_a}/log").text
    assert "the bisect resumes from its journal" in log

    # the bundle tarball downloads and says the same
    r = a2.get(f"/api/jobs/{job_a}/bundle")
    assert r.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("manifest.json"))
        manifest = orjson.loads(tar.extractfile(member).read())
    assert manifest["requests"] == expected
    # no emulator is left behind by either service
    assert port_closed(port_a) and port_closed(port_b)

    # and the bundle verifies against the same target, as a verify job
    verify = {"runs": 1, "settle": 3, "grace": 0.5, "health-interval": 0.1}
    r = a2.post(
        "/api/jobs", json={"kind": "verify", "job": job_a, "target": "emu", "options": verify}
    )
    assert r.status_code == 201, r.text
    assert r.json()["inputs"] == {"bundle": f"jobs/{job_a}/out/bundle"}
    vid = r.json()["id"]
    v = poll(lambda: (s := status(a2, vid))["state"] in TERMINAL and s, "the verify job", 60)
    assert (v["state"], v["outcome"], v["exit_code"]) == ("finished", "reproduced", 0)
    assert v["progress"] == {"runs_done": 1, "runs": 1, "outcomes": ["MATCH"]}
    assert v["result"]["text"].startswith(f"bundle {data_a.resolve()}/jobs/{job_a}/out/bundle: ")
    assert v["result"]["text"].endswith("crashed 1/1 (100%, 95% CI 21%-100%)")
    a2.close()
    b.close()
