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
  <python with llama-cpp-python 0.3.36>), tests/data/vision/gemma3-tiny.embd.json:
  llama.cpp's embeddings of the test image through libmtmd
  (mtmd_helper_bitmap_init_from_buf, mtmd_tokenize, mtmd_encode_chunk,
  mtmd_get_output_embd), the token ids of the text around the image in PROMPT
  (with <start_of_image> / <end_of_image>, which this vocabulary spells as
  text), and the top-10 logits after the whole prompt
  (mtmd_helper_eval_chunks: the image's rows attend both ways), on 2 threads.

    python scripts/make_synth_vision.py
    <python with llama-cpp-python 0.3.36> scripts/make_synth_vision.py --record
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


def mmproj_tensors(rng: np.random.Generator, image_size: int = IMAGE_SIZE,
                   patch: int = PATCH) -> list[tuple[str, np.ndarray]]:
    """(name, array in numpy order), drawn in this order from `rng`: the SigLIP tower
    (images of image_size cut into patch-pixel squares), then Gemma 3's mm.* tensors."""
    def mat(n_out, n_in, std=0.15):
        return (rng.standard_normal((n_out, n_in)) * std).astype(np.float16)

    def vec(n, std=0.05):
        return (rng.standard_normal(n) * std).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    n_patches = (image_size // patch) ** 2
    out = [("v.patch_embd.weight", (rng.standard_normal((N_EMBD_V, 3, patch, patch)) * 0.2).astype(np.float16)),
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
    write_siglip_mmproj(MMPROJ, "gemma3", mmproj_tensors(np.random.default_rng(31)), n_embd_text=N_EMBD_TEXT,
                        mean=MEAN, std=STD, scale_factor=POOL)


def write_siglip_mmproj(path: Path, kind: str, tensors, *, n_embd_text: int, mean, std, scale_factor: int,
                        more_keys=None, image_size: int = IMAGE_SIZE, patch: int = PATCH) -> None:
    """An mmproj of projector type `kind` for this script's SigLIP tower (its sizes), its
    keys in this order (more_keys(writer) adds any after them), then `tensors`."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "clip")
    writer.add_name(f"{path.name.removesuffix('.mmproj.gguf')} vision")
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(kind)
    writer.add_clip_vision_projector_type(kind)
    writer.add_vision_image_size(image_size)
    writer.add_vision_patch_size(patch)
    writer.add_vision_embedding_length(N_EMBD_V)
    writer.add_vision_feed_forward_length(N_FF_V)
    writer.add_vision_block_count(N_LAYER_V)
    writer.add_vision_head_count(N_HEAD_V)
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_projection_dim(n_embd_text)
    writer.add_vision_image_mean(list(mean))
    writer.add_vision_image_std(list(std))
    writer.add_vision_use_gelu(True)
    writer.add_vision_projector_scale_factor(scale_factor)
    if more_keys is not None:
        more_keys(writer)
    for name, data in tensors:
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
    run = mtmd_run(TEXT, MMPROJ, IMAGE.read_bytes(), PROMPT, N_EMBD_TEXT)
    (rows,) = run["blocks"]
    head = json.dumps({"source": run["source"], "image": IMAGE.name, "prompt": PROMPT, "segments": run["segments"],
                       "top_logits": run["top_logits"], "n_tokens": len(rows), "n_embd": N_EMBD_TEXT})
    body = ",\n".join(json.dumps([float(v) for v in row]) for row in rows)   # one image token a line
    EMBD.write_text(f'{head[:-1]}, "embeddings": [\n{body}]}}\n')
    print(f"recorded {len(rows)} x {N_EMBD_TEXT} embeddings and {len(run['top_logits'])} logits into {EMBD}")


def mtmd_run(text: Path, mmproj: Path, image: bytes, prompt: str, n_embd: int, n_ctx: int = 512) -> dict:
    """libmtmd's cut of `prompt` with `image` at its {marker} ({"tokens": ids} and
    {"image": n} segments), every image chunk's embeddings in order (mtmd_encode_chunk,
    mtmd_get_output_embd: "blocks") and the top-10 logits after the prompt, on 2 threads
    (mtmd_record.run_chunks, top_logits_after)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import llama_cpp
    import mtmd_record
    from llama_cpp import mtmd_cpp as mtmd

    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(text).encode(), params)
    cparams = mtmd.mtmd_context_params_default()
    cparams.use_gpu, cparams.n_threads, cparams.warmup, cparams.print_timings = False, 2, False, False
    ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), model, cparams)
    if not ctx:
        raise SystemExit("mtmd_init_from_file failed")
    chunks, bitmap, segments, blocks = mtmd_record.run_chunks(mtmd, ctx, image, prompt, n_embd)
    top = mtmd_record.top_logits_after(llama_cpp, mtmd, ctx, model, chunks, n_ctx=n_ctx)
    mtmd_record.free_chunks(mtmd, chunks, bitmap)
    return {"source": f"llama-cpp-python {llama_cpp.__version__} libmtmd, 2 threads",
            "segments": segments, "blocks": blocks, "top_logits": top}


