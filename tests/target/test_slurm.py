"""The pure parts of the Slurm target: the ``sbatch`` command line, job names,
exit codes, URL templates, and which ended jobs count as lost rather than
crashed. The target against a real scheduler (submission, pending reasons,
``scancel``, restarts) is tested in tests/slurm/, on a one-node cluster."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from replayer.target.slurm import SlurmJob, SlurmTarget, exit_of, fill, job_name, owner_hash

pytestmark = pytest.mark.inprocess


def target(tmp_path: Path, job: SlurmJob | None = None) -> SlurmTarget:
    return SlurmTarget(
        "vllm serve m --port 8100",
        "http://{node}:8100",
        tmp_path / "server.log",
        job or SlurmJob(),
        name="replayer-abc-0",
    )


def test_sbatch_asks_for_what_the_pool_names_and_execs_the_server(tmp_path: Path) -> None:
    job = SlurmJob(
        partition="mi355", gres="gpu:8", time="4:00:00", extra=("--account", "lab")
    )  # fmt: skip
    argv = target(tmp_path, job)._sbatch_argv()
    assert argv[:2] == ["sbatch", "--parsable"]
    assert argv[argv.index("--job-name") + 1] == "replayer-abc-0"
    assert argv[argv.index("--output") + 1] == str(tmp_path / "server.log")
    assert "--open-mode=append" in argv  # a restart's log follows the last one's
    assert argv[argv.index("--partition") + 1] == "mi355"
    assert "--gres=gpu:8" in argv
    assert argv[argv.index("--time") + 1] == "4:00:00"
    assert argv[-4:] == ["--account", "lab", "--wrap", "exec vllm serve m --port 8100"]


def test_sbatch_leaves_out_what_the_pool_does_not_name(tmp_path: Path) -> None:
    argv = target(tmp_path)._sbatch_argv()
    assert not {"--partition", "--time"} & set(argv)
    assert not [a for a in argv if a.startswith("--gres")]


def test_job_names_find_an_owners_jobs_again() -> None:
    a, b = owner_hash("/runs/bisect-1"), owner_hash("/runs/bisect-2")
    assert a == owner_hash("/runs/bisect-1") and a != b  # stable, and apart
    assert len(a) == 10 and int(a, 16) >= 0
    assert job_name(a, 2) == f"replayer-{a}-2"


@pytest.mark.parametrize(
    ("field", "code", "sig"),
    [("0:0", 0, None), ("1:0", 1, None), ("0:15", None, 15), ("0:9", None, 9)],
)
def test_exit_of_reads_slurms_exit_code(field: str, code: int | None, sig: int | None) -> None:
    got = exit_of({"ExitCode": field})
    assert got is not None and (got.code, got.signal) == (code, sig)


@pytest.mark.parametrize("record", [{}, {"ExitCode": ""}, {"ExitCode": "n/a"}])
def test_exit_of_an_unknown_record_is_none(record: dict[str, str]) -> None:
    assert exit_of(record) is None


def test_fill_replaces_only_the_named_words() -> None:
    cmd = 'vllm serve m --port {port} --gpus {gpus} --x \'{"a": {"b": 1}}\''
    assert fill(cmd, port=8100, gpus="0,1") == (
        'vllm serve m --port 8100 --gpus 0,1 --x \'{"a": {"b": 1}}\''
    )
    # an argv is joined for the shell first: the same words come back
    assert shlex.split(fill(["echo", "{node}", "a b"], node="n3")) == ["echo", "n3", "a b"]


def test_the_url_waits_for_the_node(tmp_path: Path) -> None:
    t = target(tmp_path)
    assert t.url == "http://pending:8100" and t.alive() is None  # nothing submitted


@pytest.mark.parametrize(
    ("state", "lost"),
    [
        ("RUNNING", False),
        ("FAILED", False),  # the server exited: a crash
        ("COMPLETED", False),
        ("CANCELLED", True),
        ("CANCELLED by 0", True),
        ("PREEMPTED", True),
        ("NODE_FAIL", True),
        ("TIMEOUT", True),
    ],
)
def test_a_job_the_scheduler_ended_is_lost_not_crashed(
    tmp_path: Path, state: str, lost: bool
) -> None:
    t = target(tmp_path)
    t.job_id, t._state = "42", state
    assert bool(t.lost) is lost
    if lost:
        assert "slurm job 42 (replayer-abc-0)" in str(t.lost)


def test_our_own_scancel_is_not_a_lost_job(tmp_path: Path) -> None:
    t = target(tmp_path)
    t.job_id, t._state, t._stopping = "42", "CANCELLED", True
    assert t.lost is None
