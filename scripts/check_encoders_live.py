"""Compare pyengine's encoders with llama.cpp live, on texts no golden file holds.

For each synthetic encoder (tests/data/synth/encoders): the pooled, L2-normalised
vector of every text (the file's pooling type) from llama.cpp's embedding mode and
from pyengine (pooled here with numpy); prints the cosines and the tokenizations'
agreement, and exits non-zero when a cosine is below 0.999.  Needs llama-cpp-python:

    PYTHONPATH=/path/to/llama_cpp_site_packages python scripts/check_encoders_live.py
"""

from __future__ import annotations

import json
import sys

import numpy as np

import synth_encoders as enc

TEXTS = [
    "What is the capital of France?",
    "Zürich, São Paulo and Kraków are cities.",
    "北京 上京 東京 — 中文字 日本語!",
    "email me at someone@example.com (or not).",
    "Repeated repeated REPEATED words words.",
    "x = [1, 2, 3]; y = {'a': 4}",
    "The snow fell on the mountain river at night, and the moon was light.",
    "unknownwordsthatarelong plus ????!!!",
    "résumé naïve café ÀÉÎÕÜ",
    "one",
]


def pyengine_pooled(path, kind: str, texts: list[str]) -> tuple[list[np.ndarray], list[list[int]]]:
    from pyengine.gguf import GGUFFile
    from pyengine.kvcache import KVCache
    from pyengine.ml.context import Backend
    from pyengine.models import load_model
    from pyengine.runner.forward import Forward
    from pyengine.tokenizer import Tokenizer

    f = GGUFFile(path)
    model, tok = load_model(f), Tokenizer.from_gguf(f)
    fw = Forward(model, Backend(2), KVCache(model.cache_layout(), 256))
    vectors, tokens = [], []
    for text in texts:
        ids = tok.encode(text, add_special=True)
        n = len(ids)
        h = fw.hidden(np.array(ids, np.int32), np.arange(n), np.zeros(n, np.int64), np.arange(n)).copy()
        fw.cache.remove(0)
        v = h.mean(axis=0) if kind == "mean" else h[0]
        vectors.append(v / np.linalg.norm(v))
        tokens.append(ids)
    return vectors, tokens


def main() -> int:
    from llama_cpp import LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_MEAN, Llama

    worst = 1.0
    for path in sorted(enc.SYNTH_DIR.glob("*.gguf")):
        kind = json.loads((enc.GOLDEN_DIR / f"{path.stem}.json").read_text())["pooling"]
        llm = Llama(str(path), embedding=True, verbose=False, n_ctx=128, n_batch=128, n_ubatch=128, n_threads=2,
                    pooling_type=LLAMA_POOLING_TYPE_MEAN if kind == "mean" else LLAMA_POOLING_TYPE_CLS)
        mine, mine_tokens = pyengine_pooled(path, kind, TEXTS)
        cos = [float(np.dot(m, llm.embed(t, normalize=True))) for m, t in zip(mine, TEXTS)]
        same_tokens = sum(llm.tokenize(t.encode()) == ids for t, ids in zip(TEXTS, mine_tokens))
        worst = min(worst, *cos)
        print(f"{path.stem:22s} {kind:4s} tokens equal {same_tokens}/{len(TEXTS)}  cosine min {min(cos):.6f} "
              f"mean {np.mean(cos):.6f}")
    return 0 if worst >= 0.999 else 1


if __name__ == "__main__":
    sys.exit(main())
