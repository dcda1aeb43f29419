#!/usr/bin/env bash
# Builds pyengine's native core with AddressSanitizer and UndefinedBehaviorSanitizer into a
# virtual environment of its own and runs the tests that drive the C code under it:
# kernels, tokenizers, GGUF reading, grammars, graph ops and the synthetic models.
# Any report fails the run (the build makes every report fatal).
#   scripts/sanitize.sh [pytest arguments...]     (default: the files below)
set -euo pipefail
cd "$(dirname "$0")/.."

SANITIZERS=${PYENGINE_SANITIZE:-address,undefined}
VENV=${SANITIZE_VENV:-build/sanitize-venv}
TESTS=(tests/test_kernels_legacy.py tests/test_kernels_kquants.py tests/test_kernels_iquants.py
       tests/test_gemm.py tests/test_rows8.py tests/test_graph_ops.py tests/test_gguf.py tests/test_gguf_bad.py
       tests/test_tokenizer_native.py tests/test_tokenizer_conformance.py tests/test_tokenizer_unit.py
       tests/test_grammar.py tests/test_kvcache.py tests/test_models_synth.py tests/test_models_bad.py
       tests/test_models_encoder.py tests/test_fuzz_corpus.py)

. scripts/instrumented_install.sh
instrumented_install "$VENV" "$SANITIZERS" build/sanitize

runtime=""
case "$SANITIZERS" in *address*) runtime=$(gcc -print-file-name=libasan.so) ;; esac
# Python's own allocations at exit are not leaks of ours; everything else aborts the test.
# Reports go to files: pytest captures the test's stderr, and an abort would lose it there.
reports="$PWD/build/sanitize-reports"
rm -rf "$reports" && mkdir -p "$reports"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1:log_path=$reports/asan}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan}
if [ "$#" -eq 0 ]; then set -- "${TESTS[@]}"; fi
root=$PWD
# pytest from outside the source tree, so the sanitized copy in the venv is the one imported
cd "$VENV"
status=0
LD_PRELOAD="$runtime" bin/python -m pytest -q -p no:cacheprovider --rootdir="$root" \
  "${@/#tests\//$root/tests/}" || status=$?
if compgen -G "$reports/*" > /dev/null; then
  cat "$reports"/* >&2
  if [ "$status" -eq 0 ]; then status=1; fi   # a report the tests did not notice still fails the run
fi
exit "$status"
