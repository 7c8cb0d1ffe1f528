"""Tiny models for real vLLM, built from code: ``python -m replayer.testing.vllm_models OUT``.

Runs in the vLLM environment (it needs ``torch``, ``transformers`` and
``tokenizers``; replayer's own environment has none of them). Nothing comes
from a hub: a byte-level BPE tokenizer of 8,192 ids is trained on the
interpreter's own standard library sources (a few MB, about two seconds),
and the models get random weights from a fixed seed, so two builds on one
machine are the same. Their output is noise; what matters is that vLLM runs
the real code paths: tokenization and chat templating, the scheduler, the
prefix cache, chunked prefill, and for ``dsv2`` the MLA attention and MoE
layers of the DeepSeek/Kimi family.

* ``llama``: ``LlamaForCausalLM``, 2 layers, hidden 128, 4 heads / 2 KV heads.
* ``dsv2``: ``DeepseekV2ForCausalLM``, 2 layers (the first dense), 4 routed
  experts + 1 shared, top-2 in one expert group, ``kv_lora_rank`` 512, rope
  64, nope 32, v 32 (smaller MLA dimensions start but die on the first
  request: "Head dimension 80 is not supported by MLA"; without ``n_group``
  and ``topk_group`` the CPU MoE router asserts on the first real batch).

The chat template renders string and list content, ``tools`` and assistant
``tool_calls``, so agent traces with tools are accepted as they are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VOCAB = 8192
SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
CHAT_TEMPLATE = """{{- bos_token }}
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Tools: {{ tools | tojson }}<|eot_id|>{% endif %}
{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>

{% if m['content'] is string %}{{ m['content'] }}{% elif m['content'] %}\
{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}\
{% endif %}
{%- if m.get('tool_calls') %}{% for c in m['tool_calls'] %}[{{ c['function']['name'] }}(\
{{ c['function']['arguments'] if c['function']['arguments'] is string \
else c['function']['arguments'] | tojson }})]{% endfor %}{% endif %}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""


def _corpus() -> Iterator[str]:
    stdlib = Path(os.__file__).parent
    for path in sorted(stdlib.glob("*.py"))[:200]:
        yield path.read_text(errors="replace")


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out: Path) -> None:
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer()
    ids = {
        "vocab_size": len(tok),
        "bos_token_id": tok.convert_tokens_to_ids("<|begin_of_text|>"),
        "eos_token_id": tok.convert_tokens_to_ids("<|eot_id|>"),
        "pad_token_id": tok.convert_tokens_to_ids("<|end_of_text|>"),
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    configs: dict[str, Any] = {
        "llama": (
            LlamaForCausalLM,
            LlamaConfig(
                hidden_size=128,
                intermediate_size=256,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                **ids,
            ),
        ),
        "dsv2": (
            DeepseekV2ForCausalLM,
            DeepseekV2Config(
                hidden_size=128,
                intermediate_size=256,
                moe_intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=4,
                n_routed_experts=4,
                n_shared_experts=1,
                num_experts_per_tok=2,
                # vLLM routes DeepSeek-V2 with grouped top-k and reads these:
                # left None, its CPU router asserts on the first real batch
                n_group=1,
                topk_group=1,
                first_k_dense_replace=1,
                kv_lora_rank=512,
                q_lora_rank=None,
                qk_rope_head_dim=64,
                qk_nope_head_dim=32,
                v_head_dim=32,
                **ids,
            ),
        ),
    }
    for name, (cls, config) in configs.items():
        torch.manual_seed(0)
        model = cls(config).to(torch.bfloat16)
        tmp = out / f".{name}.tmp"
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, out / name)  # a model directory is complete or absent


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m replayer.testing.vllm_models OUT", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    build(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
