"""Make the synthetic Pixtral vision models and record llama.cpp's image embeddings for them.

Writes

* tests/data/vision/pixtral-tiny.gguf: a small random Llama text model (GGUF
  `llama`, Pixtral-12B's text side: 2 layers of n_embd 64, 2 heads of 32 over 1
  key/value head, n_ff 128, RoPE base 1e6) with the tokenizer of
  llama-bpe-q5_1-tied.gguf, matrices in Q8_0, norms in F32 (synth_common's writer);
* tests/data/vision/pixtral-tiny.mmproj.gguf: a matching random mmproj
  (`general.architecture = clip`, projector type pixtral, Pixtral-12B's layout):
  4-pixel patches, an RMS pre-norm, 2 blocks of width 32 (2 heads of 16, SwiGLU
  of 64, RMS norms, no biases, 2D RoPE), a GELU MLP (mm.1, mm.2, with biases) to
  the text model's 64 and the [IMG_BREAK] embedding (v.token_embd.img_break);
* tests/data/vision/pixtral-tiny-merge.mmproj.gguf: the same with Mistral Small
  3.1's patch merger (clip.vision.spatial_merge_size 2, mm.input_norm,
  mm.patch_merger), other random weights; matrices and the patch kernel in F16,
  norms, biases and the break embedding in F32 (llama.cpp's mmproj-f16 layout),
  mean/std other than CLIP's so that their use is checked;
* tests/data/vision/pixtral-tiny.png (40x24: a multiple of the patches, not
  resized) and pixtral-tiny-odd.png (50x30: resized by llama.cpp to 52x32, up,
  with a black line of padding; with the merger to 48x29, down, in 48x32) and
  pixtral-tiny-tall.png (18x65: with the merger to 16x58 in 16x64, where this
  Pillow's own bicubic differs from llama.cpp's resampler);
* with --record (run by a Python that has llama-cpp-python 0.3.36, e.g.
  <python with llama-cpp-python 0.3.36>), tests/data/vision/pixtral-tiny.embd.json:
  for each (mmproj, image) case, llama.cpp's embeddings through libmtmd
  (mtmd_helper_bitmap_init_from_buf, mtmd_tokenize, mtmd_encode_chunk,
  mtmd_get_output_embd: the [IMG_BREAK] rows included), the token ids of the
  text around the image in PROMPT (with [IMG_END] after it, which this
  vocabulary spells as text), and the top-10 logits after the whole prompt
  (mtmd_helper_eval_chunks: the image's rows causal), on 2 threads; a case whose
  rows or logits hold NaNs (a llama.cpp bug, now and then: record_clean_case) is
  recorded again.

    python scripts/make_synth_pixtral.py
    <python with llama-cpp-python 0.3.36> scripts/make_synth_pixtral.py --record
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VISION_DIR = ROOT / "tests" / "data" / "vision"
STEM = "pixtral-tiny"
TEXT, EMBD = VISION_DIR / f"{STEM}.gguf", VISION_DIR / f"{STEM}.embd.json"
MMPROJS = {1: VISION_DIR / f"{STEM}.mmproj.gguf", 2: VISION_DIR / f"{STEM}-merge.mmproj.gguf"}   # by merge side
IMAGES = {"even": (VISION_DIR / f"{STEM}.png", 40, 24), "odd": (VISION_DIR / f"{STEM}-odd.png", 50, 30),
          "tall": (VISION_DIR / f"{STEM}-tall.png", 18, 65)}

N_EMBD_TEXT, N_LAYER_TEXT, N_HEAD_TEXT, N_HEAD_KV_TEXT, HEAD_DIM_TEXT, N_FF_TEXT = 64, 2, 2, 1, 32, 128
IMAGE_SIZE, PATCH, N_EMBD_V, N_HEAD_V, N_FF_V, N_LAYER_V = 128, 4, 32, 2, 64, 2
EPS = 1e-5
MEAN, STD = (0.48, 0.46, 0.41), (0.27, 0.26, 0.28)
CASES = [(1, "even"), (1, "odd"), (2, "even"), (2, "odd"), (2, "tall")]   # (merge side, image) recorded
RETRIES = 20


def write_text_model() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import synth_common as sc

    rng = np.random.default_rng(300)
    w = sc.RandomWeights(rng, {k: 0.08 for k in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down", "output")})
    tok = sc.read_tokenizer_source()
    tensors = sc.llama_tensors(w, n_vocab=sc.vocab_size(tok), n_embd=N_EMBD_TEXT, n_layer=N_LAYER_TEXT,
                               q_dim=N_HEAD_TEXT * HEAD_DIM_TEXT, kv_dim=N_HEAD_KV_TEXT * HEAD_DIM_TEXT,
                               n_ff=N_FF_TEXT, tied=True)
    writer = sc.start_model(TEXT, "llama", name=STEM, n_layer=N_LAYER_TEXT, n_ctx=512, n_embd=N_EMBD_TEXT,
                            n_ff=N_FF_TEXT, n_head=N_HEAD_TEXT, n_head_kv=N_HEAD_KV_TEXT)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(1e6)
    sc.finish_q8_0_model(writer, tok, tensors)


def mmproj_tensors(rng: np.random.Generator, merge: int) -> list[tuple[str, np.ndarray]]:
    """(name, array in numpy order), drawn in this order from `rng`."""
    def mat(n_out, n_in, std=0.1):
        return (rng.standard_normal((n_out, n_in)) * std).astype(np.float16)

    def vec(n, std=0.05):
        return (rng.standard_normal(n) * std).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    out = [("v.patch_embd.weight", (rng.standard_normal((N_EMBD_V, 3, PATCH, PATCH)) * 0.2).astype(np.float16)),
           ("v.pre_ln.weight", norm(N_EMBD_V))]
    for i in range(N_LAYER_V):
        p = f"v.blk.{i}."
        out += [(p + "ln1.weight", norm(N_EMBD_V))]
        out += [(p + name + ".weight", mat(N_EMBD_V, N_EMBD_V, std)) for name, std in (("attn_q", 0.25), ("attn_k", 0.25), ("attn_v", 0.1))]
        out += [(p + "attn_out.weight", mat(N_EMBD_V, N_EMBD_V)), (p + "ln2.weight", norm(N_EMBD_V)),
                (p + "ffn_gate.weight", mat(N_FF_V, N_EMBD_V)), (p + "ffn_up.weight", mat(N_FF_V, N_EMBD_V)),
                (p + "ffn_down.weight", mat(N_EMBD_V, N_FF_V))]
    if merge > 1:
        out += [("mm.input_norm.weight", norm(N_EMBD_V)),
                ("mm.patch_merger.weight", mat(N_EMBD_V, N_EMBD_V * merge * merge, 0.1))]
    out += [("mm.1.weight", mat(N_EMBD_TEXT, N_EMBD_V)), ("mm.1.bias", vec(N_EMBD_TEXT)),
            ("mm.2.weight", mat(N_EMBD_TEXT, N_EMBD_TEXT)), ("mm.2.bias", vec(N_EMBD_TEXT)),
            ("v.token_embd.img_break", vec(N_EMBD_TEXT, 0.5))]
    return out


def write_mmproj(merge: int) -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(MMPROJS[merge], "clip")
    writer.add_name(f"{STEM} vision" + (f" merge {merge}" if merge > 1 else ""))
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type("pixtral")
    writer.add_clip_vision_projector_type("pixtral")
    writer.add_vision_image_size(IMAGE_SIZE)
    writer.add_vision_patch_size(PATCH)
    writer.add_vision_embedding_length(N_EMBD_V)
    writer.add_vision_feed_forward_length(N_FF_V)
    writer.add_vision_block_count(N_LAYER_V)
    writer.add_vision_head_count(N_HEAD_V)
    writer.add_vision_attention_layernorm_eps(EPS)
    writer.add_vision_projection_dim(N_EMBD_TEXT)
    writer.add_vision_image_mean(list(MEAN))
    writer.add_vision_image_std(list(STD))
    writer.add_vision_use_silu(True)
    if merge > 1:
        writer.add_vision_spatial_merge_size(merge)
    for name, data in mmproj_tensors(np.random.default_rng(310 + merge), merge):
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_image(width: int, height: int, seed: int) -> np.ndarray:
    """uint8 RGB [height, width, 3]: a gradient per channel plus seeded noise."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 5, y * 8, (x + y) * 3], axis=-1).astype(np.float64)
    noise = np.random.default_rng(seed).integers(0, 60, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_images() -> None:
    from PIL import Image
    for seed, (path, width, height) in enumerate(IMAGES.values(), start=33):
        Image.fromarray(test_image(width, height, seed), "RGB").save(path, format="PNG")


PROMPT = "Look at this: {marker} What is in the picture?"   # {marker}: where the image goes


def record() -> None:
    """llama.cpp's embeddings and the logits after PROMPT for each of CASES, into EMBD."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(TEXT).encode(), params)
    cases = [{"mmproj": MMPROJS[merge].name, "image": IMAGES[name][0].name,
              **clean(record_clean_case(llama_cpp, model, MMPROJS[merge], IMAGES[name][0].read_bytes()))}
             for merge, name in CASES]
    head = json.dumps({"source": f"llama-cpp-python {llama_cpp.__version__} libmtmd, 2 threads",
                       "prompt": PROMPT, "n_embd": N_EMBD_TEXT})
    body = ",\n".join(json.dumps(case) for case in cases)   # one case a line
    EMBD.write_text(f'{head[:-1]}, "cases": [\n{body}]}}\n')
    print(f"recorded {len(cases)} cases into {EMBD}")


def clean(recorded: tuple[dict | None, str]) -> dict:
    case, note = recorded
    if case is None:
        raise SystemExit(note)
    return case


def record_case(llama_cpp, model, mmproj: Path, data: bytes, prompt: str = PROMPT, logits: bool = True) -> dict:
    """mtmd_record.record_case with this model's width, the embeddings as lists."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mtmd_record import record_case as mtmd_case

    case = mtmd_case(llama_cpp, model, mmproj, data, prompt, N_EMBD_TEXT, logits=logits)
    return {**case, "embeddings": [[float(v) for v in row] for row in case["embeddings"]]}


def record_clean_case(llama_cpp, model, mmproj: Path, png: bytes, prompt: str = PROMPT,
                      logits: bool = True) -> tuple[dict | None, str]:
    """record_case, again where llama.cpp's rows or logits hold NaNs: its pixtral graph
    makes the [IMG_BREAK] rows by scaling a fresh (uninitialised) tensor by 0 and adding
    the embedding, and 0 * a NaN left in that memory stays NaN - now and then, run to
    run (the logits come from a second encoding, mtmd_helper_eval_chunks's, which may
    be hit when the first was not).  (the case or None after RETRIES tries, a note)"""
    bad_rows: list[int] = []
    for attempt in range(RETRIES):
        case = record_case(llama_cpp, model, mmproj, png, prompt, logits=logits)
        rows = np.array(case["embeddings"])
        top = np.array([v for _, v in case["top_logits"] or ()])
        if not np.isnan(rows).any() and not np.isnan(top).any():
            return case, f" (llama.cpp's NaN rows: {attempt} retries)" if attempt else ""
        bad_rows = [int(r) for r in np.nonzero(np.isnan(rows).any(axis=1))[0]]
    return None, f"llama.cpp gave NaNs {RETRIES} times (rows {bad_rows[:8]} of the image)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="record llama.cpp's embeddings (needs llama_cpp)")
    args = parser.parse_args()
    if args.record:
        record()
        return
    VISION_DIR.mkdir(parents=True, exist_ok=True)
    write_text_model()
    for merge in MMPROJS:
        write_mmproj(merge)
    write_images()
    print(f"wrote {TEXT.name}, {', '.join(p.name for p in MMPROJS.values())} and the images into {VISION_DIR}")


if __name__ == "__main__":
    main()
