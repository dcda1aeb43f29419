"""Make the synthetic SmolVLM (Idefics3) vision model and record llama.cpp's image
embeddings for it.

Writes

* tests/data/vision/smolvlm-tiny.gguf: a small random Llama text model (2 layers of
  n_embd 64, 2 heads of 32 over 1 key/value head, n_ff 128) with the tokenizer of
  llama-bpe-q5_1-tied.gguf plus the tokens llama.cpp's mtmd looks up for Idefics3's
  image text (<fake_token_around_image>, <global-img>, <row_R_col_C> for R, C up to 3,
  as control tokens, and "\\n\\n" with its merge), matrices in Q8_0, norms in F32;
* tests/data/vision/smolvlm-tiny.mmproj.gguf: a matching random mmproj
  (`general.architecture = clip`, projector type idefics3): 32-pixel tiles cut into
  4-pixel patches (8x8), the SigLIP tower of make_synth_vision.py (2 blocks of width
  32, 2 heads, n_ff 64, GELU; F16 matrices, F32 norms, biases and positions), a 2x2
  pixel shuffle (16 tokens a tile) and mm.model.fc [128 -> 64]; images resized to a
  longer side of 96 pixels (clip.vision.preproc_image_size), so up to 3x3 tiles;
* tests/data/vision/smolvlm-tiny.png: the test image, 60x40 (seeded noise over
  gradients): resized to 96x64, it is cut into 2 rows of 3 tiles, plus the global image;
  tests/data/vision/smolvlm-tiny-shrunk.png, 150x110: shrunk to 96x70 (the width's
  pass first, as mtmd resamples), then 3x3 tiles;
* with --record (run by a Python that has llama-cpp-python 0.3.36, e.g.
  <python with llama-cpp-python 0.3.36>), tests/data/vision/smolvlm-tiny.embd.json: the
  prompt as libmtmd cut it (text chunks' token ids, image chunks' sizes), the
  embeddings of every image chunk in order (mtmd_encode_chunk, mtmd_get_output_embd)
  and the top-10 logits after the prompt (mtmd_helper_eval_chunks), on 2 threads
  (make_synth_vision.mtmd_run);
  the same for the shrunk image in smolvlm-tiny-shrunk.embd.json.

    python scripts/make_synth_smolvlm.py
    <python with llama-cpp-python 0.3.36> scripts/make_synth_smolvlm.py --record
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_synth_vision as msv  # noqa: E402  (the SigLIP tensors and the logits recorder)

VISION_DIR = msv.VISION_DIR
STEM = "smolvlm-tiny"
TEXT, MMPROJ, IMAGE, EMBD = (VISION_DIR / f"{STEM}{ext}" for ext in
                             (".gguf", ".mmproj.gguf", ".png", ".embd.json"))
# an image larger than the preprocessing size both ways: both resampling passes shrink it
SHRUNK_IMAGE, SHRUNK_EMBD = VISION_DIR / f"{STEM}-shrunk.png", VISION_DIR / f"{STEM}-shrunk.embd.json"

N_EMBD_TEXT, N_LAYER_TEXT, N_HEAD_TEXT, N_HEAD_KV_TEXT, N_FF_TEXT = 64, 2, 2, 1, 128
SHUFFLE, LONGEST_EDGE = 2, 96
MEAN, STD = (0.5, 0.45, 0.4), (0.26, 0.27, 0.29)
IMAGE_WIDTH, IMAGE_HEIGHT = 60, 40
EXTRA_CONTROL_TOKENS = ["<fake_token_around_image>", "<global-img>",
                        *(f"<row_{r}_col_{c}>" for r in range(1, 4) for c in range(1, 4))]
PROMPT = "<|im_start|>User: {marker} What is in the picture?<|im_end|>\nAssistant:"


def write_text_model() -> None:
    import synth_common as sc

    rng = np.random.default_rng(40)
    w = sc.RandomWeights(rng, {k: 0.08 for k in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down", "output")})
    tok = sc.read_tokenizer_source()
    vocab = msv.extended_vocab(tok, [("ĊĊ", "Ċ Ċ")], EXTRA_CONTROL_TOKENS)
    head_dim = N_EMBD_TEXT // N_HEAD_TEXT
    tensors = sc.llama_tensors(w, n_vocab=len(vocab[0]), n_embd=N_EMBD_TEXT, n_layer=N_LAYER_TEXT,
                               q_dim=N_EMBD_TEXT, kv_dim=N_HEAD_KV_TEXT * head_dim, n_ff=N_FF_TEXT, tied=True)
    writer = sc.start_model(TEXT, "llama", name=STEM, n_layer=N_LAYER_TEXT, n_ctx=512, n_embd=N_EMBD_TEXT,
                            n_ff=N_FF_TEXT, n_head=N_HEAD_TEXT, n_head_kv=N_HEAD_KV_TEXT)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    msv.finish_with_vocab(writer, tok, vocab, tensors)


def mmproj_tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """make_synth_vision's SigLIP tower (its mm.* tensors left out), then mm.model.fc."""
    tower = [(name, data) for name, data in msv.mmproj_tensors(rng) if not name.startswith("mm.")]
    fc = (rng.standard_normal((N_EMBD_TEXT, msv.N_EMBD_V * SHUFFLE ** 2)) * 0.1).astype(np.float16)
    return tower + [("mm.model.fc.weight", fc)]


def write_mmproj() -> None:
    msv.write_siglip_mmproj(MMPROJ, "idefics3", mmproj_tensors(np.random.default_rng(41)), n_embd_text=N_EMBD_TEXT,
                            mean=MEAN, std=STD, scale_factor=SHUFFLE,
                            more_keys=lambda writer: writer.add_vision_preproc_image_size(LONGEST_EDGE))


def test_image(width: int = IMAGE_WIDTH, height: int = IMAGE_HEIGHT, seed: int = 42) -> np.ndarray:
    """uint8 RGB [height, width, 3]: a gradient per channel plus seeded noise."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 4, y * 6, (x + y) * 2 + 40], axis=-1).astype(np.float64)
    noise = np.random.default_rng(seed).integers(0, 70, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_images() -> None:
    from PIL import Image
    Image.fromarray(test_image(), "RGB").save(IMAGE, format="PNG")
    Image.fromarray(test_image(150, 110, seed=43), "RGB").save(SHRUNK_IMAGE, format="PNG")


def record() -> None:
    for png, out in ((IMAGE, EMBD), (SHRUNK_IMAGE, SHRUNK_EMBD)):
        msv.record_blocks(TEXT, MMPROJ, png, PROMPT, N_EMBD_TEXT, out)


def make() -> None:
    write_text_model()
    write_mmproj()
    write_images()
    print(f"wrote {TEXT.name}, {MMPROJ.name}, {IMAGE.name}, {SHRUNK_IMAGE.name} into {VISION_DIR}")


if __name__ == "__main__":
    msv.run_script(__doc__, record, make)
