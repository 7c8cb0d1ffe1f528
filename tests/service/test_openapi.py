"""The OpenAPI document of ``replayer serve``, and the API fuzzed with it.

The document is checked against the router the service really builds (every
registered route is described and nothing else), against the declared job
options, and against a live service: every route but ``/healthz`` refuses a
missing or wrong token. Then schemathesis drives a live ``replayer serve``
subprocess from the document, with valid and invalid data, and every answer
must be a documented one: no 5xx, no traceback in the service's log, no
byte of a file outside ``--data`` in any response, nothing written outside.
"""

from __future__ import annotations

import http.client
import os
import time
from pathlib import Path

import httpx
import pytest

from replayer import options
from replayer.service.app import ROUTES, ServeConfig, Service
from replayer.service.config import load_targets
from replayer.service.launcher import ServeProcess
from replayer.service.specs import KINDS, LAUNCH_KEYS, POOL_OWNED, SERVER_OWNED
from tests.helpers.net import free_port
from tests.helpers.service import TOKEN, emulator_cmd, poll, small_trace, write_targets

TERMINAL = {"finished", "failed", "cancelled", "interrupted"}
CANARY = "CANARY-outside-data-7f3a9c"
FAST = {"timing": "asap", "settle": 2, "grace": 0.3, "health-interval": 0.1}
EXAMPLES = 50
"""Fuzzed requests per route and generation mode (see test_fuzz_the_api)."""


class Env:
    pass


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("openapi")
    e = Env()
    e.base = base
    e.data = base / "data"
    e.outside = base / "outside"
    (e.data / "traces").mkdir(parents=True)
    e.outside.mkdir()
    small_trace(e.data / "traces" / "t.arrow")
    (e.outside / "secret.txt").write_text(CANARY + "\n")
    small_trace(e.outside / "secret.arrow")
    os.symlink(e.outside, e.data / "link-out")
    os.symlink(e.outside / "secret.txt", e.data / "traces" / "link.arrow")
    e.port = free_port()
    e.toml = write_targets(
        base / "targets.toml",
        {"emu": {"launch": emulator_cmd(e.port, "exit after=0.1 when request=3")}},
    )
    e.proc = ServeProcess(e.data, targets=e.toml, token=TOKEN).start()
    e.c = httpx.Client(base_url=e.proc.url, headers=e.proc.auth, timeout=30)
    r = e.c.post(
        "/api/jobs",
        json={"kind": "replay", "trace": "traces/t.arrow", "targets": ["emu"], "options": FAST},
    )
    assert r.status_code == 201, r.text
    e.job = r.json()["id"]
    poll(lambda: e.c.get(f"/api/jobs/{e.job}").json()["state"] in TERMINAL, "the replay job")
    out = e.data / "jobs" / e.job / "out"
    os.symlink(e.outside / "secret.txt", out / "escape.txt")
    os.symlink(e.outside, out / "escape-dir")
    e.doc = e.c.get("/api/openapi.json").json()
    yield e
    e.c.close()
    e.proc.stop()


def _router_routes(tmp_path, toml):
    svc = Service(ServeConfig(data=tmp_path, token=TOKEN, targets=load_targets(toml)))
    got = set()
    for r in svc.app().router.routes():
        if r.method != "HEAD":  # aiohttp's add_get answers HEAD too
            got.add((r.method, r.resource.canonical))
    return got


def test_the_document_describes_every_registered_route_and_no_other(env, tmp_path):
    described = {(m.upper(), p) for p, ops in env.doc["paths"].items() for m in ops}
    assert described == _router_routes(tmp_path, env.toml)
    assert ("GET", "/api/openapi.json") in described
    assert len(described) == len(ROUTES) == 17


