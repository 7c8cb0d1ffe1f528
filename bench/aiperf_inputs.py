"""Make the AIPerf fixture of ``tests/trace/importers/test_aiperf_payloads.py``
with AIPerf 0.13 itself: the ``inputs.json`` an AIPerf run writes, and the
bodies AIPerf sends when it replays that file.

``python -m bench aiperf_inputs`` (on request: installs AIPerf into
``bench/.venv-aiperf`` when missing, ~1.2 GB, and runs it twice, ~1 min)

1. ``aiperf profile`` with a synthetic multi-turn workload (3 conversations
   of 3 turns, chat, streaming) against the emulator: AIPerf writes
   ``inputs.json`` into its artifact directory.
2. ``aiperf profile --custom-dataset-type inputs_json`` replays that file
   against a fresh emulator that logs every body it receives: those are
   ``sent.jsonl``, in arrival order (one request in flight).

Both land in ``tests/trace/data/aiperf-0.13/``. What it measured: whether
AIPerf's replay sent the file's payloads verbatim and in file order, and
how run 1's bodies differ from its own ``inputs.json`` (AIPerf threads live
replies into synthetic multi-turn conversations; the file holds the deltas).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.replay import AIPERF_VENV, ensure_aiperf
from replayer.testing.emulator import EmulatorProcess

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "trace" / "data" / "aiperf-0.13"
MODEL = "mock-model"
COMMON = ["--ui-type", "none", "--no-gpu-telemetry", "--no-server-metrics", "--streaming"]


def _bodies(emu: EmulatorProcess) -> list[Any]:
    return [e["body"] for e in emu.read_request_log() if e["event"] == "request"]


def main(argv: list[str]) -> dict[str, Any]:
    ap = ensure_aiperf(install=True)
    if not ap.ok or ap.exe is None or ap.tokenizer is None:
        print(f"AIPerf unavailable: {ap.reason}", file=sys.stderr)
        return {"ok": False, "reason": ap.reason}
    base = [str(ap.exe), "profile", "--model", MODEL, "--endpoint-type", "chat"]
    base += ["--tokenizer", str(ap.tokenizer), *COMMON]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with EmulatorProcess(["--speed", "instant", "--served-model-name", MODEL],
                             log_bodies=True) as first:  # fmt: skip
            synth = ["--conversation-num", "3", "--conversation-turn-mean", "3",
                     "--conversation-turn-stddev", "0", "--synthetic-input-tokens-mean", "40",
                     "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", "6",
                     "--output-tokens-stddev", "0", "--concurrency", "1", "--request-count",
                     "9", "--random-seed", "7"]  # fmt: skip
            cmd = [*base, "--url", first.url, *synth, "--output-artifact-dir", str(tmp / "a")]
            subprocess.run(cmd, check=True, capture_output=True, env=ap.env(), timeout=300)
            run1 = _bodies(first)
        inputs = tmp / "a" / "inputs.json"
        with EmulatorProcess(["--speed", "instant", "--served-model-name", MODEL],
                             log_bodies=True) as second:  # fmt: skip
            cmd = [*base, "--url", second.url, "--input-file", str(inputs),
                   "--custom-dataset-type", "inputs_json", "--concurrency", "1",
                   "--request-count", "9", "--output-artifact-dir", str(tmp / "b")]  # fmt: skip
            subprocess.run(cmd, check=True, capture_output=True, env=ap.env(), timeout=300)
            sent = _bodies(second)
        OUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(inputs, OUT / "inputs.json")
        (OUT / "sent.jsonl").write_text("".join(json.dumps(b) + "\n" for b in sent))
    payloads = [p for s in json.loads((OUT / "inputs.json").read_text())["data"]
                for p in s["payloads"]]  # fmt: skip
    figures = {
        "aiperf": ap.version or str(AIPERF_VENV),
        "payloads": len(payloads),
        "sent": len(sent),
        "replay_sent_the_payloads_verbatim_in_order": payloads == sent,
        "run1_messages_per_request": [len(b["messages"]) for b in run1],
        "inputs_json_messages_per_payload": [len(p["messages"]) for p in payloads],
    }
    print(json.dumps(figures, indent=2))
    return figures
