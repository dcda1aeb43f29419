"""Embedding throughput: many short texts in one request, pyengine beside llama.cpp.

    python benchmarks/embedding.py smollm2-135m --texts 256 --threads 2 --rounds 3
    python benchmarks/embedding.py smollm2-135m --pyengine-python OTHER_CHECKOUT/.venv/bin/python \
        --llamacpp-python VENV_WITH_LLAMA_CPP/bin/python

Each engine embeds the same texts (mean pooling, normalised) in a fresh process:
pyengine through `LLM.embed(list)` (the interpreter given by --pyengine-python, so an
older checkout can be measured beside this one), llama.cpp through llama-cpp-python's
`Llama(embedding=True, n_seq_max=...).embed(list)`, which packs the texts into batches
of several sequences.  The engines alternate round by round so that machine noise hits
them alike.  Prints tokens/s (the tokens each engine counted), the ratio, and the
lowest cosine similarity between the two engines' vectors."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TOPICS = ("the weather", "a football match", "stock prices", "a new phone", "the cat", "a train delay",
          "the election", "a recipe for soup", "quantum physics", "a rock concert", "the garden", "tax forms")


def texts(n: int) -> list[str]:
    """`n` short, distinct sentences (6-12 words)."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        out.append(f"Note {i}: someone wrote a few words about {topic} on day {i % 31 + 1}.")
    return out


def worker_pyengine(path: str, threads: int, n_texts: int, n_batch: int, vectors_to: str) -> dict:
    import numpy as np

    from pyengine import LLM

    inputs = texts(n_texts)
    with LLM(path, n_ctx=512, n_threads=threads, n_batch=n_batch) as llm:
        llm.embed(inputs[:4])   # warm up: graphs built, pages touched
        t = time.perf_counter()
        vectors, count = llm.embed(inputs, return_count=True)
        seconds = time.perf_counter() - t
    np.save(vectors_to, np.asarray(vectors, np.float32))
    return {"tps": count / seconds, "tokens": count, "seconds": seconds}


def worker_llamacpp(path: str, threads: int, n_texts: int, n_batch: int, vectors_to: str) -> dict:
    import numpy as np
    from llama_cpp import LLAMA_POOLING_TYPE_MEAN, Llama

    inputs = texts(n_texts)
    llm = Llama(model_path=path, embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN, n_ctx=n_batch * 4,
                n_batch=n_batch, n_ubatch=n_batch, n_seq_max=64, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    llm.embed(inputs[:4])
    t = time.perf_counter()
    vectors, count = llm.embed(inputs, normalize=True, return_count=True)
    seconds = time.perf_counter() - t
    np.save(vectors_to, np.asarray(vectors, np.float32))
    return {"tps": count / seconds, "tokens": count, "seconds": seconds}


WORKERS = {"pyengine": worker_pyengine, "llamacpp": worker_llamacpp}


def run_worker(python: str, engine: str, path: str, args, vectors_to: str) -> dict:
    cmd = [python, os.path.abspath(__file__), "--worker", engine, path, "--threads", str(args.threads),
           "--texts", str(args.texts), "--batch", str(args.batch), "--vectors-to", vectors_to]
    # outside the checkout, so a child imports the pyengine its interpreter has installed
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir(), check=False)
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pyengine-python", default=sys.executable)
    parser.add_argument("--llamacpp-python", default=sys.executable,
                        help="the interpreter that imports llama_cpp (default: this one)")
    parser.add_argument("--worker", choices=sorted(WORKERS))
    parser.add_argument("--vectors-to")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args.model, args.threads, args.texts, args.batch, args.vectors_to)))
        return 0
    import numpy as np

    from pyengine.store import resolve_model

    path = str(resolve_model(args.model))
    pythons = {"pyengine": args.pyengine_python, "llamacpp": args.llamacpp_python}
    results: dict[str, list[dict]] = {name: [] for name in pythons}
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: os.path.join(tmp, f"{name}.npy") for name in pythons}
        for _ in range(args.rounds):
            for name, python in pythons.items():
                results[name].append(run_worker(python, name, path, args, files[name]))
        ours, theirs = np.load(files["pyengine"]), np.load(files["llamacpp"])
    cosine = float(np.min(np.sum(ours * theirs, axis=1)))
    tps = {name: statistics.median(r["tps"] for r in rs) for name, rs in results.items()}
    for name, rs in results.items():
        rounds = ", ".join(f"{r['tps']:.0f}" for r in rs)
        print(f"{name:9s} {tps[name]:9.0f} tokens/s (median of {len(rs)}; {rs[0]['tokens']} tokens; "
              f"rounds {rounds})")
    print(f"ratio pyengine/llama.cpp: {tps['pyengine'] / tps['llamacpp']:.2f}x; lowest cosine {cosine:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
