"""Build a tiny offline tokenizer directory that ``AutoTokenizer.from_pretrained``
loads without the network (AIPerf needs one; its ``builtin`` tokenizer
downloads a tiktoken file).

Run with the AIPerf venv's Python (it has ``tokenizers`` and ``transformers``)::

    bench/.venv-aiperf/bin/python bench/aiperf_support/mktok.py OUT_DIR

A byte-level BPE trained on a few KB of generated text, saved through
``PreTrainedTokenizerFast.save_pretrained`` so the directory has the files
transformers expects (tokenizer.json, tokenizer_config.json,
special_tokens_map.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

WORDS = (
    "the of and to in is was for on that with as by at from it an be this are or have "
    "not which but one were all their has been more would when there can will if into "
    "other about time only new some could these two may first then do any like my now "
    "over such our man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too "
    "hi hello request model token stream server replay trace session turn prompt reply"
).split()


def corpus() -> list[str]:
    lines = []
    for i in range(400):
        words = [WORDS[(i * 7 + k * 13) % len(WORDS)] for k in range(12)]
        lines.append(" ".join(words) + f" {i}.")
    return lines


def main(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: mktok.py OUT_DIR")
    main(Path(sys.argv[1]))
