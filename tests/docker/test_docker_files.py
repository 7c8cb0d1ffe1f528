"""docker/ validated offline (no Docker engine here or in CI): compose against
the compose-spec schema and structurally, the Dockerfile with hadolint and
BuildKit's parser, targets.toml with replayer's loader, Prometheus and
Grafana provisioning structurally, and the dashboard's queries against the
metric names that really exist."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import struct
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import dockerfile
import pytest
from ruamel.yaml import YAML

from replayer.service.config import load_targets

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
BIN = Path(sys.executable).parent


def load_yaml(path):
    return YAML(typ="safe").load(path.read_text())


@pytest.fixture(scope="module")
def compose():
    return load_yaml(DOCKER / "compose.yaml")


def test_compose_matches_the_compose_spec_schema():
    res = subprocess.run(
        [
            BIN / "check-jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            DOCKER / "compose.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok -- validation done" in res.stdout


def _flags(command):
    return {
        command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")
    }


@pytest.mark.inprocess
def test_compose_lab_structure(compose):
    s = compose["services"]
    assert set(s) == {"mi355", "b300", "docker-proxy", "replayer", "prometheus", "grafana"}
    for name, svc in s.items():
        if "image" in svc:
            tag = svc["image"].rpartition(":")[2]
            assert ":" in svc["image"] and tag != "latest", f"{name}: pin the image"
    mi = s["mi355"]
    assert mi["image"].startswith("vllm/vllm-openai-rocm:")
    assert mi["devices"] == ["/dev/kfd", "/dev/dri"]
    assert {"video", "render"} <= set(mi["group_add"])
    assert mi["environment"] == {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_ROCM_USE_AITER_MOE": "1",
        "VLLM_ROCM_USE_AITER_MLA": "1",
        "VLLM_ROCM_AITER_MLA_ASM_PADDING": "asm",
        "HF_HOME": "/models",
    }
    flags = _flags(mi["command"])
    assert mi["command"][0] == "moonshotai/Kimi-K3"
    assert {k: flags[k] for k in (
        "--kv-cache-dtype", "--max-model-len", "--gpu-memory-utilization",
        "--max-num-batched-tokens", "--max-num-seqs", "--tensor-parallel-size", "--port",
    )} == {
        "--kv-cache-dtype": "fp8", "--max-model-len": "1048576",
        "--gpu-memory-utilization": "0.95", "--max-num-batched-tokens": "4096",
        "--max-num-seqs": "8", "--tensor-parallel-size": "8", "--port": "8000",
    }  # fmt: skip
    b3 = s["b300"]
    assert b3["image"].startswith("vllm/vllm-openai:")
    assert b3["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    ]
    assert b3["command"][0] == "moonshotai/Kimi-K3" and _flags(b3["command"])["--port"] == "8000"
    for svc in (mi, b3):
        assert svc["restart"] == "no"  # replayer restarts them
    proxy = s["docker-proxy"]
    assert proxy["environment"] == {"CONTAINERS": "1", "ALLOW_RESTARTS": "1", "POST": "0"}
    assert proxy["networks"] == ["control"] and compose["networks"]["control"]["internal"] is True
    rep = s["replayer"]
    assert rep["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    assert (DOCKER / rep["build"]["context"] / rep["build"]["dockerfile"]).resolve() == (
        DOCKER / "Dockerfile"
    )
    rflags = _flags(rep["command"])
    assert rep["command"][0] == "serve"
    assert rflags["--host"] == "0.0.0.0"
    assert rflags["--token-file"] == "/run/secrets/replayer_token"  # serve refuses 0.0.0.0 without
    assert rflags["--targets"] == "/etc/replayer/targets.toml"
    assert "./targets.toml:/etc/replayer/targets.toml:ro" in rep["volumes"]
    assert rep["secrets"] == ["replayer_token"]
    assert rep["environment"]["DOCKER_HOST"] == "tcp://docker-proxy:2375"
    assert "/var/run/docker.sock" not in json.dumps(rep)
    for svc in s.values():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), port
    # every bind-mounted file or folder exists
    for svc in s.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (DOCKER / src).exists(), src
    assert set(compose["secrets"]) == {"replayer_token", "grafana_admin"}


@pytest.mark.inprocess
def test_targets_toml_names_the_compose_containers(compose):
    targets = load_targets(DOCKER / "targets.toml")
    assert set(targets.by_name) == {"mi355", "b300"}
    for name, t in targets.by_name.items():
        svc = compose["services"][name]
        assert t.url == f"http://{name}:8000"
        assert t.restart_cmd == f"dockerctl restart {svc['container_name']}"
        assert t.log_cmd == f"dockerctl logs {svc['container_name']} --since {{since_unix}}"
        assert t.launch is None and t.restartable


def test_dockerfile_lints_clean_and_is_what_we_want():
    res = subprocess.run(
        [BIN / "hadolint", "--no-color", DOCKER / "Dockerfile"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == ""
    cmds = dockerfile.parse_file(str(DOCKER / "Dockerfile"))
    froms = [c for c in cmds if c.cmd == "FROM"]
    assert len(froms) == 2 and all(not c.value[0].endswith(":latest") for c in froms)
    final = cmds[cmds.index(froms[-1]) :]
    users = [c.value[0] for c in final if c.cmd == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entry = [c for c in final if c.cmd == "ENTRYPOINT"]
    assert len(entry) == 1 and entry[0].json and entry[0].value == ("replayer",)
    cmd = [c for c in final if c.cmd == "CMD"][-1]
    assert cmd.value[0] == "serve" and "--token-file" in cmd.value
    assert any(c.cmd == "HEALTHCHECK" for c in final)
    # every COPY source exists and passes the Dockerfile's .dockerignore
    patterns = [
        line.strip()
        for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(rel):
        keep = True
        for pat in patterns:
            neg = pat.startswith("!")
            pat = pat.lstrip("!")
            hit = fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel, pat.rstrip("*").rstrip("/"))
            if pat.endswith("/**"):
                hit = hit or rel == pat[:-3] or rel.startswith(pat[:-2])
            if pat == "**":
                hit = True
            if hit:
                keep = neg
        return keep

    for c in cmds:
        if c.cmd != "COPY" or any(f.startswith("--from") for f in c.flags):
            continue
        for src in c.value[:-1]:
            assert (REPO / src).exists(), src
            assert included(src.rstrip("/")), f"{src} is excluded by the .dockerignore"
    # the samples go in (the wheel carries them), a user's own traces beside them do not
    for excluded in (".venv", "runs", "traces/prod.arrow", ".git"):
        assert not included(excluded), excluded


@pytest.mark.inprocess
def test_prometheus_and_grafana_provisioning(compose):
    prom = load_yaml(DOCKER / "prometheus" / "prometheus.yml")
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    rep = jobs["replayer"]
    assert rep["static_configs"] == [{"targets": ["replayer:9000"]}]
    assert rep["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/run/secrets/replayer_token",
    }
    assert "replayer_token" in compose["services"]["prometheus"]["secrets"]
    vllm = {t["labels"]["platform"]: t["targets"] for t in jobs["vllm"]["static_configs"]}
    assert vllm == {"mi355": ["mi355:8000"], "b300": ["b300:8000"]}
    ds = load_yaml(DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    assert ds["datasources"][0]["uid"] == "prometheus"
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = load_yaml(DOCKER / "grafana" / "provisioning" / "dashboards" / "replayer.yaml")
    path = prov["providers"][0]["options"]["path"]
    assert f"./grafana/dashboards:{path}:ro" in compose["services"]["grafana"]["volumes"]
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert home == f"{path}/replayer.json"


def _families(registry):
    return {f.name: f.type for f in registry.collect()}


def known_metrics():
    """Family name -> type, for vLLM (as the emulator exports VLLM.md §5.2's
    set), replayer's live metrics (issue 8) and the service's own."""
    from replayer.emulator.config import EmulatorConfig
    from replayer.emulator.metrics import Metrics
    from replayer.service.metrics import ServiceMetrics
    from replayer.telemetry import LiveMetrics

    fams = _families(Metrics(EmulatorConfig()).registry)
    live = LiveMetrics()
    fake = SimpleNamespace(best=SimpleNamespace(positions=(0, 1)), rows=[0, 1, 2])
    fake.oracle = SimpleNamespace(on_trial=[])
    live.attach_bisect(fake)
    fams |= _families(live.registry)
    fams |= _families(ServiceMetrics(dict).registry)
    return fams


SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def resolves(name, fams):
    if fams.get(name) in ("gauge", "unknown"):
        return True
    for fam, kind in fams.items():
        if any(name == fam + sfx for sfx in SUFFIXES.get(kind, ())):
            return True
    return False


@pytest.mark.inprocess
def test_dashboard_loads_and_queries_real_metrics():
    dash = json.loads((DOCKER / "grafana" / "dashboards" / "replayer.json").read_text())
    assert dash["uid"] == "replayer-lab" and dash["schemaVersion"] >= 36
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    fams = known_metrics()
    used = set()
    queries = [p for p in panels if p["type"] != "row"]
    assert len(queries) == 23
    for p in queries:
        assert p["datasource"] == {"type": "prometheus", "uid": "prometheus"}
        pos = p["gridPos"]
        assert {"h", "w", "x", "y"} <= set(pos) and pos["x"] + pos["w"] <= 24
        assert p["targets"], p["title"]
        for t in p["targets"]:
            names = re.findall(r"\b(vllm:[a-z0-9_:]+|replayer_[a-z0-9_]+)", t["expr"])
            assert names or t["expr"].startswith("up{"), (p["title"], t["expr"])
            for n in names:
                assert resolves(n, fams), f"{p['title']}: {n} is not a real metric"
                used.add(n)
    # all three sources are on the dashboard
    assert any(n.startswith("vllm:") for n in used)
    assert any(n.startswith("replayer_serve_") for n in used)
    assert any(n.startswith("replayer_bisect_") for n in used)
    assert resolves("vllm:num_preemptions_total", fams)
    assert not resolves("vllm:gpu_cache_usage_perc", fams)  # the old name is not accepted


@pytest.mark.inprocess
def test_dockerctl_demultiplexes_container_logs():
    spec = importlib.util.spec_from_file_location("dockerctl", DOCKER / "dockerctl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    framed = b"".join(
        bytes([stream, 0, 0, 0]) + struct.pack(">I", len(p)) + p
        for stream, p in [(1, b"INFO ready\n"), (2, b"ERROR Memory access fault\n")]
    )
    assert mod.demux(framed) == b"INFO ready\nERROR Memory access fault\n"
    assert mod.demux(b"plain tty log\n") == b"plain tty log\n"
    assert tomllib.loads((DOCKER / "targets.toml").read_text())["targets"]["mi355"]["reset"] == (
        "restart"
    )
