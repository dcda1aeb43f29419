"""The gated delta rule's prompt cost: one Gated DeltaNet layer's recurrence (delta_net, the
op alone, no projections) over a prompt, token by token against the chunked form, on one
thread.  Default shape: a Qwen3.5-2B-like linear-attention layer (16 key and 16 value heads,
head dims 128).

    PYTHONPATH=. python benchmarks/delta_net.py [--tokens 512] [--heads 16] [--key-heads 16]
                                                [--dk 128] [--dv 128] [--threads 1] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pyengine import _core
from pyengine.ml.context import Backend, Context


def build(args, chunk: int):
    rng = np.random.default_rng(0)
    T, H, Hk, Dk, Dv = args.tokens, args.heads, args.key_heads, args.dk, args.dv

    def l2n(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    arrays = {"q": l2n(rng.standard_normal((T, Hk, Dk))), "k": l2n(rng.standard_normal((T, Hk, Dk))),
              "v": rng.standard_normal((T, H, Dv)).astype(np.float32),
              "g": (-np.exp(rng.standard_normal((T, H)) - 2.0)).astype(np.float32),
              "beta": (1 / (1 + np.exp(-rng.standard_normal((T, H))))).astype(np.float32),
              "state": np.zeros((1, H * Dk * Dv), np.float32), "seqs": np.array([[0, T, 0, 0, 0]], np.int32)}
    ctx = Context(Backend(args.threads))
    t = {name: ctx.input(a, name) for name, a in arrays.items()}
    out = ctx.delta_net(t["q"], t["k"], t["v"], t["g"], t["beta"], t["state"], t["seqs"], scale=Dk ** -0.5,
                        chunk=chunk)
    ctx.set_output(out)
    return ctx, arrays


def best_seconds(args, chunks: list[int]) -> dict[int, float]:
    """The fastest of `repeat` runs of each form, the forms taken in turn (a busy machine
    slows them alike)."""
    # one thread runs on the caller's: its CPU time leaves out the time other processes
    # held the core; more threads take the wall clock
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    graphs = {c: build(args, c) for c in chunks}
    best = {c: float("inf") for c in chunks}
    for c, (ctx, _) in graphs.items():
        ctx.compute()   # plans memory
    for _ in range(args.repeat):
        for c, (ctx, arrays) in graphs.items():
            arrays["state"][:] = 0
            start = clock()
            ctx.compute()
            best[c] = min(best[c], clock() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--key-heads", type=int, default=16)
    p.add_argument("--dk", type=int, default=128)
    p.add_argument("--dv", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--chunks", default="0,32,64,128")
    args = p.parse_args()
    print(f"isa {_core.isa()}, {args.threads} thread(s), T={args.tokens}, H={args.heads} (key heads "
          f"{args.key_heads}), Dk={args.dk}, Dv={args.dv}")
    chunks = [int(c) for c in args.chunks.split(",")]
    best = best_seconds(args, chunks)
    base = best[chunks[0]]
    for chunk, s in best.items():
        name = "token by token" if chunk == 0 else f"chunks of {chunk}"
        print(f"  {name:16s} {s * 1e3:8.2f} ms  {args.tokens / s:9.0f} tok/s  x{base / s:.2f}")


if __name__ == "__main__":
    main()
