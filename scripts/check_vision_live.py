"""pyengine's vision projector against llama.cpp's libmtmd, run live, on images and
prompts no recording holds.

For `--count` seeded random images (sizes spread over wide, tall, square and small
ones, noise over gradients) and prompts (random words around the image marker), it
runs libmtmd (make_synth_vision.mtmd_run: mtmd_tokenize, mtmd_encode_chunk per image
chunk, mtmd_helper_eval_chunks) and pyengine (LLM(text, mmproj=...): the projector's
pieces, the engine's first token), and prints per case whether the prompt was cut
into the same tokens and row blocks, the image embeddings' largest difference
relative to their largest value (bound 1e-3), and the largest difference over
llama.cpp's 10 best logits of the first token (bound 0.05, both taken relative to
the best token's) and whether the best first token is the same.

    PYTHONPATH=<dir holding llama_cpp> python scripts/check_vision_live.py \\
        tests/data/vision/smolvlm-tiny.gguf tests/data/vision/smolvlm-tiny.mmproj.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_synth_vision  # noqa: E402  (mtmd_run)

TOP = 20   # our best logits read (the most a request gets): llama.cpp's 10 best are among them unless far off
WORDS = ["the", "cat", "picture", "what", "is", "in", "this", "look", "at", "colour", "shape", "describe"]


SHAPES = [(40, 100), (90, 30), (64, 64), (17, 23), (120, 45), (33, 70), (96, 96), (50, 20)]   # (height, width)


def case_image(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    h, w = shape
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * rng.uniform(1, 5), y * rng.uniform(1, 5), (x + y) * rng.uniform(0.5, 3)], axis=-1)
    return np.clip(base + rng.integers(0, 90, base.shape), 0, 255).astype(np.uint8)


def case_prompt(rng: np.random.Generator) -> str:
    def words(n):
        return " ".join(rng.choice(WORDS, n))
    return f"{words(rng.integers(1, 6))} {{marker}} {words(rng.integers(1, 8))}?"


def ours(llm, png: bytes, prompt: str):
    from pyengine.sample import SamplingOptions
    from pyengine.vision.prompt import MARKER, encode_with_images

    def first(piece: str) -> list[int]:
        return llm.tokenizer.encode(piece, add_special=True, parse_special=True)

    ids, spans = encode_with_images(llm.tokenizer, first, prompt.format(marker=MARKER), [png], llm.projector)
    handle = llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True, top_logprobs=TOP,
                               images=spans)
    return ids, spans, dict(handle.result().logprobs[0].top)


def compare(llm, text: Path, mmproj: Path, rgb: np.ndarray, prompt: str) -> tuple[bool, bool, float, float]:
    """(prompt cut alike, same best first token, embeddings' relative difference, top-10 logits' difference)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    png = buf.getvalue()
    theirs = make_synth_vision.mtmd_run(text, mmproj, png, prompt, llm.projector.n_embd, n_ctx=llm.n_ctx)
    ids, spans, top = ours(llm, png, prompt)
    expected = [t for seg in theirs["segments"] for t in seg.get("tokens", [0] * seg.get("image", 0))]
    same_cut = ids == expected and [len(r) for _, r in spans] == [len(b) for b in theirs["blocks"]]
    rows, rec = np.concatenate([r for _, r in spans]), np.concatenate(theirs["blocks"])
    embd = float(np.abs(rows - rec).max() / np.abs(rec).max()) if rows.shape == rec.shape else np.inf
    best, best_logit = theirs["top_logits"][0]
    logits = max(abs((top[t] - top[best]) - (v - best_logit)) if t in top and best in top else np.inf
                 for t, v in theirs["top_logits"])   # log-probabilities: relative to the best token's
    return same_cut, next(iter(top)) == best, embd, logits


def main(argv: list[str]) -> int:
    from pyengine.api import LLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", type=Path)
    parser.add_argument("mmproj", type=Path)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--n-ctx", type=int, default=512)
    parser.add_argument("--shapes", default=None, help="image sizes WxH,WxH,... in place of the default spread")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    worst_embd = worst_logits = 0.0
    all_cut, n_best = True, 0
    shapes = [tuple(int(v) for v in s.split("x"))[::-1] for s in args.shapes.split(",")] if args.shapes else SHAPES
    with LLM(args.text, n_ctx=args.n_ctx, n_threads=2, mmproj=args.mmproj) as llm:
        for i in range(args.count):
            rgb, prompt = case_image(rng, shapes[i % len(shapes)]), case_prompt(rng)
            same_cut, same_best, embd, logits = compare(llm, args.text, args.mmproj, rgb, prompt)
            all_cut, n_best = all_cut and same_cut, n_best + same_best
            worst_embd, worst_logits = max(worst_embd, embd), max(worst_logits, logits)
            print(f"image {rgb.shape[1]}x{rgb.shape[0]}: prompt cut alike {same_cut}, same first token {same_best}, "
                  f"embeddings {embd:.2e}, top-10 logits {logits:.4f}")
    ok = all_cut and n_best >= 0.99 * args.count and worst_embd < 1e-3 and worst_logits < 0.05
    print(f"{args.count} cases: prompts cut alike {all_cut}, same first token {n_best}/{args.count}, worst "
          f"embeddings {worst_embd:.2e} (bound 1e-3), worst top-10 logits {worst_logits:.4f} (bound 0.05): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
