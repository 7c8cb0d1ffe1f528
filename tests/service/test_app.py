"""The API of a real ``replayer serve`` subprocess: auth, confinement, launch
commands, uploads, the job lifecycle, queueing, cancel, interruption.

One service per module (started once, it is shared by the tests here); the
tests that restart or reconfigure a service start their own."""

from __future__ import annotations

import base64
import http.client
import os
import socket
import subprocess
import sys
import time

import httpx
import orjson
import pytest

from replayer.replay.results import read_results
from replayer.service.launcher import ServeProcess, ServeStartError
from tests.helpers.net import free_port
from tests.helpers.service import TOKEN, emulator_cmd, small_trace, write_targets

TERMINAL = {"finished", "failed", "cancelled", "interrupted"}
FAST = {"timing": "asap", "settle": 2, "grace": 0.3, "health-interval": 0.1}


def poll(fn, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.05)  # polling observable state (job status, a port), bounded above
    raise AssertionError(f"timed out waiting for {what}")


def port_closed(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def snapshot(*roots):
    """Every file and link under ``roots``: path -> (kind, size, mtime)."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                out[p] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


class Env:
    pass


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("api")
    e = Env()
    e.data = base / "data"
    e.outside = base / "outside"
    (e.data / "traces").mkdir(parents=True)
    e.outside.mkdir()
    small_trace(e.data / "traces" / "t.arrow")
    small_trace(e.outside / "secret.arrow")
    (e.outside / "secret.txt").write_text("not yours\n")
    (e.data / "serve.token").write_text("an-old-generated-token-never-to-be-read\n")
    os.symlink(e.outside, e.data / "link-out")
    os.symlink(e.outside / "secret.arrow", e.data / "traces" / "link.arrow")
    e.crash_port, e.hang_port = free_port(), free_port()
    e.toml = write_targets(
        base / "targets.toml",
        {
            "crash": {"launch": emulator_cmd(e.crash_port, "exit after=0.1 when request=3")},
            "hang": {"launch": emulator_cmd(e.hang_port, "hang when request=2")},
            "remote": {"url": "http://127.0.0.1:9"},
        },
    )
    e.proc = ServeProcess(
        e.data,
        targets=e.toml,
        token=TOKEN,
        args=["--max-upload", "1M", "--cancel-grace", "20"],
    ).start()
    e.c = httpx.Client(base_url=e.proc.url, headers=e.proc.auth, timeout=30)
    e.anon = httpx.Client(base_url=e.proc.url, timeout=30)
    # one finished job for the download and traversal tests
    r = e.c.post(
        "/api/jobs",
        json={"kind": "replay", "trace": "traces/t.arrow", "targets": ["crash"], "options": FAST},
    )
    assert r.status_code == 201, r.text
    e.job = r.json()["id"]
    e.done = poll(
        lambda: (s := e.c.get(f"/api/jobs/{e.job}").json())["state"] in TERMINAL and s,
        "the first replay job",
    )
    yield e
    e.c.close()
    e.anon.close()
    e.proc.stop()


def raw_request(env, method, path, headers=None, body=None):
    """Send ``path`` exactly as given (no client-side normalization)."""
    conn = http.client.HTTPConnection("127.0.0.1", env.proc.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in {**env.proc.auth, **(headers or {})}.items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# -- the first job ----------------------------------------------------------------------


def test_a_replay_job_runs_to_its_result(env):
    d = env.done
    assert d["state"] == "finished"
    assert d["outcome"] == "target_failed"
    assert d["exit_code"] == 1
    assert d["attempts"] == 1
    t = d["result"]["targets"]["target"]
    assert t["failed"] is True
    assert t["failure_class"] == "process_exit"
    assert t["requests"] == 20
    files = {f["path"] for f in env.c.get(f"/api/jobs/{env.job}/files").json()["files"]}
    assert {"results.arrow", "summary.json", "run.json", "server.log"} <= files
    r = env.c.get(f"/api/jobs/{env.job}/files/summary.json")
    assert r.status_code == 200
    assert r.headers["Content-Security-Policy"] == "sandbox"
    assert orjson.loads(r.content)["targets"]["target"]["failed"] is True
    log = env.c.get(f"/api/jobs/{env.job}/log").text
    assert "--launch=<from targets.toml>" in log  # the operator's command is not echoed
    assert "worker exited with code 1: finished" in log
    # the worker wrote the report when the job ended
    r = env.c.get(f"/api/jobs/{env.job}/report")
    assert "report" in d["links"]
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert r.headers["Content-Security-Policy"] == "sandbox allow-scripts"
    page = env.c.get("/")
    assert page.status_code == 200 and env.job in page.text
    assert "script-src" not in page.headers["Content-Security-Policy"]
    listing = env.c.get("/api/jobs", params={"kind": "replay", "state": "finished"}).json()
    assert env.job in [j["id"] for j in listing["jobs"]]
    assert "argv" not in listing["jobs"][0]


def test_metrics_count_jobs_and_requests(env):
    text = env.c.get("/metrics").text
    assert 'replayer_serve_jobs{kind="replay",state="finished"} 1.0' in text
    assert 'replayer_serve_api_requests_total{method="POST",route="/api/jobs",status="201"}' in text
    assert "replayer_serve_info{" in text


# -- auth -------------------------------------------------------------------------------


def test_auth_is_required_everywhere_but_healthz(env):
    assert env.anon.get("/healthz").status_code == 200
    for method, path in [
        ("GET", "/"),
        ("GET", "/metrics"),
        ("GET", "/api/jobs"),
        ("GET", f"/api/jobs/{env.job}"),
        ("GET", f"/api/jobs/{env.job}/files/summary.json"),
        ("GET", f"/api/jobs/{env.job}/log"),
        ("GET", "/api/traces"),
        ("POST", "/api/jobs"),
        ("POST", f"/api/jobs/{env.job}/cancel"),
        ("PUT", "/api/traces/x.arrow"),
        ("GET", "/no/such/route"),
    ]:
        r = env.anon.request(method, path)
        assert r.status_code == 401, (method, path, r.status_code)
        assert r.headers["WWW-Authenticate"].startswith('Bearer realm="replayer"')
        assert r.json() == {"error": "unauthorized: send Authorization: Bearer <token>"}
    wrong = [
        "Bearer wrong-token-0123456789abc",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"bearer{TOKEN}",
        TOKEN,
        f"Token {TOKEN}",
        "Basic " + base64.b64encode(b"user:wrong").decode(),
        "Basic !!!",
    ]
    for header in wrong:
        r = env.anon.get("/api/jobs", headers={"Authorization": header})
        assert r.status_code == 401, header


def test_basic_auth_reads_but_never_writes(env):
    basic = {"Authorization": "Basic " + base64.b64encode(f"me:{TOKEN}".encode()).decode()}
    assert env.anon.get("/", headers=basic).status_code == 200
    assert env.anon.get(f"/api/jobs/{env.job}/files/summary.json", headers=basic).status_code == 200
    jobs_before = sorted(os.listdir(env.data / "jobs"))
    r = env.anon.post("/api/jobs", headers=basic, json={"kind": "replay"})
    assert r.status_code == 401
    assert env.anon.post(f"/api/jobs/{env.job}/cancel", headers=basic).status_code == 401
    assert sorted(os.listdir(env.data / "jobs")) == jobs_before


# -- confinement ------------------------------------------------------------------------


def test_path_traversal_is_refused_and_touches_nothing(env):
    job = env.job
    # a symlink inside the job's folder that points outside
    out = env.data / "jobs" / job / "out"
    os.symlink(env.outside / "secret.txt", out / "evil.txt")
    os.symlink(env.outside, out / "evil-dir")
    try:
        for rel in ("evil.txt", "evil-dir/secret.txt"):
            r = env.c.get(f"/api/jobs/{job}/files/{rel}")
            assert r.status_code == 400, rel
            assert "outside" in r.json()["error"]
        listed = {f["path"] for f in env.c.get(f"/api/jobs/{job}/files").json()["files"]}
        assert not {p for p in listed if "evil" in p}
    finally:
        (out / "evil.txt").unlink()
        (out / "evil-dir").unlink()
    before = snapshot(env.data, env.outside)
    raw = [
        ("GET", f"/api/jobs/{job}/files/../state.json"),
        ("GET", f"/api/jobs/{job}/files/../../../../../etc/passwd"),
        ("GET", f"/api/jobs/{job}/files/%2e%2e/state.json"),
        ("GET", f"/api/jobs/{job}/files/%2E%2E%2F%2E%2E%2Fserve.token"),
        ("GET", f"/api/jobs/{job}/files/..%2f..%2f..%2ftraces%2ft.arrow"),
        ("GET", f"/api/jobs/{job}/files/%252e%252e/state.json"),
        ("GET", f"/api/jobs/{job}/files/run.json%00.txt"),
        ("GET", f"/api/jobs/{job}/files/..%5c..%5cstate.json"),
        ("GET", f"/api/jobs/{job}/files//etc/passwd"),
        ("GET", f"/api/jobs/{job}/files/./summary.json"),
        ("GET", "/api/jobs/../jobs"),
        ("GET", "/api/jobs/%2e%2e"),
        ("PUT", "/api/traces/..%2f..%2fevil.arrow"),
        ("PUT", "/api/traces/.hidden.arrow"),
        ("PUT", "/api/traces/a%2fb.arrow"),
    ]
    for method, path in raw:
        status, body = raw_request(env, method, path, body=b"x" if method == "PUT" else None)
        assert status == 400, (path, status, body)
    body_paths = [
        "../outside/secret.arrow",
        "traces/../../outside/secret.arrow",
        "/etc/passwd",
        str(env.outside / "secret.arrow"),
        "%2e%2e/outside/secret.arrow",
        "traces/%2e%2e/%2e%2e/outside/secret.arrow",
        "link-out/secret.arrow",
        "traces/link.arrow",
        "traces//t.arrow",
        "traces\\..\\..\\outside\\secret.arrow",
        "C:/Windows",
        "",
        "serve.token",
        "traces/.registry.json",
        f"jobs/{job}/state.json",
        f"jobs/{job}/job.log",
        "jobs",
    ]
    for p in body_paths:
        r = env.c.post("/api/traces/register", json={"path": p})
        assert r.status_code == 400, (p, r.text)
        r = env.c.post("/api/jobs", json={"kind": "replay", "trace": p, "targets": ["crash"]})
        assert r.status_code == 400, (p, r.text)
        r = env.c.post("/api/jobs", json={"kind": "verify", "bundle": p, "target": "crash"})
        assert r.status_code == 400, (p, r.text)
    r = env.c.post("/api/jobs", json={"kind": "verify", "job": "../../etc", "target": "crash"})
    assert r.status_code == 400
    assert snapshot(env.data, env.outside) == before


# -- launch commands and server-owned options ------------------------------------------


def test_launch_commands_in_a_body_are_refused(env):
    jobs_before = sorted(os.listdir(env.data / "jobs"))
    base = {"kind": "bisect", "trace": "traces/t.arrow", "target": "crash"}
    bodies = [
        {**base, "options": {"launch": "sh -c 'touch /tmp/pwned'"}},
        {**base, "options": {"restart-cmd": "reboot"}},
        {**base, "options": {"restart_cmd": "reboot"}},
        {**base, "options": {"log_cmd": "cat /etc/shadow"}},
        {**base, "options": {"control-launch": "sh"}},
        {**base, "launch": "sh"},
        {**base, "Launch": "sh"},
        {**base, "target": {"name": "crash", "launch": "sh"}},
        {**base, "label": "x", "options": {"stages": "prefix", "x": [{"restart_cmd": "sh"}]}},
        {"kind": "replay", "trace": "traces/t.arrow", "targets": ["crash"], "launch": "sh"},
    ]
    for body in bodies:
        r = env.c.post("/api/jobs", json=body)
        assert r.status_code == 400, body
        assert "launch commands come only from the server's targets.toml" in r.json()["error"]
    owned = ["url", "target", "out", "api-key-file", "api-key-env", "target-key", "scrape",
             "resume", "from-run", "metrics-host", "keep-running"]  # fmt: skip
    for opt in owned:
        r = env.c.post("/api/jobs", json={**base, "options": {opt: "x"}})
        assert r.status_code == 400, opt
        assert "set by the server" in r.json()["error"]
    for opts, msg in [
        ({"timing": "warp"}, "options.timing: 'warp': want one of recorded, gaps, asap"),
        ({"laun": "sh"}, "not an option of replayer bisect"),
        ({"speed": [1, 2]}, "takes one value"),
        ({"resum": True}, "not an option"),
        ({"stages": "prefix,nope"}, "options.stages: names unknown stage(s) nope; the stages"),
        ({"no-monitor": True}, "needs the monitor"),
        ({"confirm": "-1"}, "options.confirm: must not be negative"),
        ({"calibrate": 0}, "options.calibrate_matches: must be at least 1"),
        ({"model": "a\nb"}, "newlines"),
    ]:
        r = env.c.post("/api/jobs", json={**base, "options": opts})
        assert r.status_code == 400, opts
        assert msg in r.json()["error"], (opts, r.json())
    r = env.c.post("/api/jobs", json={**base, "target": "remote"})
    assert r.status_code == 400 and "no launch or restart_cmd" in r.json()["error"]
    r = env.c.post("/api/jobs", json={**base, "target": "nope"})
    assert r.status_code == 400 and "not a configured target" in r.json()["error"]
    r = env.c.post("/api/jobs", content=b"{", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = env.c.post("/api/jobs", content=b"kind=replay", headers={"Content-Type": "text/plain"})
    assert r.status_code == 400 and "want a JSON body" in r.json()["error"]
    assert sorted(os.listdir(env.data / "jobs")) == jobs_before
    assert not os.path.exists("/tmp/pwned")


# -- traces -----------------------------------------------------------------------------


def test_upload_validate_register(env, tmp_path):
    trace = small_trace(tmp_path / "up.arrow", sessions=2, turns=2)
    r = env.c.put("/api/traces/up.arrow", content=trace.read_bytes())
    assert r.status_code == 201, r.text
    info = r.json()
    assert (info["path"], info["requests"], info["sessions"]) == ("traces/up.arrow", 4, 2)
    assert info["bytes"] == trace.stat().st_size
    assert (env.data / "traces" / "up.arrow").read_bytes() == trace.read_bytes()
    r = env.c.put("/api/traces/up.arrow", content=b"other")
    assert r.status_code == 409
    r = env.c.put("/api/traces/junk.arrow", content=b"not an arrow file at all")
    assert r.status_code == 400 and "not an Arrow IPC file" in r.json()["error"]

    def stream():
        for _ in range(20):
            yield b"\0" * (100 << 10)

    r = env.c.put("/api/traces/big.arrow", content=stream())  # chunked: no Content-Length
    assert r.status_code == 413
    r = env.c.put("/api/traces/big2.arrow", content=b"\0" * (2 << 20))
    assert r.status_code == 413
    left = sorted(os.listdir(env.data / "traces"))
    assert left == [".registry.json", "link.arrow", "t.arrow", "up.arrow"]
    r = env.c.post("/api/traces/register", json={"path": "traces/t.arrow"})
    assert r.status_code == 201 and r.json()["requests"] == 20
    paths = [t["path"] for t in env.c.get("/api/traces").json()["traces"]]
    assert paths == ["traces/t.arrow", "traces/up.arrow"]


# -- queue, cancel ----------------------------------------------------------------------


def test_queue_and_cancel(env):
    hang = {"kind": "replay", "trace": "traces/t.arrow", "targets": ["hang"], "options": FAST}
    first = env.c.post("/api/jobs", json=hang).json()["id"]
    second = env.c.post("/api/jobs", json=hang).json()
    assert second["state"] == "queued" and second["queue_position"] >= 1
    poll(lambda: env.c.get(f"/api/jobs/{first}").json()["state"] == "running", "job running")
    poll(lambda: not port_closed(env.hang_port), "the hang emulator to listen")
    # the running job's live metrics (issue 8) are in /metrics, labelled with its id
    live = f'replayer_requests_inflight{{job_id="{first}",target="target"}}'
    poll(lambda: live in env.c.get("/metrics").text, "the job's live metrics")
    # the second job waits: the target is held by the first
    assert env.c.get(f"/api/jobs/{second['id']}").json()["state"] == "queued"
    r = env.c.post(f"/api/jobs/{second['id']}/cancel")
    assert r.status_code == 202 and r.json()["state"] == "cancelled"
    assert env.c.post(f"/api/jobs/{second['id']}/cancel").status_code == 409
    r = env.c.post(f"/api/jobs/{first}/cancel")
    assert r.status_code == 202 and r.json()["state"] == "cancelling"
    done = poll(
        lambda: (s := env.c.get(f"/api/jobs/{first}").json())["state"] in TERMINAL and s,
        "the cancel",
    )
    assert done["state"] == "cancelled"
    assert done["exit_code"] == 130
    assert port_closed(env.hang_port)  # the worker stopped the server it launched
    assert not (env.data / "jobs" / second["id"] / "out").exists()


def test_log_follows_a_running_job(env):
    body = {"kind": "replay", "trace": "traces/t.arrow", "targets": ["crash"], "options": FAST}
    job = env.c.post("/api/jobs", json=body).json()["id"]
    with env.c.stream("GET", f"/api/jobs/{job}/log", params={"follow": "1"}) as r:
        assert r.headers["Transfer-Encoding"] == "chunked"
        text = "".join(r.iter_text())
    # follow ends when the job does, with everything it wrote
    assert env.c.get(f"/api/jobs/{job}").json()["state"] == "finished"
    assert text == env.c.get(f"/api/jobs/{job}/log").text
    assert text.rstrip().endswith("worker exited with code 1: finished")
    offset = len(text.encode()) - 10
    assert env.c.get(f"/api/jobs/{job}/log", params={"offset": offset}).text == text[-10:]


# -- start-up ---------------------------------------------------------------------------


def test_refuses_a_public_address_without_a_token(tmp_path):
    env_ = {k: v for k, v in os.environ.items() if k != "REPLAYER_SERVE_TOKEN"}
    for host in ("0.0.0.0", "::"):
        res = subprocess.run(
            [sys.executable, "-m", "replayer", "serve", "--host", host, "--data", tmp_path / "d"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env_,
        )
        assert res.returncode == 2
        assert res.stderr.count("\n") == 1
        assert f"refusing to listen on {host} without a token" in res.stderr
    short = tmp_path / "short"
    short.write_text("abc\n")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "serve",
            "--data",
            tmp_path / "d",
            "--token-file",
            short,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_,
    )
    assert res.returncode == 2 and "at least 16 characters" in res.stderr


def test_one_serve_per_data_directory(env):
    second = ServeProcess(env.data, token=TOKEN, log_path=env.data.parent / "second.log")
    with pytest.raises(ServeStartError, match="another replayer serve is using"):
        second.start()
    assert second.proc.returncode == 2


def test_loopback_without_a_token_generates_one(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    env_ = {"REPLAYER_SERVE_TOKEN": ""}
    with ServeProcess(data, token=None, env=env_) as srv:
        token_file = data / "serve.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        with httpx.Client(base_url=srv.url) as c:
            assert c.get("/api/jobs").status_code == 401
            ok = c.get("/api/jobs", headers={"Authorization": f"Bearer {token}"})
            assert ok.status_code == 200 and ok.json() == {"jobs": []}


def test_a_running_replay_is_interrupted_by_a_restart(tmp_path):
    data = tmp_path / "d"
    (data / "traces").mkdir(parents=True)
    small_trace(data / "traces" / "t.arrow")
    port = free_port()
    toml = write_targets(
        tmp_path / "t.toml", {"hang": {"launch": emulator_cmd(port, "hang when request=8")}}
    )
    args = ["--cancel-grace", "6"]
    srv = ServeProcess(data, targets=toml, token=TOKEN, args=args).start()
    body = {"kind": "replay", "trace": "traces/t.arrow", "targets": ["hang"], "options": FAST}
    try:
        with httpx.Client(base_url=srv.url, headers=srv.auth) as c:
            job = c.post("/api/jobs", json=body).json()["id"]

            def sent():
                p = c.get(f"/api/jobs/{job}").json().get("progress") or {}
                return (p.get("targets") or {}).get("target", {}).get("sent", 0) >= 8

            poll(sent, "the replay to reach the hanging request")
    finally:
        srv.kill()  # SIGKILL: the worker learns it from PR_SET_PDEATHSIG
    # restarted at once: recovery stops the dead serve's worker (and its server)
    srv2 = ServeProcess(data, targets=toml, token=TOKEN, args=args).start()
    try:
        with httpx.Client(base_url=srv2.url, headers=srv2.auth) as c:
            s = poll(
                lambda: (s := c.get(f"/api/jobs/{job}").json())["state"] in TERMINAL and s,
                "the interruption",
            )
            assert s["state"] == "interrupted"
            assert s["message"] == "serve restarted while it ran; partial results are kept in out/"
            files = {f["path"] for f in c.get(f"/api/jobs/{job}/files").json()["files"]}
            assert "results.arrow" in files and "run.json" in files
            rows = read_results(data / "jobs" / job / "out" / "results.arrow")
            ok = {r["request_id"] for r in rows if r["status"] == "ok"}
            # completed before request 8 could leave (its session's chain, strict order)
            assert {"synth-00000-t000", "synth-00001-t000", "synth-00003-t000"} <= ok
            assert "synth-00000-t001" in ok
            assert "synth-00000-t002" not in ok
            assert port_closed(port)
            assert "restarted while this job ran: interrupted" in c.get(f"/api/jobs/{job}/log").text
    finally:
        srv2.stop()
