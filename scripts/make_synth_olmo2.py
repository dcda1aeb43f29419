"""Make the synthetic OLMo 2 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/olmo2-q8_0.gguf: GGUF architecture `olmo2` with the
  tokenizer of llama-bpe-q5_1-tied.gguf (512 tokens, every tokenizer.* key),
  n_embd 128, 2 layers, 4 query heads over 2 key/value heads (so the key norm,
  over kv_dim = 64 values, is narrower than the query norm over 128), n_ff 256,
  context 4096, rope base 500000 (OLMo 2's), RMS epsilon 1e-6, no
  rope.dimension_count (llama.cpp ropes whole heads), seeded random weights:
  matrices (Q8_0) about 1/sqrt(fan-in), embeddings 0.5, norms 1 +- 0.1 (F32),
  and a separate output.weight (llama.cpp's olmo2 requires one);
* with --record, tests/data/golden/synth/olmo2-q8_0.json: llama.cpp's outputs
  over the prompts of the other synthetic golden files, by make_iq_synth's
  recorder (which needs llama-cpp-python):

    python scripts/make_synth_olmo2.py
    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_olmo2.py --record
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

ROOT = Path(__file__).resolve().parent.parent
SYNTH = ROOT / "tests" / "data" / "synth"
GOLDEN = ROOT / "tests" / "data" / "golden" / "synth"
TOKENIZER_SOURCE = SYNTH / "llama-bpe-q5_1-tied.gguf"
PROMPTS_SOURCE = GOLDEN / "llama-bpe-q5_1-tied.json"
MODEL = SYNTH / "olmo2-q8_0.gguf"
MODEL_GOLDEN = GOLDEN / "olmo2-q8_0.json"

ARCH = "olmo2"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = N_EMBD // N_HEAD
N_CTX, ROPE_BASE, EPS = 4096, 500000.0, 1e-6
SEED = 20250201


def copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> None:
    """Every tokenizer.* key with its value types."""
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub_type = field.types[1] if vtype == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)


def weights(n_vocab: int) -> dict[str, np.ndarray]:
    """Float32 tensors in numpy order ([out, in]), in llama.cpp's conversion order."""
    rng = np.random.default_rng(SEED)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        return rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)

    def norm(n: int) -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(n)

    w = {"token_embd.weight": 0.5 * rng.standard_normal((n_vocab, N_EMBD)),
         "output_norm.weight": norm(N_EMBD),
         "output.weight": 1.1 * matrix(n_vocab, N_EMBD)}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.update({p + "attn_q.weight": matrix(q_dim, N_EMBD),
                  p + "attn_k.weight": matrix(kv_dim, N_EMBD),
                  p + "attn_v.weight": matrix(kv_dim, N_EMBD),
                  p + "attn_output.weight": matrix(N_EMBD, q_dim),
                  p + "post_attention_norm.weight": norm(N_EMBD),
                  p + "attn_q_norm.weight": norm(q_dim),
                  p + "attn_k_norm.weight": norm(kv_dim),
                  p + "post_ffw_norm.weight": norm(N_EMBD),
                  p + "ffn_gate.weight": matrix(N_FF, N_EMBD),
                  p + "ffn_down.weight": matrix(N_EMBD, N_FF),
                  p + "ffn_up.weight": matrix(N_FF, N_EMBD)})
    return {name: t.astype(np.float32) for name, t in w.items()}


def write_model(path: Path) -> None:
    writer = GGUFWriter(path, ARCH)
    writer.add_name("synthetic-olmo2")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    tokenizer = GGUFReader(TOKENIZER_SOURCE)
    n_vocab = len(tokenizer.fields["tokenizer.ggml.tokens"].contents())
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q8_0))
    copy_tokenizer(tokenizer, writer)
    for name, t in weights(n_vocab).items():
        if t.ndim == 2:   # the writer takes the byte shape (rows, row bytes) of a quantized tensor
            data = quants.quantize(t, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def record(model: Path, out: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_iq_synth   # its recorder: llama.cpp through llama-cpp-python

    want = [c["ids"] for c in json.loads(PROMPTS_SOURCE.read_text(encoding="utf-8"))["cases"]]
    used = [c["ids"] for c in json.loads(make_iq_synth.TEMPLATE_GOLDEN.read_text(encoding="utf-8"))["cases"]]
    assert used == want, "make_iq_synth records other prompts than llama-bpe-q5_1-tied.json's"
    make_iq_synth.record_golden(model, out)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="also record the golden file with llama.cpp")
    args = parser.parse_args(argv)
    write_model(MODEL)
    print(f"{MODEL.relative_to(ROOT)}: {MODEL.stat().st_size} B")
    if args.record:
        record(MODEL, MODEL_GOLDEN)
        print(f"{MODEL_GOLDEN.relative_to(ROOT)} recorded")


if __name__ == "__main__":
    main(sys.argv[1:])