def test_security_every_operation_but_healthz_needs_the_token(env):
    doc = env.doc
    assert doc["openapi"] == "3.1.0"
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if path == "/healthz":
                assert op["security"] == [] and "401" not in op["responses"]
            else:
                assert {"bearer": []} in op["security"], (method, path)
                assert {"basic": []} in op["security"] or method != "get"
                assert {"basic": []} not in op["security"] or method == "get"
                assert op["responses"]["401"]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"
                }
    ops = doc["paths"]
    assert set(ops["/api/traces/{name}"]["put"]["responses"]) == {"201", "400", "401", "409", "413"}
    assert set(ops["/api/jobs/{id}/files/{path}"]["get"]["responses"]) == {
        "200",
        "400",
        "401",
        "404",
    }


def test_job_requests_follow_the_declared_options(env):
    variants = env.doc["components"]["schemas"]["JobRequest"]["oneOf"]
    by_kind = {v["properties"]["kind"]["const"]: v for v in variants}
    assert set(by_kind) == set(KINDS)
    for kind, v in by_kind.items():
        declared = set(options.options_of(kind)) - SERVER_OWNED - POOL_OWNED - LAUNCH_KEYS
        props = v["properties"]["options"]["properties"]
        assert set(props) == declared, kind
        assert v["properties"]["options"]["additionalProperties"] is False
    bisect = by_kind["bisect"]["properties"]
    opts = bisect["options"]["properties"]
    assert opts["timing"]["enum"] == [t.value for t in options.Timing]
    assert opts["timing"]["default"] == "recorded"
    assert opts["max_inflight"] == {
        "type": "integer",
        "minimum": 1,
        "description": opts["max_inflight"]["description"],
    }
    assert opts["ready_timeout"]["exclusiveMinimum"] == 0
    assert opts["enabled"] == {
        "type": "boolean",
        "description": opts["enabled"]["description"],
        "default": True,
    }
    assert opts["stages"]["type"] == "string"  # one text, parsed: "calibrate,cut"
    assert bisect["target"] == {"type": "string", "enum": ["emu"]}
    assert bisect["max_servers"] == {"type": "integer", "minimum": 1}
    assert set(by_kind["replay"]["required"]) == {"kind", "trace", "targets"}
    for owned in ("out", "resume", "launch", "restart_cmd", "pool", "servers", "metrics_port"):
        assert owned not in opts
    states = env.doc["components"]["schemas"]["Job"]["properties"]["state"]["enum"]
    assert states == [
        "queued",
        "running",
        "cancelling",
        "finished",
        "failed",
        "cancelled",
        "interrupted",
    ]


def _example_path(path, job):
    return path.replace("{id}", job).replace("{path}", "summary.json").replace("{name}", "x.arrow")


def test_every_route_but_healthz_refuses_a_missing_or_wrong_token(env):
    anon = httpx.Client(base_url=env.proc.url, timeout=30)
    try:
        for route in ROUTES:
            path = _example_path(route.openapi_path, env.job)
            if route.path == "/healthz":
                assert anon.request(route.method, path).status_code == 200
                continue
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789abc"}):
                r = anon.request(route.method, path, headers=headers, content=b"{}")
                assert r.status_code == 401, (route.method, path, headers, r.text)
                assert r.json() == {"error": "unauthorized: send Authorization: Bearer <token>"}
            ok = env.c.request(route.method, path)
            assert ok.status_code != 401, (route.method, path)
    finally:
        anon.close()


def test_list_filters_refuse_unknown_values(env):
    r = env.c.get("/api/jobs", params={"state": "runing"})
    assert r.status_code == 400
    assert r.json() == {
        "error": "state: one of queued, running, cancelling, finished, failed, cancelled, "
        "interrupted"
    }
    r = env.c.get("/api/jobs", params={"kind": "check"})
    assert (r.status_code, r.json()) == (400, {"error": "kind: one of replay, bisect, verify"})


