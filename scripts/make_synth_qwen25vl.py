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

import argparse
import json
import sys
from pathlib import Path

import numpy as np

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


def write_text_model() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
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
    def mat(n_out, n_in, std=0.15):
        return (rng.standard_normal((n_out, n_in)) * std).astype(np.float16)

    def vec(n, std=0.05):
        return (rng.standard_normal(n) * std).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def kernel():
        return (rng.standard_normal((N_EMBD_V, 3, PATCH, PATCH)) * 0.1).astype(np.float16)

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
    merged = 4 * N_EMBD_V
    out += [("v.post_ln.weight", norm(N_EMBD_V)),
            ("mm.0.weight", mat(merged, merged, 0.1)), ("mm.0.bias", vec(merged)),
            ("mm.2.weight", mat(N_EMBD_TEXT, merged, 0.1)), ("mm.2.bias", vec(N_EMBD_TEXT))]
    return out


def write_mmproj() -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(MMPROJ, "clip")
    writer.add_name(f"{STEM} vision")
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type("qwen2.5vl_merger")
    writer.add_clip_vision_projector_type("qwen2.5vl_merger")
    writer.add_vision_image_size(128)
    writer.add_vision_patch_size(PATCH)
    writer.add_vision_embedding_length(N_EMBD_V)
    writer.add_vision_feed_forward_length(N_FF_V)
    writer.add_vision_block_count(N_LAYER_V)
    writer.add_vision_head_count(N_HEAD_V)
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_projection_dim(N_EMBD_TEXT)
    writer.add_vision_image_mean(list(MEAN))
    writer.add_vision_image_std(list(STD))
    writer.add_vision_use_silu(True)
    writer.add_vision_n_wa_pattern(WA_PATTERN)
    for name, data in mmproj_tensors(np.random.default_rng(51)):
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_image(height: int, width: int, seed: int) -> np.ndarray:
    """uint8 RGB [height, width, 3]: a gradient per channel plus seeded noise."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 1.4, y * 1.9, (x + y) * 0.8], axis=-1).astype(np.float64)
    noise = np.random.default_rng(seed).integers(0, 60, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_images() -> None:
    from PIL import Image
    for name, (h, w, seed) in IMAGES.items():
        Image.fromarray(test_image(h, w, seed), "RGB").save(image_path(name), format="PNG")


def mtmd_context():
    """(llama_cpp, mtmd, mtmd context, text model) as the recording loads them."""
    import llama_cpp
    from llama_cpp import mtmd_cpp as mtmd

    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(TEXT).encode(), params)
    cparams = mtmd.mtmd_context_params_default()
    cparams.use_gpu, cparams.n_threads, cparams.warmup, cparams.print_timings = False, 2, False, False
    cparams.flash_attn_type = 0   # the tower's attention in F32 (flash attention casts K and V to F16)
    ctx = mtmd.mtmd_init_from_file(str(MMPROJ).encode(), model, cparams)
    if not ctx:
        raise SystemExit("mtmd_init_from_file failed")
    return llama_cpp, mtmd, ctx, model


def mtmd_run(llama_cpp, mtmd, ctx, model, data: bytes) -> tuple[list[dict], np.ndarray, list]:
    """(prompt segments with each image's token grid and positions, the image's embeddings,
    top-10 logits after PROMPT) of one image."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mtmd_record

    def grid(chunk) -> dict:
        tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
        return {"grid": [int(mtmd.mtmd_image_tokens_get_ny(tokens)), int(mtmd.mtmd_image_tokens_get_nx(tokens))],
                "n_pos": int(mtmd.mtmd_input_chunk_get_n_pos(chunk))}

    chunks, bitmap, segments, blocks = mtmd_record.run_chunks(mtmd, ctx, data, PROMPT, N_EMBD_TEXT, grid)
    top = mtmd_record.top_logits_after(llama_cpp, mtmd, ctx, model, chunks)
    mtmd_record.free_chunks(mtmd, chunks, bitmap)
    return segments, blocks[-1], top


