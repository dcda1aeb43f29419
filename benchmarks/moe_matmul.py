"""Time one layer's products with experts (mul_mat_id) at Qwen3-30B-A3B's
shapes: 128 experts, 8 chosen per token, hidden 2048, expert width 768
(gate/up: [2048, 768, 128] Q4_K; down: [768, 2048, 128] Q6_K, as a Q4_K_M
file has them), random weights and a random routing.

    PYTHONPATH=. python benchmarks/moe_matmul.py [--tokens 1,64,256] [--threads 2] [--rounds 5]

It times the pyengine it imports, so before/after is the same script run by
two interpreters (one per checkout); run them alternately on a busy machine
and compare ranges.  Expert stacks are interleaved by 8 rows where the core
offers it for this ISA and accepts it for mul_mat_id (plain otherwise: the
layout is printed).  Each token's gate and up read one input row, down reads
one per slot, as in the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_random_model import RandomBytes, random_rows

from pyengine import _core
from pyengine.errors import NativeError
from pyengine.ml.context import Backend, Context

N_EMBD, N_FF, N_EXP, N_USED = 2048, 768, 128, 8


class Experts:
    def __init__(self, name: str, qtype: int, k: int, n: int, data: np.ndarray) -> None:
        self.name, self.type, self.shape, self.data = name, qtype, (k, n, N_EXP), data


def expert_stack(name: str, qtype: T, k: int, n: int, random: RandomBytes) -> tuple[Experts, str]:
    data = random_rows(qtype, N_EXP * n, k, 0.02, random).reshape(-1)
    rows8 = _core.rows8_type(int(qtype))
    if rows8 >= 0:
        packed = np.empty_like(data)
        _core.repack_rows8(rows8, data, packed, k, N_EXP * n)
        return Experts(name, rows8, k, n, packed), "rows8"
    return Experts(name, int(qtype), k, n, data), "plain"


def product(ctx: Context, stack: Experts, x: np.ndarray, ids: np.ndarray):
    return ctx.mul_mat_id(ctx.weight(stack), ctx.input(x, "x"), ctx.input(ids, "ids"))


def time_one(ctx: Context, out, rounds: int) -> list[float]:
    ctx.set_output(out)
    ctx.compute()   # plans, warms the caches
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        ctx.compute()
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,64,256")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    random = RandomBytes(rng)
    built = {"gate": expert_stack("gate", T.Q4_K, N_EMBD, N_FF, random),
             "up": expert_stack("up", T.Q4_K, N_EMBD, N_FF, random),
             "down": expert_stack("down", T.Q6_K, N_FF, N_EMBD, random)}
    stacks = {}
    for role, (stack, layout) in built.items():
        try:   # a core that multiplies experts only as the file has them refuses interleaved stacks
            probe = Context(Backend(1))
            product(probe, stack, np.zeros((1, 1, stack.shape[0]), np.float32), np.zeros((1, N_USED), np.int32))
        except NativeError:
            plain_type = T.Q6_K if role == "down" else T.Q4_K
            k, n = stack.shape[:2]
            stack, layout = Experts(role, int(plain_type), k, n,
                                    random_rows(plain_type, N_EXP * n, k, 0.02, random).reshape(-1)), "plain"
        stacks[role] = (stack, layout)
    for n_tok in [int(v) for v in args.tokens.split(",")]:
        ids = np.stack([rng.choice(N_EXP, N_USED, replace=False) for _ in range(n_tok)]).astype(np.int32)
        x = rng.standard_normal((n_tok, 1, N_EMBD)).astype(np.float32)
        x_down = rng.standard_normal((n_tok, N_USED, N_FF)).astype(np.float32)
        result = {"tokens": n_tok, "threads": args.threads,
                  "layout": {role: layout for role, (_, layout) in stacks.items()}}
        for role, (stack, _) in stacks.items():
            ctx = Context(Backend(args.threads))
            out = product(ctx, stack, x_down if role == "down" else x, ids)
            times = time_one(ctx, out, args.rounds)
            ops = 2.0 * n_tok * N_USED * stack.shape[0] * stack.shape[1]
            result[role] = {"best_ms": round(min(times) * 1e3, 2), "median_ms": round(float(np.median(times)) * 1e3, 2),
                            "gops": round(ops / min(times) / 1e9, 1)}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
