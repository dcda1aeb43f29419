"""Compare pyengine's encoders with llama.cpp live, on texts no golden file holds.

For each synthetic encoder (tests/data/synth/encoders): the pooled, L2-normalised
vector of every text (the file's pooling type) from llama.cpp's embedding mode and
from pyengine (pooled here with numpy); prints the cosines and the tokenizations'
agreement; for a reranker (a file with a classification head) the order and scores
of a query against eight documents; exits non-zero when a cosine is below 0.999 or
a reranker's order differs or a score is more than 0.01 off.  Needs llama-cpp-python:

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


# a query and eight documents no golden file holds, for the rerankers (files with a head)
RERANK_QUERY = "where does the river run at night?"
RERANK_DOCUMENTS = [
    "The river runs through the city at night.",
    "A book about code and data.",
    "Moon light on the dark river.",
    "People play in the snow.",
    "The night is dark and the river is cold.",
    "Search for a small house.",
    "It was the first year of the new city.",
    "Run, learn, teach.",
]


def has_head(path) -> bool:
    """Whether the file is a cross-encoder (a classification head: cls or cls.output)."""
    from pyengine.gguf import GGUFFile

    return bool({"cls.weight", "cls.output.weight"} & set(GGUFFile(path).tensors))


def rerank_gap(path) -> float:
    """The largest gap between pyengine's and llama.cpp's scores of RERANK_QUERY against
    RERANK_DOCUMENTS (inf when the order differs), printed with both orders."""
    from llama_cpp import LLAMA_POOLING_TYPE_RANK, Llama

    from pyengine import LLM

    ranker = Llama(str(path), embedding=True, verbose=False, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2,
                   pooling_type=LLAMA_POOLING_TYPE_RANK)
    theirs = enc.record_rerank(ranker, RERANK_QUERY, RERANK_DOCUMENTS)["scores"]
    with LLM(str(path), n_ctx=256, n_batch=256, n_parallel=4) as llm:
        mine = {r["index"]: r["relevance_score"] for r in llm.rerank(RERANK_QUERY, RERANK_DOCUMENTS)}
    order_mine = sorted(mine, key=lambda i: -mine[i])
    order_theirs = sorted(range(len(theirs)), key=lambda i: -theirs[i])
    gap = max(abs(mine[i] - theirs[i]) for i in mine)
    swapped = [(i, j) for i in mine for j in mine if mine[i] > mine[j] and theirs[i] < theirs[j]]
    for i, j in swapped:   # a pair llama.cpp orders the other way: how close its own scores are
        print(f"  documents {i} and {j} swapped; llama.cpp's scores {abs(theirs[i] - theirs[j]):.4f} apart")
    print(f"{path.stem:22s} rerank order {'same' if order_mine == order_theirs else 'DIFFERENT'} "
          f"{order_mine}  max score gap {gap:.4f}\n  pyengine  {[round(mine[i], 4) for i in range(len(theirs))]}"
          f"\n  llama.cpp {[round(t, 4) for t in theirs]}")
    return gap if order_mine == order_theirs else float("inf")


def main() -> int:
    from llama_cpp import LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_MEAN, Llama

    worst, worst_gap = 1.0, 0.0
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
        if has_head(path):
            worst_gap = max(worst_gap, rerank_gap(path))
    return 0 if worst >= 0.999 and worst_gap <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
