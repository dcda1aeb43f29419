#!/usr/bin/env bash
# Runs every fuzzer of fuzz/ (atheris, coverage-guided) for SECONDS each (default 60), each
# from its seeds in tests/data/fuzz/<surface>/seeds/ and the inputs that crashed before.
# A finding (crash, hang over 2 s, growth over 256 MiB) is written to
# tests/data/fuzz/<surface>/crashes/, where tests/test_fuzz_corpus.py replays it; the
# exit status is non-zero if any fuzzer found something.
#   scripts/fuzz.sh [SECONDS] [SURFACE ...]
set -uo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
surfaces=("$@")
if [ "${#surfaces[@]}" = 0 ]; then
  surfaces=(gguf tokenizer gbnf json_schema template parsers server)
fi
python -c "import atheris" 2>/dev/null || { echo "fuzz.sh: atheris is missing (pip install '.[test]')" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=()
for surface in "${surfaces[@]}"; do
  data="tests/data/fuzz/$surface"
  mkdir -p "$data/crashes" "$work/$surface"
  echo "== fuzz $surface: ${seconds}s" >&2
  # the fresh corpus first (libFuzzer adds to the first folder), then the stored inputs
  timeout --kill-after=30 "$((seconds + 300))" python fuzz/run.py "$surface" \
    -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$data/crashes/" \
    "$work/$surface" "$data/seeds" "$data/crashes" 2>"$work/$surface.log"
  status=$?
  grep -E "^#[0-9]+[[:space:]]+DONE|^stat::number_of_executed_units|^stat::peak_rss_mb|ERROR: libFuzzer|Traceback|Defect|==[0-9]+==" \
    "$work/$surface.log" | tail -20 >&2
  if [ "$status" != 0 ]; then
    failed+=("$surface")
    tail -40 "$work/$surface.log" >&2
  fi
done
if [ "${#failed[@]}" != 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]} (inputs in tests/data/fuzz/<surface>/crashes/)" >&2
  exit 1
fi
echo "fuzz.sh: no findings" >&2
