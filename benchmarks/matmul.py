"""Time one quantized mul_mat at SmolLM2-like shapes, with and without the
GEMM micro-kernels, and print GOP/s and the speedup.

    PYTHONPATH=. python benchmarks/matmul.py [--types Q4_1,Q5_0] [--threads 1,2] [--rounds 5]
        [--shapes 2048x2048] [--batches 1,64]

The kernels are chosen when the native core starts, so each measurement runs
in a child process; PYENGINE_GEMM=0 makes it fall back to vec_dot pair by
pair.  Rounds alternate between the two settings so that a busy machine
slows both alike; the best time of every setting is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

# (input features k, output features n): SmolLM2-135M's projections, and for
# the k-quants (rows of 256) Gemma-3-270M's attn_output and ffn_down
SHAPES = ((576, 1536), (1536, 576), (576, 576))
SHAPES_K = ((1024, 640), (2048, 640))
BATCHES = (512, 1)


class _Weight:
    def __init__(self, type_id: int, k: int, n: int, data: np.ndarray) -> None:
        self.name, self.type, self.shape, self.data = "w", type_id, (k, n), data


def _quantized_weight(type_id: int, k: int, n: int, rng: np.random.Generator) -> _Weight:
    from pyengine import _core

    rows = rng.standard_normal((n, k)).astype(np.float32)
    data = np.concatenate([_core.quantize(type_id, row) for row in rows])
    return _Weight(type_id, k, n, data)


def _time_one(type_id: int, k: int, n: int, m: int, threads: int, min_seconds: float) -> float:
    """Best seconds of one mul_mat over repeated computes of the same graph."""
    from pyengine.ml.context import Backend, Context

    rng = np.random.default_rng(0)
    weight = _quantized_weight(type_id, k, n, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ctx = Context(Backend(threads))
    out = ctx.mul_mat(ctx.weight(weight), ctx.input(x, "x"))
    ctx.set_output(out)
    ctx.compute()
    # one thread computes on the calling thread: its CPU time does not count
    # the time the (shared) machine spends on other processes
    clock = time.thread_time if threads == 1 else time.perf_counter
    best, spent, runs = float("inf"), 0.0, 0
    while spent < min_seconds or runs < 5:
        t0 = clock()
        ctx.compute()
        dt = clock() - t0
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best


def _shapes(name: str, args: argparse.Namespace) -> tuple[tuple[int, int], ...]:
    if args.shapes:
        return tuple(tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(","))
    return SHAPES_K if name.endswith("_K") else SHAPES


def _child(args: argparse.Namespace) -> None:
    from gguf import GGMLQuantizationType as T

    results = {}
    batches = tuple(int(m) for m in args.batches.split(",")) if args.batches else BATCHES
    for name in args.types.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            for k, n in _shapes(name, args):
                for m in batches:
                    key = f"{name} {threads} {k} {n} {m}"
                    results[key] = _time_one(int(T[name]), k, n, m, threads, args.min_seconds)
    print(json.dumps(results))


def _run_child(gemm: bool, args: argparse.Namespace) -> dict[str, float]:
    env = dict(os.environ, PYENGINE_GEMM="1" if gemm else "0")
    cmd = [sys.executable, __file__, "--child", "--types", args.types, "--threads", args.threads,
           "--min-seconds", str(args.min_seconds), "--shapes", args.shapes, "--batches", args.batches]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_1", help="comma-separated GGUF type names")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per setting")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="timing per case and run")
    parser.add_argument("--shapes", default="", help="comma-separated KxN (input x output features); "
                        "default: SmolLM2's (Gemma-3's for the k-quants)")
    parser.add_argument("--batches", default="", help="comma-separated activation rows (default: 512,1)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    best: dict[bool, dict[str, float]] = {True: {}, False: {}}
    for _ in range(args.rounds):
        for gemm in (False, True):
            for key, seconds in _run_child(gemm, args).items():
                best[gemm][key] = min(seconds, best[gemm].get(key, float("inf")))
    from pyengine import _core

    print(f"isa {_core.isa()}; best of {args.rounds} alternating runs; GOP/s = 2*k*n*m / time "
          "(thread CPU time with 1 thread, wall time otherwise)")
    print(f"{'type':6} {'thr':>3} {'k':>5} {'n':>5} {'m':>4} {'vec_dot GOP/s':>14} {'gemm GOP/s':>11} {'speedup':>8}")
    for key, with_gemm in best[True].items():
        name, threads, k, n, m = key.split()
        ops = 2.0 * int(k) * int(n) * int(m)
        without = best[False][key]
        print(f"{name:6} {threads:>3} {k:>5} {n:>5} {m:>4} {ops / without / 1e9:14.2f} "
              f"{ops / with_gemm / 1e9:11.2f} {without / with_gemm:7.2f}x")


if __name__ == "__main__":
    main()
