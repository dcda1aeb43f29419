"""Make the synthetic LFM2-VL vision model and record llama.cpp's image embeddings for it.

Writes

* tests/data/vision/lfm2vl-tiny.gguf: make_synth_lfm2.py's random LFM2 text model
  (its layers, sizes and seed; its weights drawn at a quarter of their width) over
  the tokenizer of llama-bpe-q5_1-tied.gguf plus the control tokens llama.cpp's
  mtmd places around LFM2-VL's images
  (<|image_start|>, <|image_end|>, <|img_thumbnail|>, <|img_row_R_col_C|> up to 10);
* tests/data/vision/lfm2vl-tiny.mmproj.gguf: a matching random mmproj
  (`general.architecture = clip`, projector type lfm2): make_synth_vision.py's
  SigLIP tower with 16-pixel patches and a 16x16 grid of learned positions (256
  pixels), a 2x2 pixel unshuffle, mm.input_norm (LayerNorm) and the MLP mm.1 [128 ->
  64], GELU, mm.2 [64 -> 64], with biases;
* tests/data/vision/lfm2vl-tiny.png: the test image, 300x200: resized to 320x224
  (to hold at least 64 tokens of 32 pixels), so its 20x14 patches take the position
  grid resized both ways, 70 tokens;
* with --record (a Python with llama-cpp-python 0.3.36), lfm2vl-tiny.embd.json:
  libmtmd's cut of the prompt, the image's embeddings and the top-10 logits after
  the prompt (make_synth_vision.mtmd_run), on 2 threads.

    python scripts/make_synth_lfm2vl.py
    <python with llama-cpp-python 0.3.36> scripts/make_synth_lfm2vl.py --record
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_synth_vision as msv  # noqa: E402  (the SigLIP tensors, the vocabulary and the recorder)

VISION_DIR = msv.VISION_DIR
STEM = "lfm2vl-tiny"
TEXT, MMPROJ, IMAGE, EMBD = (VISION_DIR / f"{STEM}{ext}" for ext in
                             (".gguf", ".mmproj.gguf", ".png", ".embd.json"))
IMAGE_SIZE, PATCH, MERGE = 256, 16, 2
MEAN, STD = (0.5, 0.47, 0.44), (0.28, 0.3, 0.26)   # not 0.5 (LFM2-VL's) so that their use is checked
IMAGE_WIDTH, IMAGE_HEIGHT = 300, 200
CONTROL_TOKENS = ["<|image_start|>", "<|image_end|>", "<|img_thumbnail|>",
                  *(f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11))]
PROMPT = "<|im_start|>user\n{marker}What is in the picture?<|im_end|>\n<|im_start|>assistant\n"


def write_text_model() -> None:
    import make_synth_lfm2 as lfm2
    import synth_common as sc

    tok = sc.read_tokenizer_source()
    vocab = msv.extended_vocab(tok, [], CONTROL_TOKENS)
    writer = sc.start_model(TEXT, lfm2.ARCH, name=STEM, n_layer=lfm2.N_LAYER, n_ctx=lfm2.CONTEXT_LENGTH,
                            n_embd=lfm2.N_EMBD, n_ff=lfm2.N_FF, n_head=lfm2.N_HEAD, n_head_kv=lfm2.HEAD_COUNT_KV)
    writer.add_key_length(lfm2.HEAD_DIM)
    writer.add_value_length(lfm2.HEAD_DIM)
    writer.add_layer_norm_rms_eps(lfm2.EPS)
    writer.add_rope_freq_base(lfm2.ROPE_BASE)
    writer.add_uint32(f"{lfm2.ARCH}.shortconv.l_cache", lfm2.L_CACHE)
    # make_synth_lfm2's weights are drawn wide on purpose (a window one token short moves
    # nearly every argmax); that wide, they turn the tower's 6e-4 apart from llama.cpp's
    # into 0.1 apart in the logits: drawn at a quarter of the width here
    with mock.patch.dict(lfm2.STD, {kind: std / 4 for kind, std in lfm2.STD.items()}):
        tensors = lfm2.tensors(np.random.default_rng(lfm2.SEED), len(vocab[0]))
    msv.finish_with_vocab(writer, tok, vocab, tensors, lfm2.quantize_as)


def mmproj_tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """make_synth_vision's SigLIP tower at these sizes (its mm.* left out), then LFM2-VL's projector."""
    import make_synth_lfm2 as lfm2

    tower = [(n, d) for n, d in msv.mmproj_tensors(rng, IMAGE_SIZE, PATCH) if not n.startswith("mm.")]
    n_merged, n_text = msv.N_EMBD_V * MERGE ** 2, lfm2.N_EMBD
    return tower + [
        ("mm.input_norm.weight", (1.0 + 0.1 * rng.standard_normal(n_merged)).astype(np.float32)),
        ("mm.input_norm.bias", (0.05 * rng.standard_normal(n_merged)).astype(np.float32)),
        ("mm.1.weight", (rng.standard_normal((n_text, n_merged)) * 0.12).astype(np.float16)),
        ("mm.1.bias", (0.05 * rng.standard_normal(n_text)).astype(np.float32)),
        # rows of std about 0.3 (the text model normalises them anyway)
        ("mm.2.weight", (rng.standard_normal((n_text, n_text)) * 0.05).astype(np.float16)),
        ("mm.2.bias", (0.02 * rng.standard_normal(n_text)).astype(np.float32))]


def write_mmproj() -> None:
    import make_synth_lfm2 as lfm2

    msv.write_siglip_mmproj(MMPROJ, "lfm2", mmproj_tensors(np.random.default_rng(51)), n_embd_text=lfm2.N_EMBD,
                            mean=MEAN, std=STD, scale_factor=MERGE, image_size=IMAGE_SIZE, patch=PATCH)


def test_image(width: int = IMAGE_WIDTH, height: int = IMAGE_HEIGHT, seed: int = 52) -> np.ndarray:
    """uint8 RGB [height, width, 3]: gradients plus seeded noise."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 0.8, y * 1.1, (x + y) * 0.4 + 30], axis=-1)
    noise = np.random.default_rng(seed).integers(0, 12, base.shape)   # low: a small PNG
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_image() -> None:
    from PIL import Image
    Image.fromarray(test_image(), "RGB").save(IMAGE, format="PNG")


def record() -> None:
    import make_synth_lfm2 as lfm2

    msv.record_blocks(TEXT, MMPROJ, IMAGE, PROMPT, lfm2.N_EMBD, EMBD)


def make() -> None:
    write_text_model()
    write_mmproj()
    write_image()
    print(f"wrote {TEXT.name}, {MMPROJ.name}, {IMAGE.name} into {VISION_DIR}")


if __name__ == "__main__":
    msv.run_script(__doc__, record, make)
