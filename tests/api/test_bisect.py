"""``api.bisect`` as a user scripts it: the README example runs verbatim."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "agents-8x10.arrow"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- api-example -->\n```python\n(.*?)```", text, re.S)
    assert m, "the README lost its API example"
    return m.group(1)


@pytest.mark.slow
def test_the_readme_example_replays_and_bisects(tmp_path, monkeypatch, capsys):
    code = readme_example()
    assert "replayer.cli" not in code and "argparse" not in code
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    monkeypatch.chdir(tmp_path)
    code = code.replace("--port 8431", f"--port {_free_port()}")  # CI may run two suites
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("process_exit ")
    rate = out[1].rsplit(" ", 1)[1]
    assert out[1].startswith("complete ")
    # the planted trigger: a long turn and the turn before it, in one session
    got = eval(out[1][len("complete ") : out[1].rindex(" ")])  # the printed tuple of ids
    assert len(got) == 2 and got[0].rsplit("-t", 1)[0] == got[1].rsplit("-t", 1)[0], got
    assert rate == "2/2"
    bundle = Path(out[2].removeprefix("bundle: "))
    assert (bundle / "repro.py").exists() and (bundle / "trace.arrow").exists()
    # the in-process oracle: the first long turn in trace order, and its warm-up
    # (27 trials before issue 16: the prefix stage's two re-check runs since,
    # 16 of the shrink stage, and 4 of its rate guard: two accepted cuts of a
    # crash that struck on every run, each asked for two more crashes)
    assert out[3] == "complete ('synth-00002-t008', 'synth-00002-t009') 49 trials"
    # the oracle's threshold is 100,000 bytes of JSON: in the trace's token estimate
    assert out[4] == (
        "crashes at >= ~23,506 prompt tokens, not at ~23,498 prompt tokens; "
        "max_tokens 1 crashes (recorded 64)"
    )
