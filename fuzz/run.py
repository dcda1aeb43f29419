"""Runs one harness of fuzz/harnesses.py under atheris (coverage-guided, libFuzzer).

    python fuzz/run.py SURFACE [libFuzzer flags] [CORPUS_DIR ...]

pyengine's modules (and the libraries the harnesses drive: jinja2, starlette) are
instrumented for coverage.  Unless the flags
say otherwise, one input may take 2 s (-timeout=2) and the process may grow 256 MiB over
its size once the harness is ready (-rss_limit_mb); a harness's exception is a crash.
scripts/fuzz.sh runs every surface with its seeds and keeps what crashed.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

# instrument_imports() would instrument only what is imported inside its block, and skips
# modules of an editable install's custom loader; the harnesses import their modules
# lazily, so the run imports them (warm_up) and then instruments the functions of the
# modules named in INSTRUMENTED (instrument_all() would take minutes on a busy machine).
INSTRUMENTED = ("pyengine", "harnesses", "jinja2", "starlette", "fastapi", "pydantic")
with atheris.instrument_imports(include=["harnesses"]):
    import harnesses

GROWTH_MB = 256


def rss_mb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def instrument_loaded(prefixes: tuple[str, ...]) -> int:
    """Instrument (in place) every function and method defined in the loaded modules whose
    names start with one of `prefixes`; the number of functions."""
    done = 0

    def instrument(obj) -> None:
        nonlocal done
        func = getattr(obj, "__func__", obj)   # static and class methods
        if inspect.isfunction(func):
            atheris.instrument_func(func)
            done += 1
        elif isinstance(obj, property):
            for accessor in (obj.fget, obj.fset):
                if accessor is not None:
                    instrument(accessor)

    for name, module in list(sys.modules.items()):
        if module is None or not name.split(".")[0] in prefixes:
            continue
        for obj in list(vars(module).values()):
            if getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj):
                for attr in list(vars(obj).values()):
                    instrument(attr)
            else:
                instrument(obj)
    return done


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
    warm_up(one)
    print(f"INFO: instrumented {instrument_loaded(INSTRUMENTED)} functions", file=sys.stderr)
    flags = sys.argv[2:]
    if not any(flag.startswith("-timeout=") for flag in flags):
        flags.append(f"-timeout={int(harnesses.SLOW_S)}")
    if not any(flag.startswith("-rss_limit_mb=") for flag in flags):
        flags.append(f"-rss_limit_mb={rss_mb() + GROWTH_MB}")
    words = Path(__file__).resolve().parent / "dicts" / f"{SURFACE}.dict"
    if words.is_file() and not any(flag.startswith("-dict=") for flag in flags):
        flags.append(f"-dict={words}")
    if not any(flag.startswith("-max_len=") for flag in flags):
        flags.append("-max_len=" + ("65536" if SURFACE == "gguf" else "4096"))
    atheris.Setup([sys.argv[0]] + flags, one)
    atheris.Fuzz()
