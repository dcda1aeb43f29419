# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: installs this checkout's pyengine,
# its native core built with the given sanitizers, into a virtual environment of its own.
#   instrumented_install VENV SANITIZERS BUILD_DIR     (CC picks the compiler)
# pyengine's dependencies come from the calling Python's environment, after the venv's
# own packages: a plain path in a .pth file, so an editable install of pyengine there is
# not activated in the venv, and the instrumented copy is the one imported.
instrumented_install() {
  local venv=$1 sanitizers=$2 build=$3 site
  python -m venv --clear "$venv"
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$site/outer.pth"
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall \
    --config-settings=cmake.define.PYENGINE_SANITIZE="$sanitizers" \
    --config-settings=build-dir="$build" .
}
