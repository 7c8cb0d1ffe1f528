"""From a job request to the job the worker runs: options to argv through the
CLI's parser, the command a job plans, secrets redacted."""

from __future__ import annotations

import pytest

from replayer.service.config import load_targets
from replayer.service.specs import SpecError, option_argv, option_values, plan_job, redact_argv

pytestmark = pytest.mark.inprocess


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


def test_a_negated_flag_by_parameter_name_is_the_parameters_value():
    # "enabled" is WatchConfig's parameter, "no_monitor" its flag (--no-monitor)
    assert option_values("bisect", {"enabled": True}) == ([], {"enabled": True})
    assert option_values("bisect", {"enabled": False}) == (["--no-monitor"], {"enabled": False})
    assert option_values("bisect", {"no_monitor": True}) == (["--no-monitor"], {"enabled": False})
    assert option_values("bisect", {"no-monitor": False}) == ([], {"enabled": True})
    assert option_values("replay", {"save_output": True}) == (
        ["--save-output"],
        {"save_output": True},
    )
