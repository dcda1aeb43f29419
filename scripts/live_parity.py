"""pyengine against llama.cpp, run live, on token sequences no golden file holds.

Draws `--count` random sequences (BOS, then ids from the model's vocabulary;
lengths spread from short to past a sliding window), runs each through
pyengine (tests/model_parity.py's run_case: one batch, every row an output)
and through llama-cpp-python as the recorder loads a model (scripts/synth_common.py:
one batch, plain attention, a full-size sliding-window cache, extra buffer types
off), and prints per sequence the argmax agreement over all positions and the
largest difference over llama.cpp's 10 best logits at the last position; then
the totals against the parity bounds (argmax >= 99%, top-10 within 0.05).

    PYTHONPATH=<dir holding llama_cpp> python scripts/live_parity.py tests/data/synth/gpt-oss-q8_0.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import synth_common as common

sys.path.insert(0, str(common.ROOT / "tests"))
from model_parity import load, run_case  # noqa: E402

from pyengine.ml.context import Backend  # noqa: E402


def sequences(rng: np.random.Generator, count: int, n_vocab: int, longest: int) -> list[list[int]]:
    lengths = np.linspace(8, longest, count).astype(int)
    return [[1] + [int(i) for i in rng.integers(3, n_vocab, size=n - 1)] for n in lengths]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--count", type=int, default=9)
    parser.add_argument("--longest", type=int, default=300)
    parser.add_argument("--seed", type=int, default=2028)
    args = parser.parse_args(argv)
    from llama_cpp import Llama

    model = load(args.model)
    backend = Backend(2)
    with common.llama_extra_buffer_types_off():
        # YaRN's ramp ends -1: llama.cpp's own default, the file's (llama-cpp-python passes 32 and 1)
        llm = Llama(str(args.model), **{**common.RECORDER_CONTEXT_ARGS, "swa_full": True,
                                        "yarn_beta_fast": -1.0, "yarn_beta_slow": -1.0})
    equal, worst = [], 0.0
    for ids in sequences(np.random.default_rng(args.seed), args.count, model.cfg.n_vocab, args.longest):
        ours = run_case(model, backend, ids, 1).logits
        llm.reset()
        llm.eval(ids)
        theirs = np.asarray(llm.scores[:len(ids)], np.float64)
        top = np.argsort(-theirs[-1])[:10]
        top10 = float(np.abs(ours[-1][top] - theirs[-1][top]).max())
        same = ours.argmax(axis=1) == theirs.argmax(axis=1)
        print(f"{len(ids):4d} tokens: argmax {same.sum()}/{same.size}, top-10 {top10:.5f}")
        equal.append(same)
        worst = max(worst, top10)
    rate = float(np.concatenate(equal).mean())
    print(f"all: argmax {rate:.4f}, worst top-10 {worst:.5f}")
    return 0 if rate >= 0.99 and worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
