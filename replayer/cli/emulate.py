"""``replayer emulate``: run the vLLM emulator (the embedded default target).

Options mirror ``vllm serve`` where vLLM has them; the fault grammar is in
:mod:`replayer.emulator.faults`. A bad option or fault spec is one line on
stderr and exit code 2, before the port is bound.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

EPILOG = """\
fault examples:
  --fault 'exit when prompt_tokens>=200000'
  --fault 'exit code=1 gpu=cuda when request=3 and running>=2 p=0.5 delay=1.5'
  --fault 'dead when cached_tokens>=4096 and turn>=3'
  --fault 'hang when session=2' --fault 'cut kill=1 when request=10'
  --fault 'slow factor=20 when kv_usage>=0.5' --fault 'error when request>=1 p=0.1 times=0'
effects: exit [code gpu after], dead [gpu], hang [warn_every timeout code],
  cut [scope kill], slow [factor add duration], error
variables: request prompt_tokens cached_tokens running waiting kv_usage session turn preemption
environment: VLLM_SERVER_DEV_MODE=1 (dev endpoints), VLLM_API_KEY,
  VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 (exit faults leave the API up)
"""


def register(sub: Any, argv: Sequence[str] = ()) -> None:
    from replayer.emulator.config import add_arguments

    p = sub.add_parser(
        "emulate",
        help="run the vLLM emulator with fault injection",
        description="Serve an emulated vLLM OpenAI-compatible API (chat, completions, "
        "health, metrics, tokenize) with a simulated engine and injected faults.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=cmd_emulate)


def cmd_emulate(args: argparse.Namespace) -> int:
    from replayer import api
    from replayer.emulator.config import config_from_args

    return api.emulate(config_from_args(args))