def record_blocks(text: Path, mmproj: Path, png: Path, prompt: str, n_embd: int, out: Path) -> None:
    """mtmd_run's results for `png` in `prompt` into `out` as JSON: its segments, the
    block sizes, the top logits, and every image token's row on a line of its own, each
    value in the 9 digits that give its float32 back."""
    run = mtmd_run(text, mmproj, png.read_bytes(), prompt, n_embd)
    blocks = run.pop("blocks")
    rows = np.concatenate(blocks)
    head = json.dumps({**run, "image": png.name, "prompt": prompt, "blocks": [len(b) for b in blocks],
                       "n_tokens": len(rows), "n_embd": n_embd})
    body = ",\n".join("[" + ", ".join(f"{v:.9g}" for v in row) + "]" for row in rows)
    out.write_text(f'{head[:-1]}, "embeddings": [\n{body}]}}\n')
    print(f"recorded {len(blocks)} blocks, {len(rows)} x {n_embd} embeddings into {out}")


def extended_vocab(tok, normal: list[tuple[str, str]], control: list[str]) -> tuple[list, list, list]:
    """(tokens, token types, merges) of the GGUF tokenizer `tok` with `normal` tokens
    (piece, the merge that makes it) and `control` tokens (the special tokens llama.cpp's
    mtmd looks up or parses in an image's text) appended."""
    tokens = list(tok.fields["tokenizer.ggml.tokens"].contents())
    types = list(tok.fields["tokenizer.ggml.token_type"].contents())
    merges = list(tok.fields["tokenizer.ggml.merges"].contents())
    for piece, merge in normal:
        tokens.append(piece)
        types.append(1)
        merges.append(merge)
    tokens += control
    types += [3] * len(control)   # llama.cpp's CONTROL
    return tokens, types, merges


def finish_with_vocab(writer, tok, vocab: tuple[list, list, list], tensors, quantize_as=None) -> None:
    """synth_common.finish_q8_0_model with the tokenizer's tokens, types and merges replaced by `vocab`."""
    import synth_common as sc
    from gguf import LlamaFileType

    tokens, types, merges = vocab
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q8_0))
    changed = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges}
    for key, field in tok.fields.items():   # the source's keys in its order
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, changed.get(key, field.contents()), field.types[0], sub_type=sub)
    sc.add_q8_0_tensors(writer, tensors, quantize_as or sc.q8_0_matrices)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run_script(doc: str, record_them, make_them) -> None:
    """A vision synth script's command line: --record runs record_them(), else make_them()."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="record llama.cpp's embeddings (needs llama_cpp)")
    if parser.parse_args().record:
        record_them()
        return
    VISION_DIR.mkdir(parents=True, exist_ok=True)
    make_them()


def make() -> None:
    write_text_model()
    write_mmproj()
    write_image()
    print(f"wrote {TEXT.name}, {MMPROJ.name}, {IMAGE.name} into {VISION_DIR}")


if __name__ == "__main__":
    run_script(__doc__, record, make)
