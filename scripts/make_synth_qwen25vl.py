"""Make the synthetic Qwen2.5-VL model and record llama.cpp's image embeddings and
logits for it.

Writes

* tests/data/vision/qwen25vl-tiny.gguf: a small random text model (GGUF `qwen2vl`,
  2 layers of n_embd 64, 2 heads of 32 over 1 key/value head with q/k/v biases,
  n_ff 128, M-RoPE sections 4/6/6/0 pairs, base 1e6) with the tokenizer of
  llama-bpe-q5_1-tied.gguf, matrices in Q8_0 (synth_common's writer);
* tests/data/vision/qwen25vl-tiny.mmproj.gguf: a matching random mmproj (projector
  type qwen2.5vl_merger): 8-pixel patches (so a 112-pixel attention window is 7x7
  merged tokens), a tower of 2 blocks of width 32 (2 heads of 16, SwiGLU n_ff 64,
  RMS norms), n_wa_pattern 2 (block 0 windowed, block 1 full), both frames' patch
  kernels, the merger's RMS norm and mm.0 / mm.2 into 64; matrices and kernels in
  F16, norms and biases in F32; mean/std other than 0.5;
* tests/data/vision/qwen25vl-tiny.png (128x128: 8x8 tokens in 2x2 windows),
  qwen25vl-tiny-wide.png (64x176: 4x11 tokens, windows of 7 and 4 columns) and
  qwen25vl-tiny-odd.png (100x150: resized to 96x144 and padded, as mtmd does) and
  qwen25vl-tiny-tall.png (253x83: resized to 244x80, padded to 256x80: llama.cpp's
  resampler takes the width first, where Pillow's own takes the height);
* with --record (a Python with llama-cpp-python 0.3.36), qwen25vl-tiny.embd.json:
  for each image, libmtmd's embeddings, its token grid, the token ids of the text
  around it in PROMPT and the top-10 logits after the whole prompt
  (mtmd_helper_eval_chunks: M-RoPE positions), on 2 threads.

    python scripts/make_synth_qwen25vl.py
    <python with llama-cpp-python 0.3.36> scripts/make_synth_qwen25vl.py --record
    PYTHONPATH=<dir holding llama_cpp> python scripts/make_synth_qwen25vl.py --live 12
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth_qwenvl  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VISION_DIR = ROOT / "tests" / "data" / "vision"
STEM = "qwen25vl-tiny"
TEXT, MMPROJ, EMBD = (VISION_DIR / f"{STEM}{ext}" for ext in (".gguf", ".mmproj.gguf", ".embd.json"))
# name: (height, width, seed)
IMAGES = {"square": (128, 128, 40), "wide": (64, 176, 41), "odd": (100, 150, 42), "tall": (253, 83, 43)}

N_EMBD_TEXT, N_LAYER_TEXT, N_HEAD_TEXT, N_HEAD_KV_TEXT, HEAD_DIM_TEXT, N_FF_TEXT = 64, 2, 2, 1, 32, 128
SECTIONS = (4, 6, 6, 0)
PATCH, N_EMBD_V, N_HEAD_V, N_FF_V, N_LAYER_V, WA_PATTERN = 8, 32, 2, 64, 2, 2
MEAN, STD = (0.48, 0.46, 0.41), (0.27, 0.26, 0.28)
PROMPT = "Look at this: {marker} What is in the picture?"   # {marker}: where the image goes


def image_path(name: str) -> Path:
    return VISION_DIR / (f"{STEM}.png" if name == "square" else f"{STEM}-{name}.png")


MODEL = synth_qwenvl.VLModel(TEXT, MMPROJ, EMBD, IMAGES, image_path, PROMPT, N_EMBD_TEXT)


def write_text_model() -> None:
    import synth_common as sc

    rng = np.random.default_rng(50)
    # q and k drawn wider than the rest: sharper attention, so positions (M-RoPE) weigh more
    w = sc.RandomWeights(rng, {k: 0.08 for k in ("token_embd", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                   "ffn_down", "output")}
                         | {"attn_q": 0.3, "attn_k": 0.3} | {k: 0.3 for k in ("bias_q", "bias_k", "bias_v")})
    tok = sc.read_tokenizer_source()
    tensors = sc.embedding_and_output(w, sc.vocab_size(tok), N_EMBD_TEXT, tied=True)
    for i in range(N_LAYER_TEXT):
        p = f"blk.{i}."
        tensors += sc.attention_tensors(w, p, n_embd=N_EMBD_TEXT, q_dim=N_HEAD_TEXT * HEAD_DIM_TEXT,
                                        kv_dim=N_HEAD_KV_TEXT * HEAD_DIM_TEXT, biases=True)
        tensors += [(p + "ffn_norm.weight", w.norm(N_EMBD_TEXT)),
                    (p + "ffn_gate.weight", w.matrix("ffn_gate", N_FF_TEXT, N_EMBD_TEXT)),
                    (p + "ffn_up.weight", w.matrix("ffn_up", N_FF_TEXT, N_EMBD_TEXT)),
                    (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD_TEXT, N_FF_TEXT))]
    writer = sc.start_model(TEXT, "qwen2vl", name=STEM, n_layer=N_LAYER_TEXT, n_ctx=512, n_embd=N_EMBD_TEXT,
                            n_ff=N_FF_TEXT, n_head=N_HEAD_TEXT, n_head_kv=N_HEAD_KV_TEXT)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    writer.add_rope_dimension_sections(list(SECTIONS))
    sc.finish_q8_0_model(writer, tok, tensors)


def mmproj_tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, array in numpy order), drawn in this order from `rng`."""
    d = synth_qwenvl.Draw(rng, N_EMBD_V, PATCH)
    mat, vec, norm, kernel = d.mat, d.vec, d.norm, d.kernel
    out = [("v.patch_embd.weight", kernel()), ("v.patch_embd.weight.1", kernel())]
    for i in range(N_LAYER_V):
        p = f"v.blk.{i}."
        out += [(p + "ln1.weight", norm(N_EMBD_V))]
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out += [(p + name + ".weight", mat(N_EMBD_V, N_EMBD_V)), (p + name + ".bias", vec(N_EMBD_V))]
        out += [(p + "ln2.weight", norm(N_EMBD_V)),
                (p + "ffn_gate.weight", mat(N_FF_V, N_EMBD_V)), (p + "ffn_gate.bias", vec(N_FF_V)),
                (p + "ffn_up.weight", mat(N_FF_V, N_EMBD_V)), (p + "ffn_up.bias", vec(N_FF_V)),
                (p + "ffn_down.weight", mat(N_EMBD_V, N_FF_V)), (p + "ffn_down.bias", vec(N_EMBD_V))]
    return out + d.merger(N_EMBD_TEXT, ln_bias=False)


def write_mmproj() -> None:
    def keys(w) -> None:
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(WA_PATTERN)

    synth_qwenvl.write_mmproj(MMPROJ, STEM, "qwen2.5vl_merger", image_size=128, patch=PATCH, n_embd=N_EMBD_V,
                              n_ff=N_FF_V, n_layer=N_LAYER_V, n_head=N_HEAD_V, n_embd_text=N_EMBD_TEXT,
                              mean=MEAN, std=STD, tensors=mmproj_tensors(np.random.default_rng(51)), extra=keys)


def main() -> None:
    def write() -> None:
        write_text_model()
        write_mmproj()

    synth_qwenvl.main(MODEL, __doc__, write)


if __name__ == "__main__":
    main()
