#!/usr/bin/env bash
# Build the native core in place (pyengine/_core*.so) for development:
#   scripts/dev_build.sh [extra cmake args]; then PYTHONPATH=. python -m pytest
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build/dev"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPython_EXECUTABLE="$(command -v python3)" "$@" >/dev/null
cmake --build "$build" -j "${JOBS:-2}"
cp "$build"/_core*.so "$root/pyengine/"
