"""Continuous batching: total generated tokens/s of N greedy generations run one at a
time and run concurrently (sharing the engine's batch loop), in alternating pairs, and
time to first token with and without a cached prompt prefix.  The prompts'
continuations run past 64 tokens without an end of text, so both ways generate the same
tokens.

    PYTHONPATH=. python benchmarks/batching.py [--model smollm2-135m] [--threads 2]
                                               [--tokens 64] [--parallel 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    from pyengine.api import LLM

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(args.model, n_ctx=1024, n_threads=args.threads, n_parallel=args.parallel)
    prompts = (PROMPTS * args.parallel)[: args.parallel]
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
    llm.close()


if __name__ == "__main__":
    main()
