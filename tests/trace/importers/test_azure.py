"""Azure LLM inference trace 2023 importer on both real Splitwise CSVs, checked
against an independent reading of the files (csv + Decimal timestamps)."""

from __future__ import annotations

import csv
import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest

from replayer.trace import Trace
from replayer.trace.stats import inspect_trace
from tests.helpers.importers import (
    assert_import_fails,
    garbage_file,
    import_trace,
    inspect_cli,
    tail_tokens,
    truncated_file,
    truncated_gzip,
)

CONV = "AzureLLMInferenceTrace_conv"
CODE = "AzureLLMInferenceTrace_code"


def read_csv(path: Path) -> list[tuple[Decimal, int, int]]:
    """(seconds since the epoch as an exact Decimal, context, generated)."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    out = []
    for ts, ctx, gen in rows[1:]:
        whole, frac = ts.split(".")
        assert len(frac) == 7  # the README's 7 fractional digits
        secs = dt.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
        out.append((Decimal(int(secs.timestamp())) + Decimal("0." + frac), int(ctx), int(gen)))
    return out


def expected_us(ts: Decimal, origin: Decimal) -> int:
    us = (ts - origin) * 1_000_000
    assert us == us.to_integral_value()  # the 100 ns digit is 0 throughout: exact
    return int(us)


@pytest.fixture(scope="module")
def data(shared_data: Path) -> dict[str, tuple[Path, list[tuple[Decimal, int, int]]]]:
    d = shared_data / "azure_llm_2023"
    return {n: (d / f"{n}.csv", read_csv(d / f"{n}.csv")) for n in (CONV, CODE)}


@pytest.fixture(scope="module")
def conv(data, tmp_path_factory) -> Trace:
    return import_trace("azure", [data[CONV][0]], tmp_path_factory.mktemp("az") / "conv.arrow")


def check_all(
    t: Trace, stem: str, rows: list[tuple[Decimal, int, int]], origin: Decimal, stride: int
) -> None:
    """Every row's ids, timing, lengths and everything its body is made of (no
    block ids, the prompt length, the exact params); whole bodies token for
    token on every ``stride``-th row (a body costs ~0.5 ms to build)."""
    c = t.column
    for i, (ts, ctx, gen) in enumerate(rows):
        rid = f"{stem}-{i:06d}"
        r = t.row_of(rid)
        assert (c("session_id")[r], c("turn")[r]) == (rid, 0)
        assert c("start_us")[r] == expected_us(ts, origin)
        assert c("end_us")[r] is None
        assert (c("kind")[r], c("block_size")[r], c("path")[r]) == ("blocks", 16, "/v1/completions")
        assert (c("input_tokens")[r], c("max_tokens")[r]) == (ctx, gen)
        assert t.content(r) == []
        assert t.params_text(r) == f'{{"prompt":null,"max_tokens":{gen},"ignore_eos":true}}'
        if i % stride == 0:
            assert t.body(r) == {
                "prompt": tail_tokens(rid, ctx),
                "max_tokens": gen,
                "ignore_eos": True,
            }
            out = t.outcome(r)
            assert (out["usage_prompt_tokens"], out["usage_completion_tokens"]) == (ctx, gen)


@pytest.mark.inprocess
def test_conv_every_request(conv, data):
    rows = data[CONV][1]
    assert len(conv) == len(rows) == 19_366  # README
    assert conv.tokens.lo == 10_000 and conv.tokens.hi == 32_000 and conv.tokens.salt == "replayer"
    check_all(conv, CONV, rows, rows[0][0], stride=10)
    # file order is trace order (the CSV is ascending)
    assert conv.order == list(range(len(rows)))


def test_conv_inspect_matches_source_and_readme(conv, data):
    rows = data[CONV][1]
    for info in (inspect_trace(conv), inspect_cli(conv.path)):
        assert info["requests"] == 19_366
        assert info["sessions"] == 19_366  # each request its own session
        assert info["input_tokens"]["max"] == max(r[1] for r in rows) == 14_050  # README
        assert info["input_tokens"]["min"] == min(r[1] for r in rows) == 2  # README
        assert info["max_tokens"]["max"] == max(r[2] for r in rows) == 1_000  # README
        assert info["duration_s"] == expected_us(rows[-1][0], rows[0][0]) / 1e6
        assert round(info["duration_s"]) == 3_502  # README: 3,502 s span
        assert info["kinds"] == {"blocks": 19_366}
        assert info["provenance"]["source"] == "import:azure"
        assert info["provenance"]["block_size"] == 16


@pytest.mark.inprocess
def test_code_every_request(data, tmp_path):
    src, rows = data[CODE]
    t = import_trace("azure", [src], tmp_path / "code.arrow", "--block-size", "32", "--model", "m")
    assert len(t) == 8_819  # README
    assert inspect_trace(t)["input_tokens"]["max"] == max(r[1] for r in rows) == 7_437
    assert round(inspect_trace(t)["duration_s"]) == 3_436  # README
    assert set(t.column("block_size")) == {32}
    for i in range(0, len(rows), 50):
        ts, ctx, gen = rows[i]
        r = t.row_of(f"{CODE}-{i:06d}")
        assert t.body(r) == {
            "model": "m",
            "prompt": tail_tokens(f"{CODE}-{i:06d}", ctx),
            "max_tokens": gen,
            "ignore_eos": True,
        }
        assert t.column("start_us")[r] == expected_us(ts, rows[0][0])


@pytest.mark.inprocess
def test_two_files_share_one_clock(data, tmp_path):
    conv_src, conv_rows = data[CONV]
    code_src, code_rows = data[CODE]
    t = import_trace("azure", [code_src, conv_src], tmp_path / "both.arrow")
    assert len(t) == 19_366 + 8_819
    origin = min(conv_rows[0][0], code_rows[0][0])
    assert origin == conv_rows[0][0]  # conv starts at 18:15:46, code at 18:17:03
    c = t.column
    first_code = t.row_of(f"{CODE}-000000")
    assert c("start_us")[first_code] == expected_us(code_rows[0][0], origin) == 77_299_370
    assert c("start_us")[t.row_of(f"{CONV}-000000")] == 0
    # trace order interleaves the two files by arrival time
    starts = [c("start_us")[r] for r in t.order]
    assert starts == sorted(starts)
    assert len({c("session_id")[r] for r in range(len(t))}) == len(t)


@pytest.mark.inprocess
def test_timestamps_parse_exactly(tmp_path):
    src = tmp_path / "mini.csv"
    src.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 23:59:59.9999995,3,1\n"
        "2023-11-17 00:00:00.0000004,0,2\n"
        "2023-11-17 00:00:01.1234567,5,3\n"
        "2023-11-17 00:00:02,7,4\n"
    )
    t = import_trace("azure", [src], tmp_path / "mini.arrow")
    # integer nanoseconds, rounded half up to the microsecond only at the end
    assert t.column("start_us") == [0, 1, 1_123_457, 2_000_001]
    assert t.body(1) == {"prompt": [], "max_tokens": 2, "ignore_eos": True}
    assert t.column("request_id") == [f"mini-{i:06d}" for i in range(4)]


@pytest.mark.inprocess
def test_wrong_format_and_bad_input(shared_data, data, tmp_path):
    mooncake = shared_data / "mooncake" / "conversation_trace.jsonl.gz"
    assert_import_fails("azure", mooncake, tmp_path, "not an Azure", ":1:")
    tau = shared_data / "tau_bench" / "gpt-4o-airline.json.gz"
    assert_import_fails("azure", tau, tmp_path, "header")
    assert_import_fails("azure", garbage_file(tmp_path), tmp_path, "not")
    # cut in the middle of row 100's timestamp
    text = data[CONV][0].read_bytes()
    cut = sum(len(line) for line in text.splitlines(keepends=True)[:101]) + 12
    bad = tmp_path / "cut.csv"
    bad.write_bytes(text[:cut])
    assert_import_fails("azure", bad, tmp_path, ":102:", "has 1 of the 3 fields")
    assert_import_fails("azure", truncated_gzip(data[CONV][0], tmp_path), tmp_path, "not")
    assert_import_fails(
        "azure", truncated_file(data[CONV][0], tmp_path, 0, "empty.csv"), tmp_path, "empty"
    )
    fields = tmp_path / "fields.csv"
    fields.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1\n")
    assert_import_fails("azure", fields, tmp_path, ":2:", "has 2 of the 3 fields")
