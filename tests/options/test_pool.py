"""Pool files and ``--servers N``: N servers of one configuration, each with
its own port and GPUs, and every mistake in a pool file named in one line."""

from __future__ import annotations

import pytest

from replayer.errors import OptionError, UsageError
from replayer.options.pool import PoolSpec, fill
from replayer.options.server import ResetMode, Server

pytestmark = pytest.mark.inprocess


def load(tmp_path, text: str) -> PoolSpec:
    p = tmp_path / "pool.toml"
    p.write_text(text)
    return PoolSpec.load(p)


def test_fill_touches_only_its_own_words():
    launch = 'vllm serve m --port {port} --hf-overrides {"a": {"b": 1}} --gpus {gpus}'
    assert fill(launch, port=8001, gpus="2,3") == (
        'vllm serve m --port 8001 --hf-overrides {"a": {"b": 1}} --gpus 2,3'
    )


def test_servers_n_copies_the_launch_with_a_port_and_gpus_each():
    spec = PoolSpec.like(Server(launch="serve --port {port} --dev {gpus}"), 3, gpus=2, port=9000)
    assert len(spec) == 3 and spec.source == "--servers 3"
    assert [(m.slot, m.port, m.gpus) for m in spec.members] == [
        (0, 9000, "0,1"),
        (1, 9001, "2,3"),
        (2, 9002, "4,5"),
    ]


def test_servers_n_needs_a_port_per_server():
    with pytest.raises(OptionError, match="servers needs {port} in launch"):
        PoolSpec.like(Server(launch="serve --port 8000"), 2)
    with pytest.raises(OptionError, match="servers needs launch"):
        PoolSpec.like(Server(url="http://127.0.0.1:8000"), 2)
    with pytest.raises(OptionError, match="servers must be at least 1"):
        PoolSpec.like(Server(launch="serve --port {port}"), 0)


def test_a_pool_file_of_launched_servers(tmp_path):
    spec = load(
        tmp_path,
        'servers = 2\nlaunch = "serve --port {port}"\nport = 8100\n'
        'ready_timeout = 1800\nreset = "prefix-cache"\n',
    )
    assert [m.port for m in spec.members] == [8100, 8101]
    assert spec.launch_template == "serve --port {port}"
    assert {m.server.ready_timeout for m in spec.members} == {1800.0}
    assert {m.server.reset for m in spec.members} == {ResetMode("prefix-cache")}
    assert spec.slurm is None


def test_a_slurm_pool_file(tmp_path):
    spec = load(
        tmp_path,
        'servers = 2\nlaunch = "vllm serve m --port {port}"\n'
        '[slurm]\npartition = "mi355"\ngres = "gpu:8"\ntime = "4:00:00"\n'
        'extra = ["--account", "lab"]\npending_timeout = 60\n',
    )
    assert spec.slurm is not None
    assert (spec.slurm.partition, spec.slurm.gres, spec.slurm.time) == ("mi355", "gpu:8", "4:00:00")
    assert spec.slurm.extra == ("--account", "lab") and spec.slurm.pending_timeout == 60.0
    # each job may land on its own node: the URL names the node, ports count from 8000
    assert spec.url_template == "http://{node}:{port}"
    assert [m.port for m in spec.members] == [8000, 8001]


def test_a_pool_file_of_running_servers(tmp_path):
    spec = load(
        tmp_path,
        '[[server]]\nurl = "http://10.0.0.3:8000"\nrestart_cmd = "ssh n3 restart"\n'
        '[[server]]\nurl = "http://10.0.0.4:8000"\n',
    )
    assert [m.server.url for m in spec.members] == ["http://10.0.0.3:8000", "http://10.0.0.4:8000"]
    assert [m.server.restart_cmd for m in spec.members] == ["ssh n3 restart", None]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('servers = 2\nlaunch = "x {port}"\nnodes = 3\n', "unknown key(s) nodes"),
        ("servers = 2\n", "launch is required"),
        ('servers = 0\nlaunch = "x {port}"\n', "servers must be a count of at least 1"),
        ('launch = "x"\n[[server]]\nurl = "http://h:1"\n', "not both"),
        ('launch = "x"\n[slurm]\nqueue = "q"\n', "[slurm] takes"),
        ("[[server]]\nport = 3\n", "server 1 takes"),
        ('launch = "x"\nreset = "sometimes"\n', "--pool "),
        ("launch = \n", "not TOML"),
    ],
)
def test_pool_file_mistakes_are_one_line(tmp_path, text, message):
    with pytest.raises(UsageError) as err:
        load(tmp_path, text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_unreadable_pool_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        PoolSpec.load(tmp_path / "none.toml")


def test_slots_keep_their_own_ports_and_gpus(tmp_path):
    spec = load(
        tmp_path,
        'servers = 4\nlaunch = "serve --port {port}"\nport = 8100\ngpus = 2\nslots = [1, 3]\n',
    )
    assert [(m.slot, m.port, m.gpus) for m in spec.members] == [(1, 8101, "2,3"), (3, 8103, "6,7")]
    with pytest.raises(UsageError, match=r"slots wants server numbers 0..3"):
        load(tmp_path, 'servers = 4\nlaunch = "serve --port {port}"\nslots = [4]\n')


def test_the_pool_files_key_comes_from_its_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("POOL_KEY", " sk-pool \n")
    spec = load(tmp_path, 'servers = 2\nlaunch = "serve --port {port}"\napi_key_env = "POOL_KEY"\n')
    assert {m.server.api_key for m in spec.members} == {"sk-pool"}
    monkeypatch.delenv("POOL_KEY")
    with pytest.raises(UsageError, match="environment variable POOL_KEY is not set"):
        load(tmp_path, 'servers = 2\nlaunch = "serve --port {port}"\napi_key_env = "POOL_KEY"\n')


def test_a_bad_number_is_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"^--pool .*pool.toml: ") as err:
        load(tmp_path, 'servers = 2\nlaunch = "serve --port {port}"\ngpus = "two"\n')
    assert "\n" not in str(err.value)
