"""What the synthetic Qwen-VL scripts (make_synth_qwen25vl.py, make_synth_qwen3vl.py)
share: their test images, llama.cpp's recording through libmtmd (embeddings, token
grid, the text around the image, top-10 logits after the prompt, on 2 threads) and
the live check of pyengine against libmtmd on new images.

A script describes its model as a `VLModel` and passes it in.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class VLModel:
    text: Path         # the text model's GGUF
    mmproj: Path       # its mmproj
    embd: Path         # the recording (.embd.json)
    images: dict       # name: (height, width, seed)
    image_path: object  # name -> Path of the test image
    prompt: str        # "{marker}" where the image goes
    n_embd: int        # width of each image row the tower hands over


class Draw:
    """Random mmproj tensors in numpy order, drawn from `rng` in the order asked for:
    matrices and patch kernels in F16, biases and norms in F32."""

    def __init__(self, rng: np.random.Generator, n_embd: int, patch: int) -> None:
        self.rng, self.n_embd, self.patch = rng, n_embd, patch

    def mat(self, n_out: int, n_in: int, std: float = 0.15) -> np.ndarray:
        return (self.rng.standard_normal((n_out, n_in)) * std).astype(np.float16)

    def vec(self, n: int, std: float = 0.05) -> np.ndarray:
        return (self.rng.standard_normal(n) * std).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def kernel(self) -> np.ndarray:
        return (self.rng.standard_normal((self.n_embd, 3, self.patch, self.patch)) * 0.1).astype(np.float16)

    def merger(self, n_embd_text: int, *, ln_bias: bool) -> list[tuple[str, np.ndarray]]:
        """The patch merger's tensors: its norm (with a bias or not), mm.0 and mm.2."""
        merged = 4 * self.n_embd
        out = [("v.post_ln.weight", self.norm(self.n_embd))]
        if ln_bias:
            out.append(("v.post_ln.bias", self.vec(self.n_embd)))
        return out + [("mm.0.weight", self.mat(merged, merged, 0.1)), ("mm.0.bias", self.vec(merged)),
                      ("mm.2.weight", self.mat(n_embd_text, merged, 0.1)), ("mm.2.bias", self.vec(n_embd_text))]


def write_mmproj(path: Path, stem: str, projector: str, *, image_size: int, patch: int, n_embd: int, n_ff: int,
                 n_layer: int, n_head: int, n_embd_text: int, mean, std, tensors: list, extra=None) -> None:
    """An mmproj of `projector` with the keys the Qwen towers share; extra(writer) adds the
    tower's own keys."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "clip")
    writer.add_name(f"{stem} vision")
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(projector)
    writer.add_clip_vision_projector_type(projector)
    writer.add_vision_image_size(image_size)
    writer.add_vision_patch_size(patch)
    writer.add_vision_embedding_length(n_embd)
    writer.add_vision_feed_forward_length(n_ff)
    writer.add_vision_block_count(n_layer)
    writer.add_vision_head_count(n_head)
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_projection_dim(n_embd_text)
    writer.add_vision_image_mean(list(mean))
    writer.add_vision_image_std(list(std))
    if extra is not None:
        extra(writer)
    for name, data in tensors:
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


def write_images(m: VLModel) -> None:
    from PIL import Image
    for name, (h, w, seed) in m.images.items():
        Image.fromarray(test_image(h, w, seed), "RGB").save(m.image_path(name), format="PNG")


def mtmd_context(m: VLModel):
    """(llama_cpp, mtmd, mtmd context, text model) as the recording loads them."""
    import llama_cpp
    from llama_cpp import mtmd_cpp as mtmd

    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(m.text).encode(), params)
    cparams = mtmd.mtmd_context_params_default()
    cparams.use_gpu, cparams.n_threads, cparams.warmup, cparams.print_timings = False, 2, False, False
    cparams.flash_attn_type = 0   # the tower's attention in F32 (flash attention casts K and V to F16)
    ctx = mtmd.mtmd_init_from_file(str(m.mmproj).encode(), model, cparams)
    if not ctx:
        raise SystemExit("mtmd_init_from_file failed")
    return llama_cpp, mtmd, ctx, model


def mtmd_run(m: VLModel, llama_cpp, mtmd, ctx, model, data: bytes) -> tuple[list[dict], np.ndarray, list]:
    """(prompt segments with each image's token grid and positions, the image's embeddings,
    top-10 logits after the prompt) of one image."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mtmd_record

    def grid(chunk) -> dict:
        tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
        return {"grid": [int(mtmd.mtmd_image_tokens_get_ny(tokens)), int(mtmd.mtmd_image_tokens_get_nx(tokens))],
                "n_pos": int(mtmd.mtmd_input_chunk_get_n_pos(chunk))}

    chunks, bitmap, segments, blocks = mtmd_record.run_chunks(mtmd, ctx, data, m.prompt, m.n_embd, grid)
    top = mtmd_record.top_logits_after(llama_cpp, mtmd, ctx, model, chunks)
    mtmd_record.free_chunks(mtmd, chunks, bitmap)
    return segments, blocks[-1], top


