"""Make the synthetic fill-in-the-middle model: a tiny code model's vocabulary and keys.

Writes tests/data/fim/llama-fim-q8_0.gguf (beside, not among, the parity models of
tests/data/synth: it has no llama.cpp golden): `general.architecture = llama`, 2 layers,
n_embd 64, 4 heads over 2 KV heads, n_ff 128, seeded random weights (2-D tensors in
Q8_0, norms in F32), and the tokenizer of llama-bpe-q5_1-tied.gguf (512 tokens) with
Qwen2.5-Coder's six FIM tokens appended as control tokens (ids 512-517:
<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>, <|fim_pad|>, <|repo_name|>,
<|file_sep|>) and named by the `tokenizer.ggml.fim_*_token_id` keys, as
convert_hf_to_gguf.py writes them for Qwen2.5-Coder; a short ChatML chat template
that shows the tools (so the model lists `completion`, `tools` and `insert`, not
`thinking`). No golden file: the tests read its prompts, not its numbers.

    python scripts/make_synth_fim.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

import synth_common as common

STEM = "llama-fim-q8_0"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 64, 2, 4, 2, 128
HEAD_DIM = N_EMBD // N_HEAD
SEED = 20261201
FIM_TOKENS = (("fim_pre", "<|fim_prefix|>"), ("fim_suf", "<|fim_suffix|>"), ("fim_mid", "<|fim_middle|>"),
              ("fim_pad", "<|fim_pad|>"), ("fim_rep", "<|repo_name|>"), ("fim_sep", "<|file_sep|>"))
CONTROL = 3   # tokenizer.ggml.token_type of a control token
STD = {"token_embd": 0.1, "output": 0.5, "attn_q": 0.2, "attn_k": 0.2, "attn_v": 0.1, "attn_output": 0.1,
       "ffn_gate": 0.1, "ffn_up": 0.1, "ffn_down": 0.08}

# ChatML with the tools listed in the system turn (the shape of Qwen2.5's, shortened).
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "Reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message.role == 'system') %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_model(path: Path) -> None:
    source = common.read_tokenizer_source()
    tokens = list(source.fields["tokenizer.ggml.tokens"].contents())
    types = list(source.fields["tokenizer.ggml.token_type"].contents())
    fim_ids = {name: len(tokens) + i for i, (name, _) in enumerate(FIM_TOKENS)}
    tokens += [text for _, text in FIM_TOKENS]
    types += [CONTROL] * len(FIM_TOKENS)

    writer = common.start_model(path, "llama", name="synthetic-llama-fim", n_layer=N_LAYER, n_ctx=4096,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(7)  # MOSTLY_Q8_0
    for key, field in source.fields.items():
        if not key.startswith("tokenizer.") or key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            continue
        value_type = field.types[0]
        element_type = field.types[1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), value_type, sub_type=element_type)
    writer.add_key_value("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    writer.add_key_value("tokenizer.ggml.token_type", types, GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
    for name, token_id in fim_ids.items():
        writer.add_uint32(f"tokenizer.ggml.{name}_token_id", token_id)
    writer.add_chat_template(CHAT_TEMPLATE)

    weights = common.RandomWeights(np.random.default_rng(SEED), STD)
    tensors = common.llama_tensors(weights, n_vocab=len(tokens), n_embd=N_EMBD, n_layer=N_LAYER, q_dim=N_EMBD,
                                   kv_dim=N_HEAD_KV * HEAD_DIM, n_ff=N_FF)
    common.add_q8_0_tensors(writer, tensors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    model = common.ROOT / "tests" / "data" / "fim" / f"{STEM}.gguf"
    model.parent.mkdir(parents=True, exist_ok=True)
    write_model(model)
    print(f"{model.relative_to(common.ROOT)}: {model.stat().st_size} B")
    sys.exit(0)
