"""Side-by-side speed: pyengine against llama.cpp (through llama-cpp-python,
when it is installed) on the same GGUF files and thread count.

    python benchmarks/compare.py smollm2-135m gemma3-270m --threads 2 --rounds 3
    python benchmarks/compare.py --random llama-3.2-1b:q4_k_m --random llama-3.1-8b

--random SHAPE[:MIX] measures a random-weight model of a real shape (see
scripts/make_random_model.py --list; the mix defaults to q4_k_m), written once
into <pyengine cache>/random/ (or --random-dir) and reused after.

To compare the AVX2 paths, point --llamacpp-path at a llama-cpp-python
built without AVX-512 (e.g. pip install --target DIR with CMAKE_ARGS
"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF ...") and pass --isa avx2.
With --llama-bench PATH the reference is llama.cpp's own llama-bench binary
instead (no Python around it: the figures llama.cpp publishes).

Each measurement runs in a fresh process (so peak memory is per engine), and
the engines alternate round by round so that machine noise hits both alike.
Prints prompt (pp512) and generation (tg128) tokens/s, their ratios, and peak
resident memory."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def worker_pyengine(path: str, threads: int, n_prompt: int, n_gen: int) -> dict:
    from pyengine.bench import run_bench

    r = run_bench(path, n_threads=threads, n_prompt=n_prompt, n_gen=n_gen, repeat=1)
    return {"pp": r["pp_tps"], "tg": r["tg_tps"], "rss": r["peak_rss_mb"]}


def worker_llamacpp(path: str, threads: int, n_prompt: int, n_gen: int) -> dict:
    import numpy as np
    from llama_cpp import Llama

    from pyengine.bench import peak_rss_mb

    llm = Llama(model_path=path, n_ctx=n_prompt + n_gen + 16, n_batch=n_prompt, n_ubatch=n_prompt,
                n_threads=threads, n_threads_batch=threads, verbose=False)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, llm.n_vocab(), n_prompt)]
    llm.eval(prompt[:8])  # warm up
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    pp = n_prompt / (time.perf_counter() - t)
    llm.reset()
    token = prompt[0]
    t = time.perf_counter()
    for _ in range(n_gen):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    tg = n_gen / (time.perf_counter() - t)
    return {"pp": pp, "tg": tg, "rss": peak_rss_mb()}


def worker_llama_bench(path: str, threads: int, n_prompt: int, n_gen: int, binary: str) -> dict:
    """llama.cpp's llama-bench, one repetition per test; peak memory is the child's."""
    import resource

    cmd = [binary, "-m", path, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen), "-r", "1", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rates = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in json.loads(out.stdout)}
    rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"pp": rates["pp"], "tg": rates["tg"], "rss": rss_kib / 1024}


WORKERS = {"pyengine": worker_pyengine, "llama.cpp": worker_llamacpp, "llama-bench": worker_llama_bench}


def worker_env(engine: str, args) -> dict:
    """The worker's environment: pyengine's instruction set, llama.cpp's build."""
    env = dict(os.environ)
    if engine == "pyengine" and args.isa:
        env["PYENGINE_ISA"] = args.isa
    if engine == "llama.cpp" and args.llamacpp_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.llamacpp_path, env.get("PYTHONPATH")) if p)
    return env


def measure(engine: str, path: str, args) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", engine, path, "--threads", str(args.threads),
           "--n-prompt", str(args.n_prompt), "--n-gen", str(args.n_gen)]
    if engine == "llama-bench":
        cmd += ["--llama-bench", args.llama_bench]
    out = subprocess.run(cmd, capture_output=True, text=True, env=worker_env(engine, args))
    if out.returncode != 0:
        print(f"{engine} failed on {path}:\n{out.stderr[-1500:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def llamacpp_available(args) -> bool:
    if args.llamacpp_path:
        return os.path.isdir(os.path.join(args.llamacpp_path, "llama_cpp"))
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def random_model(spec: str, out_dir: str | None):
    """The random-weight GGUF of 'shape[:mix]', written by scripts/make_random_model.py
    unless already there."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from make_random_model import cached_model

    return cached_model(spec, out_dir)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="catalog names or .gguf paths")
    ap.add_argument("--random", action="append", default=[], metavar="SHAPE[:MIX]",
                    help="also a random-weight model of this shape and type mix, e.g. llama-3.2-1b:q4_k_m")
    ap.add_argument("--random-dir", help="where --random models are written (default <pyengine cache>/random)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--isa", help="pyengine's instruction set (PYENGINE_ISA), e.g. avx2")
    ap.add_argument("--llamacpp-path", help="directory holding the llama_cpp package to compare with")
    ap.add_argument("--llama-bench", help="compare with this llama-bench binary instead of llama-cpp-python")
    ap.add_argument("--each", action="store_true", help="also print every round's figures, as they come")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        extra = (args.llama_bench,) if args.worker == "llama-bench" else ()
        print(json.dumps(WORKERS[args.worker](args.models[0], args.threads, args.n_prompt, args.n_gen, *extra)))
        return 0

    from pyengine.store import resolve_model

    if not args.models and not args.random:
        ap.error("name a model or give --random SHAPE[:MIX]")
    targets = [(name, str(resolve_model(name))) for name in args.models]
    for spec in args.random:
        try:
            targets.append((spec, str(random_model(spec, args.random_dir))))
        except ValueError as e:
            ap.error(str(e))
    reference = "llama-bench" if args.llama_bench else "llama.cpp" if llamacpp_available(args) else None
    engines = ["pyengine"] + ([reference] if reference else [])
    if len(engines) == 1:
        print("llama-cpp-python is not installed: showing pyengine alone "
              "(CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python)")
    print(f"{'model':<22} {'engine':<10} {'pp' + str(args.n_prompt):>9} {'tg' + str(args.n_gen):>9} "
          f"{'peak MiB':>9}   (tokens/s, median of {args.rounds}, {args.threads} threads)")
    for name, path in targets:
        runs: dict[str, list[dict]] = {e: [] for e in engines}
        for _ in range(args.rounds):
            for engine in engines:
                r = measure(engine, path, args)
                if r:
                    runs[engine].append(r)
                    if args.each:
                        print(f"  {engine:<10} pp {r['pp']:.1f}  tg {r['tg']:.1f}  peak MiB {r['rss']:.0f}", flush=True)
        med = {e: {k: statistics.median(r[k] for r in rs) for k in ("pp", "tg", "rss")}
               for e, rs in runs.items() if rs}
        for engine, m in med.items():
            print(f"{name:<22} {engine:<10} {m['pp']:>9.1f} {m['tg']:>9.1f} {m['rss']:>9.0f}")
        if len(med) == 2:
            a, b = med["pyengine"], med[reference]
            print(f"{name:<22} {'ratio':<10} {a['pp'] / b['pp']:>8.2f}x {a['tg'] / b['tg']:>8.2f}x "
                  f"{a['rss'] / b['rss']:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
