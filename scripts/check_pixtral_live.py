"""pyengine's Pixtral tower and its image in the text model against llama.cpp's libmtmd,
run live, on images no recording holds.

Draws `--count` random images (seeded noise over gradients, sides from a few pixels -
scaled up to llama.cpp's 8-token floor - to past its 1024-token cap, every aspect),
embeds each through pyengine and through libmtmd (scripts/make_synth_pixtral.py's
record_clean_case: one of PROMPTS with the image in it, 2 threads), and prints per image
its size, its token count, the embeddings' largest difference over their largest
value, and the largest difference over llama.cpp's 10 best logits after the prompt
(the image's rows causal, as mtmd_helper_eval_chunks feeds them); then the worst
against the bounds (1e-3 relative, 0.05).

    PYTHONPATH=<dir holding llama_cpp> python scripts/check_pixtral_live.py \\
        tests/data/vision/pixtral-tiny.gguf tests/data/vision/pixtral-tiny.mmproj.gguf
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_synth_pixtral import PROMPT, ROOT, record_clean_case  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from test_vision_gemma3 import prompt_logits  # noqa: E402

# text before the image: in the random text model the rows of an image at the very start
# do not reach the logits after [IMG_END] (their attention weights underflow to 0 in
# both engines, which then agree to the bit), so such a prompt would check nothing
PROMPTS = (PROMPT, "Here, look: {marker}", "Two words about {marker}, then count to three: one, two,")


def random_png(rng: np.random.Generator, width: int, height: int) -> bytes:
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    slopes = rng.uniform(-4, 4, 3)
    base = np.stack([x * slopes[0], y * slopes[1], (x - y) * slopes[2]], axis=-1) + rng.uniform(0, 255, 3)
    pixels = np.clip(base + rng.integers(0, 80, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def sizes(rng: np.random.Generator, count: int) -> list[tuple[int, int]]:
    """The floor, a wide and a square image past the cap (their embeddings only: over
    1000 rows do not fit the recorder's 512 positions), then random ones that fit."""
    fixed = [(5, 3), (300, 160), (160, 160)]
    return (fixed + [(int(w), int(h)) for w, h in rng.integers(9, 84, (count, 2))])[:count]


def our_logits(text_model, segments, rows: np.ndarray) -> np.ndarray:
    """pyengine's logits after the segments libmtmd cut the prompt into (the image causal)."""
    from pyengine.kvcache import KVCache
    from pyengine.ml.context import Backend
    from pyengine.runner.forward import Forward

    n_total = sum(len(s["tokens"]) if "tokens" in s else s["image"] for s in segments)
    fw = Forward(text_model, Backend(2), KVCache(text_model.cache_layout(), n_total), max_tokens=n_total)
    return prompt_logits(fw, segments, rows, both_ways=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("mmproj", type=Path)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--seed", type=int, default=2029)
    args = parser.parse_args(argv)
    import llama_cpp

    from pyengine.gguf import GGUFFile
    from pyengine.models import load_model
    from pyengine.vision.projector import load_projector

    f = GGUFFile(args.model)
    text_model = load_model(f)
    projector = load_projector(args.mmproj, n_embd_text=text_model.cfg.n_embd)
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(args.model).encode(), params)
    rng = np.random.default_rng(args.seed)
    worst_embd = worst_top = 0.0
    skipped = 0
    for i, (width, height) in enumerate(sizes(rng, args.count)):
        png = random_png(rng, width, height)
        n_max = (width // 4 + 1) * (height // 4 + 1) * 1.1   # about the most tokens it can take
        theirs, retries = record_clean_case(llama_cpp, model, args.mmproj, png, PROMPTS[i % len(PROMPTS)], n_max < 460)
        if theirs is None:   # llama.cpp's bug, not a difference: counted and shown
            print(f"{width:4d}x{height:<4d} skipped: {retries}")
            skipped += 1
            continue
        want = np.array(theirs["embeddings"], np.float64)
        ours = projector.embed(png)
        if ours.shape != want.shape:
            print(f"{width}x{height}: {len(ours)} tokens, llama.cpp {len(want)}")
            return 1
        embd = float(np.abs(ours - want).max() / np.abs(want).max())
        worst_embd = max(worst_embd, embd)
        if theirs["top_logits"] is None:
            print(f"{width:4d}x{height:<4d} {len(ours):5d} tokens: embeddings {embd:.2e}{retries}")
            continue
        logits = our_logits(text_model, theirs["segments"], ours)
        top = float(max(abs(float(logits[t]) - v) for t, v in theirs["top_logits"]))
        same = int(np.argmax(logits)) == theirs["top_logits"][0][0]
        print(f"{width:4d}x{height:<4d} {len(ours):5d} tokens: embeddings {embd:.2e}, top-10 {top:.4f}, "
              f"argmax {'same' if same else 'DIFFERENT'}{retries}")
        worst_top = max(worst_top, top if same else float("inf"))
    ok = worst_embd < 1e-3 and worst_top < 0.05
    print(f"worst: embeddings {worst_embd:.2e} (bound 1e-3), top-10 {worst_top:.4f} (bound 0.05): "
          f"{'within' if ok else 'OUTSIDE'} the bounds; {skipped} of {args.count} images skipped (llama.cpp's NaNs)")
    projector.close()
    f.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
