#!/usr/bin/env bash
# Build the native core in place (pyengine/_core*.so) for development:
#   scripts/dev_build.sh [extra cmake args]; then PYTHONPATH=. python -m pytest
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build/dev"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPython_EXECUTABLE="$(command -v python3)" "$@" >/dev/null
cmake --build "$build" -j "${JOBS:-2}"
# copy then rename, so a process that has the old module loaded keeps its file
for so in "$build"/_core*.so; do
    cp "$so" "$root/pyengine/.$(basename "$so").new"
    mv -f "$root/pyengine/.$(basename "$so").new" "$root/pyengine/$(basename "$so")"
done
