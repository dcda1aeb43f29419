"""Make the synthetic SmolLM3 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/smollm3-q8_0.gguf: GGUF architecture `smollm3`, 4 layers
  (layer 3 is SmolLM3's NoPE layer: llama.cpp skips RoPE where (il + 1) % 4 == 0),
  n_embd 128, 4 heads of 32, 2 KV heads, n_ff 256, context 4096, RoPE base
  5e6 (SmolLM3-3B's), RMS eps 1e-6; seeded random weights, the matrices
  quantized to Q8_0 by gguf-py, the norms F32 around 1; no output.weight
  (SmolLM3 ties its output to the token embedding); the tokenizer metadata
  (every tokenizer.* key) of llama-bpe-q5_1-tied.gguf, a 512-token BPE vocab;
* tests/data/golden/synth/smollm3-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json, recorded by make_iq_synth.py's
  recorder (same schema as every golden file).

    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_smollm3.py [--no-record]
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
TOKENIZER_SOURCE = SYNTH / "llama-bpe-q5_1-tied.gguf"
PROMPTS = GOLDEN / "llama-bpe-q5_1-tied.json"
NAME = "smollm3-q8_0"
ARCH = "smollm3"

SEED = 20250708
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 128, 4, 4, 2, 256, 4096
HEAD_DIM = N_EMBD // N_HEAD
ROPE_BASE = 5_000_000.0
EPS = 1e-6
STD = 0.1            # q/k/v/o, gate, up, embedding: unit-RMS inputs give O(1) activations and scores
STD_DOWN = 0.0625    # 1 / sqrt(n_ff)
STD_NORM = 0.1       # norm weights: 1 + this * N(0, 1)


def tokenizer_fields(reader: GGUFReader):
    """(key, value, type, sub_type) of every tokenizer.* key of the source, in its order."""
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
            yield key, field.contents(), vtype, sub_type


def random_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """float32 weights in numpy order ([out, in]), in llama.cpp's tensor order."""
    rng = np.random.default_rng(SEED)

    def mat(rows: int, cols: int, std: float = STD) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm(n: int = N_EMBD) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * STD_NORM).astype(np.float32)

    w = {"token_embd.weight": mat(n_vocab, N_EMBD), "output_norm.weight": norm()}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm()
        w[p + "attn_q.weight"] = mat(N_HEAD * HEAD_DIM, N_EMBD)
        w[p + "attn_k.weight"] = mat(N_HEAD_KV * HEAD_DIM, N_EMBD)
        w[p + "attn_v.weight"] = mat(N_HEAD_KV * HEAD_DIM, N_EMBD)
        w[p + "attn_output.weight"] = mat(N_EMBD, N_HEAD * HEAD_DIM)
        w[p + "ffn_norm.weight"] = norm()
        w[p + "ffn_gate.weight"] = mat(N_FF, N_EMBD)
        w[p + "ffn_up.weight"] = mat(N_FF, N_EMBD)
        w[p + "ffn_down.weight"] = mat(N_EMBD, N_FF, STD_DOWN)
    return w


def write_model(path: Path) -> None:
    src = GGUFReader(TOKENIZER_SOURCE)
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    writer = GGUFWriter(path, ARCH)
    writer.add_name("synthetic-smollm3")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q8_0))
    for key, value, vtype, sub_type in tokenizer_fields(src):
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, data in random_weights(n_vocab).items():
        if data.ndim == 2:
            q = quants.quantize(data, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def record(model: Path, out: Path) -> None:
    """make_iq_synth's recorder over the prompts of llama-bpe-q5_1-tied.json."""
    make_iq_synth.TEMPLATE_GOLDEN = PROMPTS   # the recorder takes its prompts from this file
    make_iq_synth.record_golden(model, out)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-record", action="store_true", help="only write the model")
    args = parser.parse_args(argv)
    model, golden = SYNTH / f"{NAME}.gguf", GOLDEN / f"{NAME}.json"
    write_model(model)
    print(f"{model.relative_to(ROOT)}: {model.stat().st_size} B")
    if not args.no_record:
        record(model, golden)
        print(f"{golden.relative_to(ROOT)}: recorded with llama.cpp")


if __name__ == "__main__":
    main(sys.argv[1:])
