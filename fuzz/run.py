"""Runs one harness of fuzz/harnesses.py under atheris (coverage-guided, libFuzzer).

    python fuzz/run.py SURFACE [libFuzzer flags] [CORPUS_DIR ...]

pyengine's modules (and the libraries the harnesses drive: jinja2, starlette, fastapi)
are instrumented for coverage and comparisons.  A harness's exception is a crash; so is an
input that takes more than harnesses.SLOW_S (2 s) of CPU, the instrumentation's slowdown
(SLOWDOWN) allowed for, or growth of the process past 256 MiB over its size once the
harness is ready (-rss_limit_mb).  libFuzzer's own -timeout (wall clock) is well above
that, for hangs that never return: at the same 2 s, its periodic alarm raced the harness's
report of a slow input and killed the process before the input was written.  Every
failing input is also written under -artifact_prefix by the run itself.
scripts/fuzz.sh runs every surface with its seeds and keeps what crashed.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

# instrument_imports() skips modules of an editable install's custom loader, so the run
# imports the harnesses' modules (harnesses.load_modules, which runs nothing) and
# instruments the functions of those named in INSTRUMENTED in place, before any input
# runs: a closure made later (a route handler made by create_app) gets the instrumented
# code of the function that makes it, one made before would not.  Modules first imported
# by the warm-up are instrumented after it.  Not pydantic: atheris 2.3's comparison
# tracing miscompiles some of its functions on Python 3.11 (mro_for_bases's generator
# segfaults), and its validation is native anyway.  instrument_all() would take minutes.
INSTRUMENTED = ("pyengine", "harnesses", "jinja2", "starlette", "fastapi")
import harnesses  # noqa: E402

GROWTH_MB = 256
# measured: the GBNF corpus takes 2.1x the CPU time instrumented
SLOWDOWN = 3.0
HANG_S = 30


def rss_mb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def instrument_loaded(prefixes: tuple[str, ...], done_modules: set[str]) -> int:
    """Instrument (in place) every function and method defined in the loaded modules whose
    names start with one of `prefixes` and are not in `done_modules` (which it fills);
    the number of functions.  Objects are looked at through vars() only: an attribute
    lookup can run code (pydantic builds a model's schema on first use)."""
    done = 0

    def instrument(obj) -> None:
        nonlocal done
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if inspect.isfunction(obj):
            atheris.instrument_func(obj)
            done += 1
        elif isinstance(obj, property):
            for accessor in (obj.fget, obj.fset):
                if accessor is not None:
                    instrument(accessor)

    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in prefixes or name in done_modules:
            continue
        done_modules.add(name)
        for obj in list(vars(module).values()):
            if isinstance(obj, type) and vars(obj).get("__module__") == name:
                for attr in list(vars(obj).values()):
                    instrument(attr)
            elif inspect.isfunction(obj) and obj.__module__ == name:
                instrument(obj)
    return done


def keeping_failures(one, prefix: str):
    """`one`, writing each input it raises on to PREFIX crash-<sha1> before re-raising
    (libFuzzer writes the same file, when it gets that far)."""
    def run_one(data: bytes) -> None:
        try:
            one(data)
        except BaseException:
            Path(f"{prefix}crash-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
            raise
    return run_one


def warm_up(one) -> None:
    """Load what a harness loads once (vocabularies, the app) before measuring the RSS."""
    seeds = harnesses.FUZZ_DATA / SURFACE / "seeds"
    for seed in sorted(seeds.iterdir())[:3] if seeds.is_dir() else []:
        one(seed.read_bytes())


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in harnesses.HARNESSES:
        sys.exit(f"usage: run.py {{{','.join(harnesses.SURFACES)}}} [libFuzzer flags] [corpus dirs]")
    SURFACE = sys.argv[1]
    one = harnesses.HARNESSES[SURFACE]
    harnesses.load_modules()
    instrumented = set()
    count = instrument_loaded(INSTRUMENTED, instrumented)
    warm_up(one)
    count += instrument_loaded(INSTRUMENTED, instrumented)
    print(f"INFO: instrumented {count} functions of {len(instrumented)} modules", file=sys.stderr)
    flags = sys.argv[2:]
    harnesses.SLOWDOWN = SLOWDOWN
    if not any(flag.startswith("-timeout=") for flag in flags):
        flags.append(f"-timeout={HANG_S}")
    if not any(flag.startswith("-rss_limit_mb=") for flag in flags):
        flags.append(f"-rss_limit_mb={rss_mb() + GROWTH_MB}")
    words = Path(__file__).resolve().parent / "dicts" / f"{SURFACE}.dict"
    if words.is_file() and not any(flag.startswith("-dict=") for flag in flags):
        flags.append(f"-dict={words}")
    if not any(flag.startswith("-max_len=") for flag in flags):
        flags.append("-max_len=" + ("65536" if SURFACE == "gguf" else "4096"))
    prefix = next((flag.split("=", 1)[1] for flag in flags if flag.startswith("-artifact_prefix=")), "./")
    atheris.Setup([sys.argv[0]] + flags, keeping_failures(one, prefix))
    atheris.Fuzz()
