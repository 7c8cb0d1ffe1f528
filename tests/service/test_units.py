"""In-process checks of the service's pure parts: path confinement, the job
request to argv mapping, targets.toml, the token check."""

from __future__ import annotations

import base64
import os

import pytest

from replayer.errors import UsageError
from replayer.service.auth import authorized, is_loopback, load_token
from replayer.service.config import load_targets
from replayer.service.paths import PathRejected, confine, safe_name, suspicious_raw_path
from replayer.service.specs import SpecError, option_argv, plan_job, redact_argv

TOKEN = "x" * 24


def test_confine(tmp_path):
    root = (tmp_path / "root").resolve()
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_text("x")
    (tmp_path / "out.txt").write_text("x")
    os.symlink(tmp_path / "out.txt", root / "a" / "out-link")
    os.symlink(root / "a" / "f", root / "in-link")
    assert confine(root, "a/f") == root / "a" / "f"
    assert confine(root, "in-link") == root / "a" / "f"
    bad = ["", "/etc", "../x", "a/../a/f", "a/./f", "a//f", "%2e%2e/x", "a\\f", "a/\x00",
           "C:x", "a/out-link", "missing"]  # fmt: skip
    for text in bad:
        with pytest.raises(PathRejected):
            confine(root, text)
    assert safe_name("t.arrow") == "t.arrow"
    for name in (".x", "a/b", "..", "a..b", "", "x" * 200, "a b"):
        with pytest.raises(PathRejected):
            safe_name(name)
    assert suspicious_raw_path("/api/jobs/x/files/a.json?x=..") is None
    for raw in ("/a/../b", "/a/%2E%2e/b", "/a/..%2Fb", "/a/%5c", "/a/%00", "/a/./b", "/a\\b"):
        assert suspicious_raw_path(raw) is not None, raw


def test_option_argv_uses_the_cli_parser():
    assert option_argv(
        "bisect",
        {"timing": "asap", "max_inflight": 4, "no-force-stream": True, "save-output": False},
    ) == ["--timing=asap", "--max-inflight=4", "--no-force-stream"]
    assert option_argv("verify", {"runs": 3}) == ["--runs=3"]
    for kind, opts, msg in [
        ("replay", {"launch": "sh"}, "targets.toml"),
        ("replay", {"out": "/tmp"}, "set by the server"),
        ("replay", {"runs": 3}, "not an option of replayer replay"),
        ("bisect", {"no-force-stream": "yes"}, "want true or false"),
        ("bisect", {"model": {"a": 1}}, "want a string or a number"),
        ("bisect", [1], "want an object"),
    ]:
        with pytest.raises(SpecError, match=msg):
            option_argv(kind, opts)


def test_plan_job_builds_the_command(tmp_path):
    toml = tmp_path / "t.toml"
    toml.write_text(
        '[targets.mi355]\nurl = "http://n:8000"\nrestart_cmd = "ssh n docker restart vllm"\n'
        'log_cmd = "ssh n docker logs vllm"\napi_key_env = "K"\nreset = "prefix-cache"\n'
        '[targets.b300]\nurl = "http://b:8000"\napi_key_env = "KB"\n'
    )
    targets = load_targets(toml)
    trace = tmp_path / "t.arrow"

    def resolve(field, value):
        return trace, value

    plan = plan_job(
        {"kind": "bisect", "trace": "t.arrow", "target": "mi355", "control": "b300",
         "options": {"confirm": 3}},
        targets, resolve, tmp_path / "out",
    )  # fmt: skip
    assert plan.argv == [
        "bisect", str(trace), "--restart-cmd=ssh n docker restart vllm", "--url=http://n:8000",
        "--log-cmd=ssh n docker logs vllm", "--api-key-env=K", "--reset=prefix-cache",
        "--control=b300=http://b:8000", "--control-key=env:KB", "--confirm=3",
        f"--out={tmp_path / 'out'}",
    ]  # fmt: skip
    assert plan.targets == ("mi355", "b300")
    assert redact_argv(plan.argv)[2] == "--restart-cmd=<from targets.toml>"
    plan = plan_job(
        {"kind": "replay", "trace": "t.arrow", "targets": ["mi355", "b300"]},
        targets, resolve, tmp_path / "out",
    )  # fmt: skip
    assert plan.argv[2:5] == [
        "--target=mi355=http://n:8000", "--target-key=mi355=env:K", "--target=b300=http://b:8000",
    ]  # fmt: skip
    with pytest.raises(SpecError, match="no launch or restart_cmd"):
        plan_job({"kind": "bisect", "trace": "t", "target": "b300"}, targets, resolve, tmp_path)
    with pytest.raises(SpecError, match="unknown field"):
        plan_job({"kind": "replay", "cmd": "x"}, targets, resolve, tmp_path)


def test_targets_toml_errors(tmp_path):
    cases = [
        ('[targets.a]\nlaunch = "x"\nrestart_cmd = "y"\n', "exclusive"),
        ('[targets.a]\nrestart_cmd = "y"\n', "url is required"),
        ('[targets.a]\nurl = "ftp://x"\n', r"http\(s\) URL"),
        ('[targets.a]\nurl = "http://x"\nshell = "y"\n', "unknown key"),
        ('[targets."a b"]\nurl = "http://x"\n', "target name"),
        ("[other]\n", "unknown table"),
        ("[targets.a\n", "not valid TOML"),
    ]
    for text, msg in cases:
        p = tmp_path / "t.toml"
        p.write_text(text)
        with pytest.raises(UsageError, match=msg):
            load_targets(p)
    t = load_targets(None)
    with pytest.raises(UsageError, match="none configured"):
        t.get("x")


def test_token_checks(tmp_path, monkeypatch):
    assert authorized(f"Bearer {TOKEN}", "POST", TOKEN)
    assert not authorized(f"Bearer {TOKEN}1", "GET", TOKEN)
    assert not authorized(None, "GET", TOKEN)
    basic = "Basic " + base64.b64encode(f"u:{TOKEN}".encode()).decode()
    assert authorized(basic, "GET", TOKEN) and authorized(basic, "HEAD", TOKEN)
    assert not authorized(basic, "POST", TOKEN) and not authorized(basic, "DELETE", TOKEN)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    monkeypatch.delenv("REPLAYER_SERVE_TOKEN", raising=False)
    with pytest.raises(UsageError, match="refusing to listen on 0.0.0.0"):
        load_token(None, tmp_path, "0.0.0.0")
    monkeypatch.setenv("REPLAYER_SERVE_TOKEN", TOKEN)
    assert load_token(None, tmp_path, "0.0.0.0") == (TOKEN, "$REPLAYER_SERVE_TOKEN")
