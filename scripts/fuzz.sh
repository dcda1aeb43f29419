#!/usr/bin/env bash
# Runs every fuzzer of fuzz/ (atheris, coverage-guided) for SECONDS each (default 60), each
# from its seeds in tests/data/fuzz/<surface>/seeds/ and the inputs that failed before.
# A finding (an exception, a crash, an input over 2 s of CPU, growth over 256 MiB) is
# written to tests/data/fuzz/<surface>/crashes/, where tests/test_fuzz_corpus.py replays it.
#   scripts/fuzz.sh [SECONDS] [SURFACE ...]     (FUZZ_JOBS=N: N campaigns at a time)
# Exit status: 0 nothing found, 1 a finding, 3 a fuzzer that did not run (no finding).
# Each run's whole output is kept in $FUZZ_LOGS (default build/fuzz-logs/<surface>.log).
set -uo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
surfaces=("$@")
if [ "${#surfaces[@]}" = 0 ]; then
  surfaces=(gguf tokenizer gbnf json_schema template parsers server)
fi
logs="${FUZZ_LOGS:-build/fuzz-logs}"
mkdir -p "$logs"

python=python
"$python" -c "import atheris" 2>/dev/null || { echo "fuzz.sh: atheris is missing (pip install '.[test]')" >&2; exit 2; }

# The native core is fuzzed instrumented too (coverage for libFuzzer, ASan, UBSan) where clang
# is here: a copy built into an environment of its own, run with atheris's ASan runtime (which
# holds libFuzzer) preloaded. FUZZ_NATIVE=0, or no clang: only the Python side is instrumented.
preload=""
runtime=$("$python" -c "import atheris, os; print(os.path.join(atheris.path(), 'asan_with_fuzzer.so'))")
if [ "${FUZZ_NATIVE:-1}" != 0 ] && command -v clang >/dev/null && [ -f "$runtime" ]; then
  . scripts/instrumented_install.sh
  echo "== fuzz: building the native core instrumented (clang, address,undefined,fuzzer-no-link)" >&2
  if CC=clang instrumented_install build/fuzz-venv address,undefined,fuzzer-no-link build/fuzz >&2; then
    python=build/fuzz-venv/bin/python
    preload=$runtime
    # Malloc returns NULL past the limits, as the system's does (pyengine reports that, typed);
    # a small quarantine keeps the RSS check about the harness's growth, not ASan's.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1:quarantine_size_mb=32:strict_string_checks=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  else
    echo "fuzz.sh: WARNING: the instrumented build failed; fuzzing the Python side only" >&2
  fi
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# One campaign; its outcome (found, broken or clean) goes to $work/<surface>.outcome.
fuzz_one() {
  local surface=$1 data="tests/data/fuzz/$1" log="$logs/$1.log" status outcome=clean
  mkdir -p "$data/crashes" "$work/$surface"
  echo "== fuzz $surface: ${seconds}s" >&2
  # the fresh corpus first (libFuzzer adds to the first folder), then the stored inputs
  timeout --kill-after=30 "$((seconds + 300))" env ${preload:+LD_PRELOAD="$preload"} "$python" fuzz/run.py "$surface" \
    -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$data/crashes/" \
    "$work/$surface" "$data/seeds" "$data/crashes" >"$log" 2>&1
  status=$?
  grep -aE "^#[0-9]+[[:space:]]+DONE|^stat::number_of_executed_units|^stat::peak_rss_mb|ERROR: libFuzzer|Uncaught Python|Defect|==[0-9]+==|runtime error:" \
    "$log" | tail -20 | sed "s/^/[$surface] /" >&2
  if [ "$status" != 0 ]; then
    tail -40 "$log" | sed "s/^/[$surface] /" >&2
    # a finding is an input that failed: atheris reported it and libFuzzer (or run.py) kept it
    if grep -aqE "Uncaught Python exception|ERROR: libFuzzer: |ERROR: AddressSanitizer|runtime error:|Test unit written to" "$log"; then
      outcome=found
    else
      outcome=broken
    fi
  fi
  echo "$outcome" > "$work/$surface.outcome"
}

# FUZZ_JOBS campaigns at a time (default 1: each takes a core)
for surface in "${surfaces[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "${FUZZ_JOBS:-1}" ]; do wait -n; done
  fuzz_one "$surface" &
done
wait
found=()
broken=()
for surface in "${surfaces[@]}"; do
  case "$(cat "$work/$surface.outcome" 2>/dev/null || echo broken)" in
    found) found+=("$surface") ;;
    broken) broken+=("$surface") ;;
  esac
done
if [ "${#found[@]}" != 0 ]; then
  echo "fuzz.sh: findings in: ${found[*]} (inputs in tests/data/fuzz/<surface>/crashes/, logs in $logs)" >&2
  exit 1
fi
if [ "${#broken[@]}" != 0 ]; then
  echo "fuzz.sh: WARNING: these fuzzers did not run (no finding): ${broken[*]} (logs in $logs)" >&2
  exit 3
fi
echo "fuzz.sh: no findings (logs in $logs)" >&2