def record(m: VLModel) -> None:
    """Per image: libmtmd's embeddings, grid, prompt segments and the logits after the prompt."""
    llama_cpp, mtmd, ctx, model = mtmd_context(m)
    recorded = {}
    for name in m.images:
        segments, rows, top = mtmd_run(m, llama_cpp, mtmd, ctx, model, m.image_path(name).read_bytes())
        recorded[name] = {"image": m.image_path(name).name, "segments": segments, "top_logits": top,
                          "embeddings": [[float(v) for v in row] for row in rows]}
        print(f"{name}: {len(rows)} x {m.n_embd} embeddings, grid {segments[1]['grid']}")
    head = {"source": f"llama-cpp-python {llama_cpp.__version__} libmtmd, 2 threads", "prompt": m.prompt,
            "n_embd": m.n_embd}
    lines = [json.dumps(head)[:-1] + ', "images": {']
    for k, (name, d) in enumerate(recorded.items()):   # one image token a line
        body = ",\n".join(json.dumps(row) for row in d.pop("embeddings"))
        lines.append(f'{json.dumps(name)}: {json.dumps(d)[:-1]}, "embeddings": [\n{body}]}}'
                     + ("," if k + 1 < len(recorded) else ""))
    m.embd.write_text("\n".join(lines) + "}}\n")
    print(f"recorded into {m.embd}")


def live(m: VLModel, count: int) -> int:
    """pyengine against libmtmd on `count` seeded random images of random sizes (none
    recorded): the embeddings' relative difference and, through pyengine's engine,
    the first token's top-10 log-probabilities against llama.cpp's logits (both taken
    relative to the best token).  Run by pyengine's Python with llama_cpp on PYTHONPATH."""
    import io

    from PIL import Image

    from pyengine.api import LLM
    from pyengine.sample import SamplingOptions

    llama_cpp, mtmd, ctx, model = mtmd_context(m)
    rng = np.random.default_rng(7)
    worst_embd = worst_top = 0.0
    argmax_ok = 0
    with LLM(m.text, n_ctx=512, n_threads=2, mmproj=m.mmproj) as llm:
        for k in range(count):
            h, w = (int(v) for v in rng.integers(20, 300, 2))
            buf = io.BytesIO()
            Image.fromarray(test_image(h, w, 100 + k), "RGB").save(buf, format="PNG")
            data = buf.getvalue()
            segments, rows, top = mtmd_run(m, llama_cpp, mtmd, ctx, model, data)
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


def main(m: VLModel, doc: str, write) -> None:
    """The scripts' command line: write the model and images (`write()`), --record or --live N."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="record llama.cpp's outputs (needs llama_cpp)")
    parser.add_argument("--live", type=int, metavar="N", help="check pyengine against libmtmd on N new images")
    args = parser.parse_args()
    if args.record:
        record(m)
        return
    if args.live:
        raise SystemExit(live(m, args.live))
    m.text.parent.mkdir(parents=True, exist_ok=True)
    write()
    write_images(m)
    print(f"wrote the model and the test images into {m.text.parent}")
