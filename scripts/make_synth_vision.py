"""Make the synthetic Gemma 3 vision model and record llama.cpp's image embeddings for it.

Writes

* tests/data/vision/gemma3-tiny.gguf: a small random Gemma 3 text model
  (GGUF `gemma3`, 2 layers of n_embd 64, 2 heads of 32 over 1 key/value head,
  n_ff 128, window 64) with the tokenizer of llama-bpe-q5_1-tied.gguf, matrices
  in Q8_0, norms in F32 (synth_common's writer);
* tests/data/vision/gemma3-tiny.mmproj.gguf: a matching random mmproj
  (`general.architecture = clip`, projector type gemma3): 32x32-pixel images
  cut into 4-pixel patches (an 8x8 grid), a SigLIP tower of 2 blocks of width
  32 (2 heads of 16, n_ff 64, GELU), average-pooled 2x2 (16 image tokens) and
  projected to the text model's 64; matrices and the patch kernel in F16,
  norms, biases and position embeddings in F32, as llama.cpp's mmproj-f16
  files have them; mean/std other than 0.5 so that their use is checked;
* tests/data/vision/gemma3-tiny.png: the test image (32x32, seeded noise over
  colour gradients);
* with --record (run by a Python that has llama-cpp-python 0.3.36, e.g.
  /tmp/rndmodel-venv/bin/python), tests/data/vision/gemma3-tiny.embd.json:
  llama.cpp's embeddings of the test image through libmtmd
  (mtmd_helper_bitmap_init_from_buf, mtmd_tokenize, mtmd_encode_chunk,
  mtmd_get_output_embd), the token ids of the text around the image in PROMPT
  (with <start_of_image> / <end_of_image>, which this vocabulary spells as
  text), and the top-10 logits after the whole prompt
  (mtmd_helper_eval_chunks: the image's rows attend both ways), on 2 threads.

    python scripts/make_synth_vision.py
    /tmp/rndmodel-venv/bin/python scripts/make_synth_vision.py --record
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VISION_DIR = ROOT / "tests" / "data" / "vision"
STEM = "gemma3-tiny"
TEXT, MMPROJ, IMAGE, EMBD = (VISION_DIR / f"{STEM}{ext}" for ext in
                             (".gguf", ".mmproj.gguf", ".png", ".embd.json"))

N_EMBD_TEXT, N_LAYER_TEXT, N_HEAD_TEXT, N_HEAD_KV_TEXT, HEAD_DIM_TEXT, N_FF_TEXT = 64, 2, 2, 1, 32, 128
IMAGE_SIZE, PATCH, N_EMBD_V, N_HEAD_V, N_FF_V, N_LAYER_V, POOL = 32, 4, 32, 2, 64, 2, 2
MEAN, STD = (0.48, 0.46, 0.41), (0.27, 0.26, 0.28)


def write_text_model() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import synth_common as sc

    rng = np.random.default_rng(30)
    w = sc.RandomWeights(rng, {k: 0.08 for k in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down", "output")})
    tok = sc.read_tokenizer_source()

    def head_norms(p: str):
        return [(p + "attn_q_norm.weight", w.norm(HEAD_DIM_TEXT)), (p + "attn_k_norm.weight", w.norm(HEAD_DIM_TEXT)),
                (p + "post_attention_norm.weight", w.norm(N_EMBD_TEXT))]

    tensors = sc.llama_tensors(w, n_vocab=sc.vocab_size(tok), n_embd=N_EMBD_TEXT, n_layer=N_LAYER_TEXT,
                               q_dim=N_HEAD_TEXT * HEAD_DIM_TEXT, kv_dim=N_HEAD_KV_TEXT * HEAD_DIM_TEXT,
                               n_ff=N_FF_TEXT, tied=True, after_attention=head_norms)
    for i in range(N_LAYER_TEXT):   # Gemma's norm after the MLP closes each block
        tensors.append((f"blk.{i}.post_ffw_norm.weight", w.norm(N_EMBD_TEXT)))
    writer = sc.start_model(TEXT, "gemma3", name=STEM, n_layer=N_LAYER_TEXT, n_ctx=512, n_embd=N_EMBD_TEXT,
                            n_ff=N_FF_TEXT, n_head=N_HEAD_TEXT, n_head_kv=N_HEAD_KV_TEXT)
    writer.add_key_length(HEAD_DIM_TEXT)
    writer.add_value_length(HEAD_DIM_TEXT)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(64)
    sc.finish_q8_0_model(writer, tok, tensors)


def mmproj_tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, array in numpy order), drawn in this order from `rng`."""
    def mat(n_out, n_in, std=0.15):
        return (rng.standard_normal((n_out, n_in)) * std).astype(np.float16)

    def vec(n, std=0.05):
        return (rng.standard_normal(n) * std).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    n_patches = (IMAGE_SIZE // PATCH) ** 2
    out = [("v.patch_embd.weight", (rng.standard_normal((N_EMBD_V, 3, PATCH, PATCH)) * 0.2).astype(np.float16)),
           ("v.patch_embd.bias", vec(N_EMBD_V)),
           ("v.position_embd.weight", (rng.standard_normal((n_patches, N_EMBD_V)) * 0.3).astype(np.float32))]
    for i in range(N_LAYER_V):
        p = f"v.blk.{i}."
        out += [(p + "ln1.weight", norm(N_EMBD_V)), (p + "ln1.bias", vec(N_EMBD_V))]
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out += [(p + name + ".weight", mat(N_EMBD_V, N_EMBD_V)), (p + name + ".bias", vec(N_EMBD_V))]
        out += [(p + "ln2.weight", norm(N_EMBD_V)), (p + "ln2.bias", vec(N_EMBD_V)),
                (p + "ffn_up.weight", mat(N_FF_V, N_EMBD_V)), (p + "ffn_up.bias", vec(N_FF_V)),
                (p + "ffn_down.weight", mat(N_EMBD_V, N_FF_V)), (p + "ffn_down.bias", vec(N_EMBD_V))]
    out += [("v.post_ln.weight", norm(N_EMBD_V)), ("v.post_ln.bias", vec(N_EMBD_V)),
            ("mm.soft_emb_norm.weight", norm(N_EMBD_V)),
            # HF's mm_input_projection_weight [vision, text], multiplied from the right
            ("mm.input_projection.weight", mat(N_EMBD_V, N_EMBD_TEXT))]
    return out


def write_mmproj() -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(MMPROJ, "clip")
    writer.add_name(f"{STEM} vision")
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type("gemma3")
    writer.add_clip_vision_projector_type("gemma3")
    writer.add_vision_image_size(IMAGE_SIZE)
    writer.add_vision_patch_size(PATCH)
    writer.add_vision_embedding_length(N_EMBD_V)
    writer.add_vision_feed_forward_length(N_FF_V)
    writer.add_vision_block_count(N_LAYER_V)
    writer.add_vision_head_count(N_HEAD_V)
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_projection_dim(N_EMBD_TEXT)
    writer.add_vision_image_mean(list(MEAN))
    writer.add_vision_image_std(list(STD))
    writer.add_vision_use_gelu(True)
    writer.add_vision_projector_scale_factor(POOL)
    for name, data in mmproj_tensors(np.random.default_rng(31)):
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_image(seed: int = 32) -> np.ndarray:
    """uint8 RGB [32, 32, 3]: a gradient per channel plus seeded noise."""
    y, x = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
    base = np.stack([x * 7, y * 7, (x + y) * 3], axis=-1).astype(np.float64)
    noise = np.random.default_rng(seed).integers(0, 60, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_image() -> None:
    from PIL import Image
    Image.fromarray(test_image(), "RGB").save(IMAGE, format="PNG")


PROMPT = "Look at this: {marker} What is in the picture?"   # {marker}: where the image goes


def record() -> None:
    """llama.cpp's embeddings of IMAGE through libmtmd, and the logits after PROMPT with
    the image in it (mtmd_helper_eval_chunks: the image attended both ways), into EMBD."""
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mtmd_record import record_case

    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(TEXT).encode(), params)
    case = record_case(llama_cpp, model, MMPROJ, IMAGE.read_bytes(), PROMPT, N_EMBD_TEXT)
    rows, top = case["embeddings"], case["top_logits"]
    head = json.dumps({"source": f"llama-cpp-python {llama_cpp.__version__} libmtmd, 2 threads",
                       "image": IMAGE.name, "prompt": PROMPT, "segments": case["segments"], "top_logits": top,
                       "n_tokens": len(rows), "n_embd": N_EMBD_TEXT})
    body = ",\n".join(json.dumps([float(v) for v in row]) for row in rows)   # one image token a line
    EMBD.write_text(f'{head[:-1]}, "embeddings": [\n{body}]}}\n')
    print(f"recorded {len(rows)} x {N_EMBD_TEXT} embeddings and {len(top)} logits into {EMBD}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="record llama.cpp's embeddings (needs llama_cpp)")
    args = parser.parse_args()
    if args.record:
        record()
        return
    VISION_DIR.mkdir(parents=True, exist_ok=True)
    write_text_model()
    write_mmproj()
    write_image()
    print(f"wrote {TEXT.name}, {MMPROJ.name}, {IMAGE.name} into {VISION_DIR}")


if __name__ == "__main__":
    main()
