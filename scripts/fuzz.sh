#!/usr/bin/env bash
# Runs every fuzzer of fuzz/ (atheris, coverage-guided) for SECONDS each (default 60), each
# from its seeds in tests/data/fuzz/<surface>/seeds/ and the inputs that failed before.
# A finding (an exception, a crash, an input over 2 s of CPU, growth over 256 MiB) is
# written to tests/data/fuzz/<surface>/crashes/, where tests/test_fuzz_corpus.py replays it.
#   scripts/fuzz.sh [SECONDS] [SURFACE ...]
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

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
found=()
broken=()
for surface in "${surfaces[@]}"; do
  data="tests/data/fuzz/$surface"
  log="$logs/$surface.log"
  mkdir -p "$data/crashes" "$work/$surface"
  echo "== fuzz $surface: ${seconds}s" >&2
  # the fresh corpus first (libFuzzer adds to the first folder), then the stored inputs
  timeout --kill-after=30 "$((seconds + 300))" "$python" fuzz/run.py "$surface" \
    -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$data/crashes/" \
    "$work/$surface" "$data/seeds" "$data/crashes" >"$log" 2>&1
  status=$?
  grep -aE "^#[0-9]+[[:space:]]+DONE|^stat::number_of_executed_units|^stat::peak_rss_mb|ERROR: libFuzzer|Uncaught Python|Defect|==[0-9]+==" \
    "$log" | tail -20 >&2
  if [ "$status" != 0 ]; then
    tail -40 "$log" >&2
    # a finding is an input that failed: atheris reported it and libFuzzer (or run.py) kept it
    if grep -aqE "Uncaught Python exception|ERROR: libFuzzer: |Test unit written to" "$log"; then
      found+=("$surface")
    else
      broken+=("$surface")
    fi
  fi
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