def _raw(env, method, path, body=None):
    """``path`` sent exactly as given (no client-side normalization)."""
    conn = http.client.HTTPConnection("127.0.0.1", env.proc.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in env.proc.auth.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_no_route_reads_or_writes_outside_data(env):
    job = env.job
    before = _tree(env.outside)
    for rel in (
        "escape.txt",
        "escape-dir/secret.txt",
        "../../../link-out/secret.txt",
        "%2e%2e/%2e%2e/%2e%2e/link-out/secret.txt",
        "..%2f..%2f..%2flink-out%2fsecret.txt",
        f"{env.outside}/secret.txt",
        "/" + str(env.outside / "secret.txt"),
    ):
        status, body = _raw(env, "GET", f"/api/jobs/{job}/files/{rel}")
        assert status == 400, (rel, status, body)
        assert CANARY.encode() not in body
    for name in ("..%2f..%2fescape.arrow", "%2e%2e", ".hidden", "a%2fb", "..%5cx"):
        status, body = _raw(env, "PUT", f"/api/traces/{name}", b"x")
        assert status == 400, (name, status, body)
    for path in (
        "link-out/secret.txt",
        "traces/link.arrow",
        "../outside/secret.txt",
        str(env.outside / "secret.txt"),
        "traces/%2e%2e/%2e%2e/outside/secret.txt",
        "traces\\..\\..\\outside\\secret.txt",
    ):
        r = env.c.post("/api/traces/register", json={"path": path})
        assert r.status_code == 400, (path, r.text)
        assert CANARY not in r.text
    assert _tree(env.outside) == before
    assert not (env.base / "escape.arrow").exists()


# -- schemathesis over a live service ---------------------------------------------------


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[p] = (st.st_mode, st.st_size)
    return out


def _fuzz(env, label, strategies, checks, counts):
    """``EXAMPLES`` cases of each strategy against the live service."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    log = env.proc.log_path

    @settings(
        max_examples=EXAMPLES * len(strategies),
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(strategies))
    def run(case):
        before = log.stat().st_size
        resp = case.call(headers=env.proc.auth, timeout=30)
        counts[label] = counts.get(label, 0) + 1
        case.validate_response(resp, checks=checks, headers=env.proc.auth)
        assert CANARY.encode() not in resp.content, case.as_curl_command()
        with log.open("rb") as f:
            f.seek(before)
            grew = f.read()
        assert b"Traceback" not in grew, grew.decode(errors="replace")[-2000:]

    run()


@pytest.mark.slow
@pytest.mark.e2e
def test_fuzz_the_api(env):
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        ignored_auth,
        response_schema_conformance,
        status_code_conformance,
    )

    schema = schemathesis.openapi.from_url(
        f"{env.proc.url}/api/openapi.json", headers=env.proc.auth, timeout=30
    )
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
        ignored_auth,
    ]
    outside_before = _tree(env.outside)
    around = {p for p in _tree(env.base) if not p.startswith(str(env.data))}
    counts: dict[str, int] = {}
    t0 = time.monotonic()
    operations = [r.ok() for r in schema.get_all_operations()]
    # schemathesis leaves out the document's own route
    labels = {f"{r.method} {r.openapi_path}" for r in ROUTES} - {"GET /api/openapi.json"}
    assert {f"{o.method.upper()} {o.path}" for o in operations} == labels
    for op in operations:
        label = f"{op.method.upper()} {op.path}"
        strategies = [op.as_strategy(GenerationMode.POSITIVE)]
        if op.path_parameters or op.query or op.body:
            strategies.append(op.as_strategy(GenerationMode.NEGATIVE))
        if "{id}" in op.path:  # reach past the job lookup: the real job's files
            strategies.append(op.as_strategy(path_parameters={"id": env.job}))
            strategies.append(
                op.as_strategy(GenerationMode.NEGATIVE, path_parameters={"id": env.job})
            )

        _fuzz(env, label, strategies, checks, counts)
    elapsed = time.monotonic() - t0
    print(f"schemathesis: {sum(counts.values())} requests in {elapsed:.1f} s: {counts}")
    assert set(counts) == labels
    assert "Traceback" not in env.proc.log()
    assert _tree(env.outside) == outside_before
    assert {p for p in _tree(env.base) if not p.startswith(str(env.data))} == around
