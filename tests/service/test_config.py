"""``targets.toml``: what the loader refuses, in one line each."""

from __future__ import annotations

import pytest

from replayer.errors import UsageError
from replayer.service.config import load_targets

pytestmark = pytest.mark.inprocess


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
