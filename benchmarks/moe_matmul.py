"""Time one layer's products with experts (mul_mat_id) at a real MoE model's
shapes, random weights and a random routing:

  qwen3-30b-a3b (default): 128 experts, 8 chosen per token, hidden 2048,
      expert width 768 (gate/up: [2048, 768, 128] Q4_K; down: [768, 2048,
      128] Q6_K, as a Q4_K_M file has them);
  gpt-oss-20b: 32 experts, 4 chosen, hidden and expert width 2880, all three
      stacks MXFP4.

    PYTHONPATH=. python benchmarks/moe_matmul.py [--shape gpt-oss-20b] [--tokens 1,64,256]
        [--threads 2] [--rounds 5] [--plain]

It times the pyengine it imports, so before/after is the same script run by
two interpreters (one per checkout); run them alternately on a busy machine
and compare ranges.  Expert stacks are interleaved by 8 rows where the core
offers it for this ISA and accepts it for mul_mat_id (plain otherwise, or
with --plain: the layout is printed).  Each token's gate and up read one
input row, down reads one per slot, as in the model.
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

# hidden, expert width, experts, chosen per token, gate/up type, down type
SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8, T.Q4_K, T.Q6_K),
          "gpt-oss-20b": (2880, 2880, 32, 4, T.MXFP4, T.MXFP4)}


class Experts:
    def __init__(self, name: str, qtype: int, k: int, n: int, n_exp: int, data: np.ndarray) -> None:
        self.name, self.type, self.shape, self.data = name, qtype, (k, n, n_exp), data


def expert_stack(name: str, qtype: T, k: int, n: int, n_exp: int, random: RandomBytes,
                 plain: bool) -> tuple[Experts, str]:
    data = random_rows(qtype, n_exp * n, k, 0.02, random).reshape(-1)
    rows8 = -1 if plain else _core.rows8_type(int(qtype))
    if rows8 >= 0:
        packed = np.empty_like(data)
        _core.repack_rows8(rows8, data, packed, k, n_exp * n)
        return Experts(name, rows8, k, n, n_exp, packed), "rows8"
    return Experts(name, int(qtype), k, n, n_exp, data), "plain"


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
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    ap.add_argument("--plain", action="store_true", help="the stacks as a file has them, not interleaved")
    ap.add_argument("--tokens", default="1,64,256")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    random = RandomBytes(rng)
    n_embd, n_ff, n_exp, n_used, gate_type, down_type = SHAPES[args.shape]
    types = {"gate": gate_type, "up": gate_type, "down": down_type}
    dims = {"gate": (n_embd, n_ff), "up": (n_embd, n_ff), "down": (n_ff, n_embd)}
    stacks = {}
    for role, qtype in types.items():
        stack, layout = expert_stack(role, qtype, *dims[role], n_exp, random, args.plain)
        try:   # a core that multiplies experts only as the file has them refuses interleaved stacks
            probe = Context(Backend(1))
            product(probe, stack, np.zeros((1, 1, stack.shape[0]), np.float32), np.zeros((1, n_used), np.int32))
        except NativeError:
            stack, layout = expert_stack(role, qtype, *dims[role], n_exp, random, True)
        stacks[role] = (stack, layout)
    for n_tok in [int(v) for v in args.tokens.split(",")]:
        ids = np.stack([rng.choice(n_exp, n_used, replace=False) for _ in range(n_tok)]).astype(np.int32)
        x = rng.standard_normal((n_tok, 1, n_embd)).astype(np.float32)
        x_down = rng.standard_normal((n_tok, n_used, n_ff)).astype(np.float32)
        result = {"tokens": n_tok, "threads": args.threads,
                  "layout": {role: layout for role, (_, layout) in stacks.items()}}
        for role, (stack, _) in stacks.items():
            ctx = Context(Backend(args.threads))
            out = product(ctx, stack, x_down if role == "down" else x, ids)
            times = time_one(ctx, out, args.rounds)
            ops = 2.0 * n_tok * n_used * stack.shape[0] * stack.shape[1]
            weight_bytes = len(np.unique(ids)) * stack.data.nbytes / n_exp   # each chosen expert read once
            result[role] = {"best_ms": round(min(times) * 1e3, 2), "median_ms": round(float(np.median(times)) * 1e3, 2),
                            "gops": round(ops / min(times) / 1e9, 1),
                            "weight_gb_s": round(weight_bytes / min(times) / 1e9, 1)}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
