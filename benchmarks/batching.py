"""Continuous batching: total generated tokens/s of N greedy generations run one at a
time and run concurrently (sharing the engine's batch loop), in alternating pairs, and
time to first token with and without a cached prompt prefix.  The prompts'
continuations run past 64 tokens without an end of text, so both ways generate the same
tokens.

    PYTHONPATH=. python benchmarks/batching.py [--model smollm2-135m] [--threads 2]
                                               [--tokens 64] [--parallel 4] [--repeat 3]
                                               [--llamacpp | --llamacpp-path DIR]

With --llamacpp (llama-cpp-python installed) or --llamacpp-path (a directory holding
a llama_cpp package, e.g. one built for AVX2 only), llama.cpp runs the same workload
afterwards in a child process: each sequence's prompt decoded as it arrives, then one
batch per step holding every sequence's last token, greedy on the returned logits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

PROMPTS = ["The capital of France", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three laws of robotics are", "Water boils at", "The history of France",
           "The best way to learn a language is", "The capital of France is Paris, and"]


def generate_concurrently(llm, prompts: list[str], n_tokens: int) -> tuple[int, float, float]:
    """Tokens generated, wall seconds and process CPU seconds for all prompts at once
    (one thread each).  CPU time is what to compare on a machine shared with others."""
    counts = [0] * len(prompts)

    def run(i: int) -> None:
        result = llm.submit(prompts[i], max_tokens=n_tokens, cache_prompt=False).result()
        counts[i] = result.completion_tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    start, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - start, time.process_time() - cpu


def one_at_a_time(llm, prompts: list[str], n_tokens: int) -> tuple[int, float, float]:
    """As generate_concurrently, each prompt waiting for the one before it."""
    tokens, seconds, cpu = 0, 0.0, 0.0
    for prompt in prompts:
        count, wall, used = generate_concurrently(llm, [prompt], n_tokens)
        tokens, seconds, cpu = tokens + count, seconds + wall, cpu + used
    return tokens, seconds, cpu


def alternating_rates(llm, prompts: list[str], n_tokens: int, repeat: int) -> list[tuple[float, float, float, float]]:
    """`repeat` pairs of runs, one at a time then concurrently, side by side so that a
    slow spell of a shared machine falls on both: per pair the tokens/s (wall) and CPU
    milliseconds per token of each."""
    pairs = []
    for _ in range(repeat):
        runs = []
        for run in (one_at_a_time, generate_concurrently):
            tokens, seconds, cpu = run(llm, prompts, n_tokens)
            runs += [tokens / seconds, cpu / tokens * 1000]
        pairs.append(tuple(runs))
    return pairs


def prefix_reuse(llm) -> tuple[float, float, int]:
    """Time to first token of a ~600-token prompt, then of one sharing all but its end."""
    text = " ".join(f"Item {i}: the {w} is on the table." for i, w in enumerate(
        ["apple", "book", "cup", "lamp", "pen", "phone", "key", "plate"] * 7))
    prefix = llm.tokenize(text)
    llm.engine.drop_cache()
    first = llm.submit(prefix + llm.tokenize(" First?", add_special=False), max_tokens=1).result()
    second = llm.submit(prefix + llm.tokenize(" Second?", add_special=False), max_tokens=1).result()
    return (first.queue_seconds + first.prompt_seconds, second.queue_seconds + second.prompt_seconds,
            second.cached_tokens)


class LlamaCppBatch:
    """The same workload on llama.cpp, through llama-cpp-python's low-level API: one
    context with a sequence per concurrent generation."""

    def __init__(self, path: str, n_threads: int, n_parallel: int, n_ctx: int) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=512, n_threads=n_threads,
                                   n_threads_batch=n_threads, verbose=False)
        params = self.llm.context_params
        params.n_ctx, params.n_seq_max = n_ctx * n_parallel, n_parallel
        # the context object frees its llama_context when collected: keep it
        self.context = _internals.LlamaContext(model=self.llm._model, params=params, verbose=False)
        self.batch = llama_cpp.llama_batch_init(512, 0, n_parallel)
        self.memory = llama_cpp.llama_get_memory(self.context.ctx)
        self.n_vocab = self.llm.n_vocab()

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) entries."""
        b = self.batch
        b.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        if self.lib.llama_decode(self.context.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def greedy(self, i: int) -> int:
        import numpy as np

        logits = self.lib.llama_get_logits_ith(self.context.ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.n_vocab,))))

    def generate(self, prompts: list[str], n_tokens: int) -> tuple[int, float]:
        """Tokens generated and wall seconds for all prompts at once."""
        self.lib.llama_memory_clear(self.memory, True)
        ids = [self.llm.tokenize(p.encode(), add_bos=True) for p in prompts]
        start = time.perf_counter()
        for seq, toks in enumerate(ids):
            self.decode([(t, pos, seq, pos == len(toks) - 1) for pos, t in enumerate(toks)])
            toks.append(self.greedy(len(toks) - 1))
        for _ in range(n_tokens - 1):
            self.decode([(toks[-1], len(toks) - 1, seq, True) for seq, toks in enumerate(ids)])
            for seq, toks in enumerate(ids):
                toks.append(self.greedy(seq))
        return n_tokens * len(prompts), time.perf_counter() - start


