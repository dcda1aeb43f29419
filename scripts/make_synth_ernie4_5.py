"""Make the synthetic ERNIE 4.5 (dense) model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/ernie4_5-q8_0.gguf: `general.architecture = ernie4_5`, 2 layers,
  n_embd 128, 4 heads over 2 KV heads with a head size of 64 set by
  `attention.key_length` (so q is 256 wide, twice n_embd, as in ERNIE-4.5-0.3B:
  16 heads of 128 over n_embd 1024), n_ff 256, RoPE base 5e5 and RMS eps 1e-5
  (the 0.3B model's), the tokenizer of llama-bpe-q5_1-tied.gguf (512 tokens);
  seeded random weights: 2-D tensors in Q8_0 (gguf's quantizer), norms in F32
  around 1; no output.weight (the 0.3B model ties its output to the token
  embedding, and llama.cpp then multiplies by token_embd);
* tests/data/golden/synth/ernie4_5-q8_0.json: llama.cpp's logits over the
  prompts of llama-bpe-q5_1-tied.json (the recorder of make_iq_synth.py), from
  llama-cpp-python's AVX-512 build (0.3.36), the build the golden files of
  tests/model_parity.py come from and pyengine's avx512 table follows bit for bit.

The golden file is recorded with llama.cpp's extra buffer types off (AMX and
repacked weights: with them that build crashes on an AMX host).  So recorded,
the Q8_0 and Q6_K golden files made before (qwen2-q8_0, llama-wide-q8_0,
llama-wide-q6_k) come out the same, every logit of them.
An AVX2-only build of llama.cpp sums some products in other lanes: on the
301-token prompt one rounding comes out otherwise at position 64 and the KV
cache carries it on (last-position top-10 0.029 apart; pyengine's avx2 table
follows that build bit for bit instead).

    python scripts/make_synth_ernie4_5.py [--no-golden]
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
MODEL = SYNTH / "ernie4_5-q8_0.gguf"
MODEL_GOLDEN = GOLDEN / "ernie4_5-q8_0.json"

ARCH = "ernie4_5"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = 64                 # attention.key_length: not n_embd / n_head (= 32)
ROPE_BASE, EPS = 500000.0, 1e-5
SEED = 3                      # of 8 tried, the widest margins on the tables not bit-exact here (scalar, avx2)

# Standard deviations of the random weights.  The block inputs are RMS-normed, so
# q and k entries come out near 0.1 * sqrt(128) = 1.1 and the scores (q.k / 8 over
# 64 values) spread by about one: attention is far from uniform, and RoPE's layout
# and base matter.  The tied embedding also makes the logits: 0.15 * sqrt(128) = 1.7.
STD = {"token_embd": 0.15, "attn_q": 0.1, "attn_k": 0.1, "attn_v": 0.1, "attn_output": 0.0625,
       "ffn_gate": 0.1, "ffn_up": 0.1, "ffn_down": 0.0625}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in llama.cpp's usual file order."""
    def mat(kind: str, n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * STD[kind]).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32)

    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    out = [("token_embd.weight", mat("token_embd", n_vocab, N_EMBD)),
           ("output_norm.weight", norm())]
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", norm()),
                (p + "attn_q.weight", mat("attn_q", q_dim, N_EMBD)),
                (p + "attn_k.weight", mat("attn_k", kv_dim, N_EMBD)),
                (p + "attn_v.weight", mat("attn_v", kv_dim, N_EMBD)),
                (p + "attn_output.weight", mat("attn_output", N_EMBD, q_dim)),
                (p + "ffn_norm.weight", norm()),
                (p + "ffn_gate.weight", mat("ffn_gate", N_FF, N_EMBD)),
                (p + "ffn_up.weight", mat("ffn_up", N_FF, N_EMBD)),
                (p + "ffn_down.weight", mat("ffn_down", N_EMBD, N_FF))]
    return out


def write_model(path: Path) -> None:
    source = GGUFReader(TOKENIZER_FROM)
    n_vocab = len(source.fields["tokenizer.ggml.tokens"].contents())
    writer = GGUFWriter(path, ARCH)
    writer.add_name("synthetic-ernie4_5")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q8_0))
    for key, field in source.fields.items():          # the tokenizer, with its value types
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for name, data in tensors(np.random.default_rng(SEED), n_vocab):
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
    """make_iq_synth's recorder, over the prompts of llama-bpe-q5_1-tied.json,
    with llama.cpp's extra buffer types off."""
    import llama_cpp.llama_cpp as lib   # Llama() takes its model parameters from here

    defaults = lib.llama_model_default_params

    def model_params():
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = model_params
    make_iq_synth.TEMPLATE_GOLDEN = PROMPTS_FROM
    try:
        make_iq_synth.record_golden(model, out)
    finally:
        lib.llama_model_default_params = defaults


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
