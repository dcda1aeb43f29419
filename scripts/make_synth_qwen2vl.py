"""Make the synthetic Qwen2-VL vision tower and record llama.cpp's image embeddings and
logits for it.

Qwen2-VL's text model is the GGUF architecture Qwen2.5-VL's is (`qwen2vl`), so the
text side is tests/data/vision/qwen25vl-tiny.gguf (scripts/make_synth_qwen25vl.py).
Writes

* tests/data/vision/qwen2vl-tiny.mmproj.gguf: a random mmproj (projector type
  qwen2vl_merger) for it: 8-pixel patches, both frames' kernels (no bias), 2 blocks
  of width 32 (2 heads of 16, separate q/k/v, MLP n_ff 64 with quick GELU - the
  file says neither clip.use_gelu nor clip.use_silu -, LayerNorms with biases,
  every block attending to every patch), the merger's LayerNorm and mm.0 / mm.2
  into 64; matrices and kernels in F16, norms and biases in F32; mean/std other
  than 0.5;
* tests/data/vision/qwen2vl-tiny.png (64x64), qwen2vl-tiny-wide.png (48x176: 3x11
  tokens) and qwen2vl-tiny-odd.png (100x150: resized to 96x144 and padded);
* with --record (a Python with llama-cpp-python 0.3.36), qwen2vl-tiny.embd.json:
  for each image, libmtmd's embeddings, its token grid, the token ids of the text
  around it in PROMPT and the top-10 logits after the whole prompt, on 2 threads.

    python scripts/make_synth_qwen2vl.py
    <python with llama-cpp-python 0.3.36> scripts/make_synth_qwen2vl.py --record
    PYTHONPATH=<dir holding llama_cpp> python scripts/make_synth_qwen2vl.py --live 12
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth_qwenvl  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VISION_DIR = ROOT / "tests" / "data" / "vision"
STEM = "qwen2vl-tiny"
TEXT = VISION_DIR / "qwen25vl-tiny.gguf"
MMPROJ, EMBD = (VISION_DIR / f"{STEM}{ext}" for ext in (".mmproj.gguf", ".embd.json"))
# name: (height, width, seed)
IMAGES = {"square": (64, 64, 80), "wide": (48, 176, 81), "odd": (100, 150, 82)}

N_EMBD_TEXT = 64
PATCH, N_EMBD_V, N_HEAD_V, N_FF_V, N_LAYER_V = 8, 32, 2, 64, 2
MEAN, STD = (0.48, 0.46, 0.41), (0.27, 0.26, 0.28)
PROMPT = "Look at this: {marker} What is in the picture?"   # {marker}: where the image goes


def image_path(name: str) -> Path:
    return VISION_DIR / (f"{STEM}.png" if name == "square" else f"{STEM}-{name}.png")


MODEL = synth_qwenvl.VLModel(TEXT, MMPROJ, EMBD, IMAGES, image_path, PROMPT, N_EMBD_TEXT)


def mmproj_tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, array in numpy order), drawn in this order from `rng`."""
    d = synth_qwenvl.Draw(rng, N_EMBD_V, PATCH)
    mat, vec, norm, kernel = d.mat, d.vec, d.norm, d.kernel
    out = [("v.patch_embd.weight", kernel()), ("v.patch_embd.weight.1", kernel())]
    for i in range(N_LAYER_V):
        p = f"v.blk.{i}."
        out += [(p + "ln1.weight", norm(N_EMBD_V)), (p + "ln1.bias", vec(N_EMBD_V))]
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out += [(p + name + ".weight", mat(N_EMBD_V, N_EMBD_V)), (p + name + ".bias", vec(N_EMBD_V))]
        out += [(p + "ln2.weight", norm(N_EMBD_V)), (p + "ln2.bias", vec(N_EMBD_V)),
                (p + "ffn_up.weight", mat(N_FF_V, N_EMBD_V)), (p + "ffn_up.bias", vec(N_FF_V)),
                (p + "ffn_down.weight", mat(N_EMBD_V, N_FF_V)), (p + "ffn_down.bias", vec(N_EMBD_V))]
    return out + d.merger(N_EMBD_TEXT, ln_bias=True)


def write_mmproj() -> None:
    synth_qwenvl.write_mmproj(MMPROJ, STEM, "qwen2vl_merger", image_size=64, patch=PATCH, n_embd=N_EMBD_V,
                              n_ff=N_FF_V, n_layer=N_LAYER_V, n_head=N_HEAD_V, n_embd_text=N_EMBD_TEXT,
                              mean=MEAN, std=STD, tensors=mmproj_tensors(np.random.default_rng(90)))


if __name__ == "__main__":
    synth_qwenvl.main(MODEL, __doc__, write_mmproj)
