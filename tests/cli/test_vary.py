"""``--vary`` from the command line: ``bundle verify`` against emulators whose
crash needs a prefix-cache hit and an environment switch finds both, and
bad input is one line on stderr with exit 2."""

from __future__ import annotations

import shlex
import sys

import orjson

from tests.helpers.bundles import make_bundle
from tests.helpers.cli import assert_one_line_error, run
from tests.helpers.net import free_port

FAST = ["--settle", "0.5", "--grace", "0.3", "--health-interval", "0.1"]


def emulator(*faults, env=""):
    args = [sys.executable, "-m", "replayer.emulator", "--port", str(free_port())]
    args += ["--speed", "instant"]
    for f in faults:
        args += ["--fault", f]
    return f"{env} {shlex.join(args)}".strip()


def test_verify_vary_finds_what_the_crash_needs(tmp_path):
    b = make_bundle(tmp_path)  # 2 sessions of 3 turns: later turns hit the prefix cache
    variants = tmp_path / "variants.toml"
    variants.write_text(
        '[[variant]]\nname = "cache-off"\nadd = ["--no-enable-prefix-caching"]\n'
        'means = "needs a prefix-cache hit"\n\n'
        '[[variant]]\nname = "fewer-seqs"\nadd = ["--max-num-seqs", "64"]\n'
    )
    launch = emulator(
        "exit after=0.1 when cached_tokens>=1000 and env.VLLM_ROCM_USE_AITER_MLA=1",
        env="VLLM_ROCM_USE_AITER=1",
    )
    res = run(
        "bundle", "verify", b, "--launch", launch, "--out", tmp_path / "v", "--runs", "5",
        "--vary", variants, "--vary", "default:no-aiter-mla,no-speculative-decoding",
        "--vary-runs", "4", *FAST,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    report = orjson.loads((tmp_path / "v" / "variants.json").read_bytes())
    got = [(r["name"], r["crashes"], r["runs"], r["verdict"]) for r in report["variants"]]
    assert got == [
        ("cache-off", 0, 4, "gone"),  # upper bound 53% < the control's lower bound 57%
        ("fewer-seqs", 1, 1, "crashes"),  # settled: 1/4 could not be rarer than 5/5
        ("no-aiter-mla", 0, 4, "gone"),  # the fault needs the (default-on) MLA switch
        ("no-speculative-decoding", 0, 0, "skipped"),
    ]
    ctl = report["control"]
    assert (ctl["crashes"], ctl["runs"], ctl["source"]) == (5, 5, "verify")
    rows = {r["name"]: r for r in report["variants"]}
    assert rows["no-aiter-mla"]["launch"].startswith(
        "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MLA=0 "
    )
    assert rows["cache-off"]["launch"].endswith(" --no-enable-prefix-caching")
    reading = (
        "needs a prefix-cache hit; gone with VLLM_ROCM_USE_AITER_MLA=0; "
        "still crashes with fewer-seqs; 1 skipped"
    )
    assert report["reading"] == reading
    out = res.stdout.splitlines()
    at = out.index("what makes it go away (4 run(s) per variant; control: the verify runs):")
    table = [line.split() for line in out[at + 1 : at + 7]]
    assert [t[0] for t in table] == [
        "variant",
        "unmodified",
        "cache-off",
        "fewer-seqs",
        "no-aiter-mla",
        "no-speculative-decoding",
    ]
    assert table[2][-3:] == ["0/4", "0%-53%", "gone"]
    assert rows["fewer-seqs"]["settled"] == 1 and "settled" not in rows["cache-off"]
    assert " ".join(table[3][-9:]) == "1/1 21%-100% crashes (settled after 1 of 4 runs)"
    assert out[at + 7] == f"  reading: {reading}"
    assert "variant cache-off 4/4: PASS" in res.stderr
    assert "variant fewer-seqs: settled after 1 run(s), 3 not needed" in res.stderr


def test_vary_usage_errors(tmp_path):
    b = make_bundle(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[variant]]\nname = "x"\nadd = "--enforce-eager"\n')
    verify = ["bundle", "verify", b, "--out", tmp_path / "v"]
    assert_one_line_error(
        run(*verify, "--target", "http://127.0.0.1:1", "--vary", "default"),
        "--vary relaunches the server with each variant: give --launch",
    )
    assert_one_line_error(
        run(*verify, "--launch", emulator(), "--vary", bad),
        f"--vary {bad}: variant 1 (x): 'add' must be a list of non-empty strings",
    )
    assert_one_line_error(
        run(*verify, "--launch", emulator(), "--vary-runs", "3"), "--vary-runs needs --vary"
    )
    trace = tmp_path / "t.arrow"
    bisect = ["bisect", trace, "--out", tmp_path / "b"]
    assert_one_line_error(
        run(*bisect, "--restart-cmd", "true", "--url", "http://127.0.0.1:1", "--vary", "default"),
        "--vary relaunches the server",
    )
    assert_one_line_error(
        run(*bisect, "--launch", "vllm serve m", "--vary", "default:enforce-eager,nope"),
        "--vary default:enforce-eager,nope: no shipped variant nope; have no-speculative-decoding",
    )
    assert_one_line_error(
        run(*bisect, "--launch", "vllm serve m", "--vary", "default", "--vary-runs", "0"),
        "--vary-runs must be at least 1",
    )
    assert not (tmp_path / "b").exists()  # refused before anything was made
