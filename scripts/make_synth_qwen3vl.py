"""Make the synthetic Qwen3-VL model and record llama.cpp's image embeddings and
logits for it.

Writes

* tests/data/vision/qwen3vl-tiny.gguf: a small random text model (GGUF `qwen3vl`,
  3 layers of n_embd 64, 2 heads of 32 over 1 key/value head with q/k head norms,
  n_ff 128, interleaved M-RoPE sections 8/4/4/0 of 16 pairs - so, as in the real
  24/20/20 of 64, two pairs fall to the fourth stream - base 5e6, 2 deepstack
  layers) with the tokenizer of llama-bpe-q5_1-tied.gguf, matrices in Q8_0;
* tests/data/vision/qwen3vl-tiny.mmproj.gguf: a matching random mmproj (projector
  type qwen3vl_merger): 8-pixel patches, both frames' kernels and their bias, an 8x8
  grid of learned position embeddings (resized for any other patch grid), 3 blocks
  of width 32 (2 heads of 16, fused q/k/v, GELU MLP n_ff 64, LayerNorms with
  biases), deepstack mergers after blocks 0 and 2 (not 1), the merger's norm and
  mm.0 / mm.2 into 64: each image row 64 * 3 values; matrices and kernels in F16,
  norms, biases and positions in F32; mean/std other than 0.5;
* tests/data/vision/qwen3vl-tiny.png (64x64: the position grid as it is),
  qwen3vl-tiny-wide.png (48x176: 3x11 tokens, the grid resized) and
  qwen3vl-tiny-odd.png (100x150: resized to 96x144 and padded, as mtmd does);
* with --record (a Python with llama-cpp-python 0.3.36), qwen3vl-tiny.embd.json:
  for each image, libmtmd's embeddings, its token grid, the token ids of the text
  around it in PROMPT and the top-10 logits after the whole prompt
  (mtmd_helper_eval_chunks: M-RoPE positions, deepstack pieces), on 2 threads.

    python scripts/make_synth_qwen3vl.py
    <python with llama-cpp-python 0.3.36> scripts/make_synth_qwen3vl.py --record
    PYTHONPATH=<dir holding llama_cpp> python scripts/make_synth_qwen3vl.py --live 12
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth_qwenvl  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VISION_DIR = ROOT / "tests" / "data" / "vision"
STEM = "qwen3vl-tiny"
TEXT, MMPROJ, EMBD = (VISION_DIR / f"{STEM}{ext}" for ext in (".gguf", ".mmproj.gguf", ".embd.json"))
# name: (height, width, seed)
IMAGES = {"square": (64, 64, 60), "wide": (48, 176, 61), "odd": (100, 150, 62)}

N_EMBD_TEXT, N_LAYER_TEXT, N_HEAD_TEXT, N_HEAD_KV_TEXT, HEAD_DIM_TEXT, N_FF_TEXT = 64, 3, 2, 1, 32, 128
SECTIONS = (8, 4, 4, 0)
N_DEEPSTACK = 2
PATCH, N_EMBD_V, N_HEAD_V, N_FF_V, N_LAYER_V, POS_SIDE = 8, 32, 2, 64, 3, 8
DEEPSTACK_BLOCKS = (0, 2)
MEAN, STD = (0.48, 0.46, 0.41), (0.27, 0.26, 0.28)
PROMPT = "Look at this: {marker} What is in the picture?"   # {marker}: where the image goes


def image_path(name: str) -> Path:
    return VISION_DIR / (f"{STEM}.png" if name == "square" else f"{STEM}-{name}.png")


MODEL = synth_qwenvl.VLModel(TEXT, MMPROJ, EMBD, IMAGES, image_path, PROMPT, N_EMBD_TEXT * (1 + N_DEEPSTACK))


def write_text_model() -> None:
    import synth_common as sc

    rng = np.random.default_rng(70)
    # q and k drawn wider than the rest: sharper attention, so positions (M-RoPE) weigh more
    w = sc.RandomWeights(rng, {k: 0.08 for k in ("token_embd", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                   "ffn_down", "output")} | {"attn_q": 0.3, "attn_k": 0.3})
    tok = sc.read_tokenizer_source()

    def head_norms(p: str) -> list:
        return [(p + "attn_q_norm.weight", w.norm(HEAD_DIM_TEXT)), (p + "attn_k_norm.weight", w.norm(HEAD_DIM_TEXT))]

    tensors = sc.llama_tensors(w, n_vocab=sc.vocab_size(tok), n_embd=N_EMBD_TEXT, n_layer=N_LAYER_TEXT,
                               q_dim=N_HEAD_TEXT * HEAD_DIM_TEXT, kv_dim=N_HEAD_KV_TEXT * HEAD_DIM_TEXT,
                               n_ff=N_FF_TEXT, tied=True, after_attention=head_norms)
    writer = sc.start_model(TEXT, "qwen3vl", name=STEM, n_layer=N_LAYER_TEXT, n_ctx=512, n_embd=N_EMBD_TEXT,
                            n_ff=N_FF_TEXT, n_head=N_HEAD_TEXT, n_head_kv=N_HEAD_KV_TEXT)
    sc.add_head_keys(writer, head_dim=HEAD_DIM_TEXT, eps=1e-6, rope_base=5e6)
    writer.add_rope_dimension_sections(list(SECTIONS))
    writer.add_num_deepstack_layers(N_DEEPSTACK)
    sc.finish_q8_0_model(writer, tok, tensors)


def mmproj_tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, array in numpy order), drawn in this order from `rng`."""
    d = synth_qwenvl.Draw(rng, N_EMBD_V, PATCH)
    mat, vec, norm, kernel = d.mat, d.vec, d.norm, d.kernel
    merged = 4 * N_EMBD_V
    out = [("v.patch_embd.weight", kernel()), ("v.patch_embd.weight.1", kernel()),
           ("v.patch_embd.bias", vec(N_EMBD_V)),
           ("v.position_embd.weight", (rng.standard_normal((POS_SIDE * POS_SIDE, N_EMBD_V)) * 0.5).astype(np.float32))]
    for i in range(N_LAYER_V):
        p = f"v.blk.{i}."
        out += [(p + "ln1.weight", norm(N_EMBD_V)), (p + "ln1.bias", vec(N_EMBD_V)),
                (p + "attn_qkv.weight", mat(3 * N_EMBD_V, N_EMBD_V)), (p + "attn_qkv.bias", vec(3 * N_EMBD_V)),
                (p + "attn_out.weight", mat(N_EMBD_V, N_EMBD_V)), (p + "attn_out.bias", vec(N_EMBD_V)),
                (p + "ln2.weight", norm(N_EMBD_V)), (p + "ln2.bias", vec(N_EMBD_V)),
                (p + "ffn_up.weight", mat(N_FF_V, N_EMBD_V)), (p + "ffn_up.bias", vec(N_FF_V)),
                (p + "ffn_down.weight", mat(N_EMBD_V, N_FF_V)), (p + "ffn_down.bias", vec(N_EMBD_V))]
    for i in DEEPSTACK_BLOCKS:
        p = f"v.deepstack.{i}."
        out += [(p + "norm.weight", norm(merged)), (p + "norm.bias", vec(merged)),
                (p + "fc1.weight", mat(merged, merged, 0.1)), (p + "fc1.bias", vec(merged)),
                (p + "fc2.weight", mat(N_EMBD_TEXT, merged, 0.1)), (p + "fc2.bias", vec(N_EMBD_TEXT))]
    return out + d.merger(N_EMBD_TEXT, ln_bias=True)


def write_mmproj() -> None:
    def keys(w) -> None:
        w.add_vision_use_gelu(True)
        w.add_vision_spatial_merge_size(2)
        w.add_vision_is_deepstack_layers([i in DEEPSTACK_BLOCKS for i in range(N_LAYER_V)])

    synth_qwenvl.write_mmproj(MMPROJ, STEM, "qwen3vl_merger", image_size=POS_SIDE * PATCH, patch=PATCH,
                              n_embd=N_EMBD_V, n_ff=N_FF_V, n_layer=N_LAYER_V, n_head=N_HEAD_V, n_embd_text=N_EMBD_TEXT,
                              mean=MEAN, std=STD, tensors=mmproj_tensors(np.random.default_rng(71)), extra=keys)


def main() -> None:
    def write() -> None:
        write_text_model()
        write_mmproj()

    synth_qwenvl.main(MODEL, __doc__, write)


if __name__ == "__main__":
    main()