def llamacpp_pairs(args, path: str, prompts: list[str]) -> list[tuple[float, float]]:
    """In this process (the child): alternating one-at-a-time and concurrent rates."""
    engine = LlamaCppBatch(path, args.threads, args.parallel, 1024)
    engine.generate(prompts[:1], 4)
    pairs = []
    for _ in range(args.repeat):
        alone = [engine.generate([p], args.tokens) for p in prompts]
        together = engine.generate(prompts, args.tokens)
        pairs.append((sum(n for n, _ in alone) / sum(s for _, s in alone), together[0] / together[1]))
    return pairs


def run_llamacpp(args, path: str) -> list[tuple[float, float]] | None:
    """llamacpp_pairs in a child process (llama.cpp's own threads and memory)."""
    env = dict(os.environ)
    if args.llamacpp_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.llamacpp_path, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, __file__, "--llamacpp-worker", path, "--threads", str(args.threads),
           "--tokens", str(args.tokens), "--parallel", str(args.parallel), "--repeat", str(args.repeat)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        print(f"llama.cpp failed:\n{out.stderr[-1500:]}", file=sys.stderr)
        return None
    return [tuple(p) for p in json.loads(out.stdout.strip().splitlines()[-1])]


def report(name: str, pairs: list[tuple[float, ...]], parallel: int) -> None:
    """Best rates one at a time and concurrently (the first two of each pair), their ratio."""
    alone, together = max(p[0] for p in pairs), max(p[1] for p in pairs)
    ratios = sorted(p[1] / p[0] for p in pairs)
    print(f"{name}: 1 at a time {alone:.1f} tok/s, {parallel} concurrent {together:.1f} tok/s; "
          f"ratio {together / alone:.2f}x (best rates), pair by pair {' '.join(f'{r:.2f}' for r in ratios)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llamacpp", action="store_true", help="run the same workload on llama-cpp-python")
    ap.add_argument("--llamacpp-path", help="directory holding the llama_cpp package to compare with")
    ap.add_argument("--llamacpp-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    prompts = (PROMPTS * args.parallel)[: args.parallel]
    if args.llamacpp_worker:
        print(json.dumps(llamacpp_pairs(args, args.llamacpp_worker, prompts)))
        return
    from pyengine.api import LLM

    llm = LLM(args.model, n_ctx=1024, n_threads=args.threads, n_parallel=args.parallel)
    generate_concurrently(llm, prompts[:1], 4)            # warm graphs and pages
    while not llm.engine.cache.prefault.done:             # as a server's, once idle a moment
        time.sleep(0.01)
    pairs = alternating_rates(llm, prompts, args.tokens, args.repeat)
    best = [max(p[0] for p in pairs), min(p[1] for p in pairs), max(p[2] for p in pairs), min(p[3] for p in pairs)]
    ratios = sorted(p[2] / p[0] for p in pairs)
    print(f"model {llm.path.name}, {llm.n_threads} threads, {args.tokens} greedy tokens per generation")
    print(f"{'concurrent':>10}  {'total tok/s':>11}  {'cpu ms/token':>12}   (best of {args.repeat})")
    print(f"{1:>10}  {best[0]:>11.1f}  {best[1]:>12.2f}")
    print(f"{args.parallel:>10}  {best[2]:>11.1f}  {best[3]:>12.2f}")
    print(f"throughput ratio: {best[2] / best[0]:.2f}x (best rates), {best[1] / best[3]:.2f}x (cpu per token); "
          f"pair by pair {' '.join(f'{r:.2f}' for r in ratios)} (median {ratios[len(ratios) // 2]:.2f}x)")
    cold, warm, cached = prefix_reuse(llm)
    print(f"time to first token, {cached}-token prefix cached: {cold * 1000:.0f} ms -> {warm * 1000:.0f} ms "
          f"({cold / warm:.1f}x sooner)")
    path = str(llm.path)
    llm.close()
    if args.llamacpp or args.llamacpp_path:
        theirs = run_llamacpp(args, path)
        if theirs:
            report("pyengine ", [p[::2] for p in pairs], args.parallel)
            report("llama.cpp", theirs, args.parallel)


if __name__ == "__main__":
    main()
