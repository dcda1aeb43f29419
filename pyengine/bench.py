"""`pyengine bench`: prompt and generation speed of a model, llama-bench style.

Prompt speed runs `n_prompt` tokens through the model in one batch (pp512);
generation speed decodes `n_gen` tokens one at a time (tg128); with `n_depth`
both start after that many tokens of context already in the cache (llama-bench's
-d: "pp512 @ d1024").  The Python time per generated token is the wall time of a
step minus the time spent in the native core: it must stay flat however many
layers the model has.

With `speculative` ("ngram", or "draft" with a `draft_model`), generation is also
measured through the engine's requests, greedy, with and without that speculation
(the same tokens come out): its tokens/s and the share of drafts accepted.  On random
prompts little is accepted; benchmarks/speculative.py measures text that repeats."""

from __future__ import annotations

import sys
import time

import numpy as np

from pyengine.ml import device


# tokens of context filled per forward pass before a deep measurement
_FILL_BATCH = 512


def run_bench(model, n_threads: int | None = None, n_prompt: int = 512, n_gen: int = 128,
              repeat: int = 3, n_depth: int = 0, speculative: str | None = None,
              draft_model: str | None = None) -> dict:
    from pyengine.api import LLM

    t0 = time.perf_counter()
    # one sequence, as llama-bench runs: the cache holds n_ctx cells, not n_ctx per parallel slot
    llm = LLM(model, n_ctx=n_depth + n_prompt + n_gen + 16, n_threads=n_threads, n_batch=max(n_prompt, 1),
              n_parallel=1, draft_model=draft_model)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, llm.n_vocab, n_prompt)
    llm.generate([int(t) for t in prompt[:8]], max_tokens=1)
    first_token_s = time.perf_counter() - t0
    fw = llm.forward
    llm.cache.clear()
    context = rng.integers(0, llm.n_vocab, n_depth)
    for start in range(0, n_depth, _FILL_BATCH):   # the context both measurements start from
        piece = context[start:start + _FILL_BATCH]
        fw(piece, start + np.arange(len(piece)), np.zeros(len(piece)), np.array([len(piece) - 1]))
    llm.cache.checkpoint(0)   # recurrent layers: each measurement rolls back to the state at n_depth
    pp, tg, py = [], [], []
    for rep in range(repeat + 1):   # the first round warms graphs and pages
        t = time.perf_counter()
        fw(prompt, n_depth + np.arange(n_prompt), np.zeros(n_prompt), np.array([n_prompt - 1]))
        pp_s = time.perf_counter() - t
        llm.cache.remove(0, n_depth)
        token = np.array([int(prompt[0])])
        logits = np.empty((1, llm.n_vocab), np.float32)   # one buffer, as the engine keeps
        core_before = fw.compute_seconds
        t = time.perf_counter()
        for pos in range(n_depth, n_depth + n_gen):
            fw(token, np.array([pos]), np.zeros(1), np.zeros(1), logits)
            token[0] = int(np.argmax(logits[0]))
        tg_s = time.perf_counter() - t
        core_s = fw.compute_seconds - core_before
        llm.cache.remove(0, n_depth)
        if rep:
            pp.append(n_prompt / pp_s)
            tg.append(n_gen / tg_s)
            py.append((tg_s - core_s) / n_gen * 1e6)
    llm.cache.clear()
    spec = _speculative_generation(llm, prompt, n_gen, repeat, speculative) if speculative else {}
    return {
        **spec,
        "model": str(llm.path.name),
        "n_threads": llm.n_threads,
        "isa": llm.backend.isa,
        "devices": [d.describe() for d in device.devices()],
        "pp_tps": float(np.median(pp)),
        "tg_tps": float(np.median(tg)),
        "py_us_per_token": float(np.median(py)),
        "load_s": load_s,
        "first_token_s": first_token_s,
        "peak_rss_mb": peak_rss_mb(),
        "model_mb": llm.path.stat().st_size / 2**20,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": n_depth,
    }


def _speculative_generation(llm, prompt: np.ndarray, n_gen: int, repeat: int, mode: str) -> dict:
    """Greedy generation of n_gen tokens after `prompt` through requests, plain and
    speculative in alternation (median tokens/s of each), and the drafts' acceptance."""
    ids = [int(t) for t in prompt]
    never_end = {t: False for t in llm.engine.eog_ids}
    plain, fast, acceptance = [], [], []
    for rep in range(repeat + 1):
        for speculative, into in (("off", plain), (mode, fast)):
            result = llm.submit(ids, max_tokens=n_gen, temperature=0.0, repeat_penalty=1.0, logit_bias=never_end,
                                speculative=speculative, cache_prompt=False).result()
            if rep:
                into.append((len(result.tokens) - 1) / result.generation_seconds)   # the first from the prompt
                if into is fast:
                    acceptance.append(result.draft_acceptance)
    return {"speculative": mode, "plain_tg_tps": float(np.median(plain)), "spec_tg_tps": float(np.median(fast)),
            "spec_acceptance": float(np.median(acceptance))}


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    try:
        import resource
    except ImportError:  # Windows
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10
