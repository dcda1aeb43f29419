"""Make the synthetic Granite model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/granite-q8_0.gguf: `general.architecture = granite`, 2 layers,
  n_embd 128, 4 heads over 2 KV heads (head size 32), n_ff 256, the tokenizer of
  llama-bpe-q5_1-tied.gguf (512 tokens), Granite's four multipliers set to
  values a mistake in any of them shows, seeded random weights: 2-D tensors in
  Q8_0 (gguf's quantizer), norms in F32, a separate output.weight;
* tests/data/golden/synth/granite-q8_0.json: llama.cpp's logits over the
  prompts of llama-bpe-q5_1-tied.json (the recorder of make_iq_synth.py).

    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_granite.py [--no-golden]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_iq_synth  # noqa: E402  (the golden recorder)

ROOT = Path(__file__).resolve().parent.parent
SYNTH = ROOT / "tests" / "data" / "synth"
GOLDEN = ROOT / "tests" / "data" / "golden" / "synth"
TOKENIZER_FROM = SYNTH / "llama-bpe-q5_1-tied.gguf"
PROMPTS_FROM = GOLDEN / "llama-bpe-q5_1-tied.json"
MODEL = SYNTH / "granite-q8_0.gguf"
MODEL_GOLDEN = GOLDEN / "granite-q8_0.json"

ARCH = "granite"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = N_EMBD // N_HEAD
SEED = 20250311

# Granite 3.x's values are of this kind (embedding 12, residual 0.22, attention 1/64 = 0.015625,
# logits 8).  With a head size of 32, 1/64 is far from 1/sqrt(32) = 0.177.
SCALES = {"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.015625, "logit_scale": 8.0}

# Standard deviations of the random weights.  q and k are large enough that the
# scores (q.k / 64) spread by about one, so the attention scale and RoPE matter;
# the output is large enough that the logits (divided by 8) spread by about one.
STD = {"token_embd": 0.1, "output": 0.7, "attn_q": 0.3, "attn_k": 0.3, "attn_v": 0.09, "attn_output": 0.09,
       "ffn_gate": 0.09, "ffn_up": 0.09, "ffn_down": 0.0625}


def tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in llama.cpp's usual file order."""
    def mat(kind: str, n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * STD[kind]).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32)

    n_vocab, kv_dim = 512, N_HEAD_KV * HEAD_DIM
    out = [("token_embd.weight", mat("token_embd", n_vocab, N_EMBD)),
           ("output_norm.weight", norm()),
           ("output.weight", mat("output", n_vocab, N_EMBD))]
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", norm()),
                (p + "attn_q.weight", mat("attn_q", N_EMBD, N_EMBD)),
                (p + "attn_k.weight", mat("attn_k", kv_dim, N_EMBD)),
                (p + "attn_v.weight", mat("attn_v", kv_dim, N_EMBD)),
                (p + "attn_output.weight", mat("attn_output", N_EMBD, N_EMBD)),
                (p + "ffn_norm.weight", norm()),
                (p + "ffn_gate.weight", mat("ffn_gate", N_FF, N_EMBD)),
                (p + "ffn_up.weight", mat("ffn_up", N_FF, N_EMBD)),
                (p + "ffn_down.weight", mat("ffn_down", N_EMBD, N_FF))]
    return out


def write_model(path: Path) -> None:
    source = GGUFReader(TOKENIZER_FROM)
    writer = GGUFWriter(path, ARCH)
    writer.add_name("synthetic-granite")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(512)
    writer.add_embedding_scale(SCALES["embedding_scale"])
    writer.add_residual_scale(SCALES["residual_scale"])
    writer.add_attention_scale(SCALES["attention.scale"])
    writer.add_logit_scale(SCALES["logit_scale"])
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q8_0))
    for key, field in source.fields.items():          # the tokenizer, with its value types
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for name, data in tensors(np.random.default_rng(SEED)):
        if data.ndim == 2:
            q8 = quants.quantize(data, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q8, raw_shape=q8.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def record_golden(model: Path, out: Path) -> None:
    """make_iq_synth's recorder, over the prompts of llama-bpe-q5_1-tied.json."""
    make_iq_synth.TEMPLATE_GOLDEN = PROMPTS_FROM
    make_iq_synth.record_golden(model, out)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-golden", action="store_true", help="only write the model")
    args = parser.parse_args(argv)
    write_model(MODEL)
    print(f"{MODEL.name}: {MODEL.stat().st_size} B")
    if not args.no_golden:
        record_golden(MODEL, MODEL_GOLDEN)
        print(f"-> {MODEL_GOLDEN.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