def record() -> None:
    """Per image: libmtmd's embeddings, grid, prompt segments and the logits after PROMPT."""
    llama_cpp, mtmd, ctx, model = mtmd_context()
    recorded = {}
    for name in IMAGES:
        segments, rows, top = mtmd_run(llama_cpp, mtmd, ctx, model, image_path(name).read_bytes())
        recorded[name] = {"image": image_path(name).name, "segments": segments, "top_logits": top,
                          "embeddings": [[float(v) for v in row] for row in rows]}
        print(f"{name}: {len(rows)} x {N_EMBD_TEXT} embeddings, grid {segments[1]['grid']}")
    head = {"source": f"llama-cpp-python {llama_cpp.__version__} libmtmd, 2 threads", "prompt": PROMPT,
            "n_embd": N_EMBD_TEXT}
    lines = [json.dumps(head)[:-1] + ', "images": {']
    for k, (name, d) in enumerate(recorded.items()):   # one image token a line
        body = ",\n".join(json.dumps(row) for row in d.pop("embeddings"))
        lines.append(f'{json.dumps(name)}: {json.dumps(d)[:-1]}, "embeddings": [\n{body}]}}'
                     + ("," if k + 1 < len(recorded) else ""))
    EMBD.write_text("\n".join(lines) + "}}\n")
    print(f"recorded into {EMBD}")


def live(count: int) -> int:
    """pyengine against libmtmd on `count` seeded random images of random sizes (none
    recorded): the embeddings' relative difference and, through pyengine's engine,
    the first token's top-10 log-probabilities against llama.cpp's logits (both taken
    relative to the best token).  Run by pyengine's Python with llama_cpp on PYTHONPATH."""
    import io

    from PIL import Image

    from pyengine.api import LLM
    from pyengine.sample import SamplingOptions

    llama_cpp, mtmd, ctx, model = mtmd_context()
    rng = np.random.default_rng(7)
    worst_embd = worst_top = 0.0
    argmax_ok = 0
    with LLM(TEXT, n_ctx=512, n_threads=2, mmproj=MMPROJ) as llm:
        for k in range(count):
            h, w = (int(v) for v in rng.integers(20, 300, 2))
            buf = io.BytesIO()
            Image.fromarray(test_image(h, w, 100 + k), "RGB").save(buf, format="PNG")
            data = buf.getvalue()
            segments, rows, top = mtmd_run(llama_cpp, mtmd, ctx, model, data)
            ours = llm.projector.embed(data)
            embd = float(np.abs(ours.reshape(rows.shape) - rows).max() / np.abs(rows).max())
            ids, images = [], []
            for seg in segments:
                if "tokens" in seg:
                    ids += seg["tokens"]
                else:
                    images.append((len(ids), ours))
                    ids += [0] * seg["image"]
            handle = llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True,
                                       top_logprobs=20, images=images)
            done = handle.result()
            best, best_logit = top[0]
            if not done.logprobs:   # the first token ended the generation: no log-probabilities come
                argmax_ok += done.finish_reason == "stop" and best in llm.engine.eog_ids
                print(f"{h:4d}x{w:<4d} grid {segments[1]['grid']}: embeddings {embd:.2e}, first token an "
                      f"end of generation (llama.cpp's best: {best})")
                worst_embd = max(worst_embd, embd)
                continue
            mine = dict(done.logprobs[0].top)
            argmax_ok += next(iter(mine)) == best
            # a token of llama.cpp's 10 best missing from pyengine's 20 best counts as infinitely far
            dist = max(abs((mine[t] - mine[best]) - (v - best_logit)) if t in mine and best in mine
                       else float("inf") for t, v in top)
            worst_embd, worst_top = max(worst_embd, embd), max(worst_top, dist)
            print(f"{h:4d}x{w:<4d} grid {segments[1]['grid']}: embeddings {embd:.2e}, top-10 {dist:.4f}")
    print(f"all: embeddings worst {worst_embd:.2e} (bound 1e-3), first token argmax {argmax_ok}/{count}, "
          f"worst top-10 {worst_top:.4f} (bound 0.05)")
    return 0 if worst_embd < 1e-3 and worst_top < 0.05 and argmax_ok == count else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="record llama.cpp's outputs (needs llama_cpp)")
    parser.add_argument("--live", type=int, metavar="N", help="check pyengine against libmtmd on N new images")
    args = parser.parse_args()
    if args.record:
        record()
        return
    if args.live:
        raise SystemExit(live(args.live))
    VISION_DIR.mkdir(parents=True, exist_ok=True)
    write_text_model()
    write_mmproj()
    write_images()
    print(f"wrote {TEXT.name}, {MMPROJ.name} and the test images into {VISION_DIR}")


if __name__ == "__main__":
    main()
