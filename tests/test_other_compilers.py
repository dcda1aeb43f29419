"""The native core under the compilers of the platforms this machine cannot run: clang
(macOS builds with it, for x86-64 and arm64) and MinGW-w64 (Windows' headers and C
runtime), every source with the flags CMakeLists.txt gives it, warnings as errors.

Needs the Debian packages clang and gcc-mingw-w64-x86-64, and for arm64's headers
libc6-dev-arm64-cross (.ci/run installs them)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMMON = ["-std=c11", "-O2", "-c", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
          "-Wno-missing-field-initializers", "-ffp-contract=off",
          "-Icsrc/include", "-Icsrc", "-Icsrc/core", "-Icsrc/cpu", "-Icsrc/quant"]
# CMakeLists.txt's per-file instruction sets, by file name prefix
X86_FLAGS = {
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-mbmi2"],
    "avxvnni": ["-mavx2", "-mfma", "-mf16c", "-mbmi2", "-mavxvnni"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c",
               "-mbmi2"],
}
ARM_FLAGS = ["-march=armv8.2-a+dotprod+fp16"]   # CMake's for the NEON files; harmless on the others
ARM_NODOT_FLAGS = ["-march=armv8-a", "-DPE_NEON_NODOT=1"]
ARM_SYSROOT = "/usr/aarch64-linux-gnu"


def sources(arch: str) -> list[pathlib.Path]:
    other = "/arm/" if arch == "x86" else "/x86/"
    return sorted(p for p in (ROOT / "csrc").rglob("*.c") if other not in p.as_posix())


def x86_flags(src: pathlib.Path) -> list[str]:
    for prefix, flags in X86_FLAGS.items():
        if "/x86/" in src.as_posix() and src.name.startswith(prefix + "_"):
            return flags
    return []


def arm_flags(src: pathlib.Path) -> list[str]:
    return ARM_FLAGS


def compile_all(compiler: list[str], arch: str, flags_of, tmp_path: pathlib.Path) -> None:
    missing = shutil.which(compiler[0]) is None
    assert not missing, f"{compiler[0]} is not installed (.ci/run installs it)"
    defines = ["-DPE_ARCH_X86=1", "-DPE_HAVE_AVXVNNI=1"] if arch == "x86" else ["-DPE_ARCH_ARM=1"]

    def one(src: pathlib.Path) -> str:
        run = subprocess.run([*compiler, *COMMON, *defines, *flags_of(src), str(src.relative_to(ROOT)),
                              "-o", str(tmp_path / (src.stem + ".o"))], cwd=ROOT, capture_output=True, text=True)
        return "" if run.returncode == 0 else f"{src.relative_to(ROOT)}:\n{run.stderr[-1500:]}"

    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [out for out in pool.map(one, sources(arch)) if out]
    assert not failures, "\n".join(failures)


def arm_nodot_flags(src: pathlib.Path) -> list[str]:
    """CMake's second NEON build (the core's other files are the same as in the first)."""
    return ARM_NODOT_FLAGS if "/arm/" in src.as_posix() else ARM_FLAGS


@pytest.mark.parametrize("compiler, arch, flags_of", [
    (["clang"], "x86", x86_flags),
    (["clang", "--target=aarch64-linux-gnu", f"--sysroot={ARM_SYSROOT}"], "arm",
     arm_flags),
    (["clang", "--target=aarch64-linux-gnu", f"--sysroot={ARM_SYSROOT}"], "arm",
     arm_nodot_flags),
    (["x86_64-w64-mingw32-gcc"], "x86", x86_flags),
], ids=["clang-x86_64", "clang-arm64", "clang-arm64-nodot", "mingw-w64"])
def test_every_source_compiles_without_warnings(tmp_path, compiler, arch, flags_of):
    compile_all(compiler, arch, flags_of, tmp_path)


def test_the_per_file_flags_follow_cmake():
    """Every x86 kernel file is one CMakeLists.txt compiles with its own flags, and this
    test gives each (and the NEON files) the flags CMake does."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    for prefix, flags in [*X86_FLAGS.items(), ("neon", ARM_FLAGS)]:
        assert ";".join(flags) in cmake, prefix
    assert "-march=armv8-a" in cmake and "PE_NEON_NODOT=1" in cmake
    kernels = [p for p in (ROOT / "csrc/cpu/x86").glob("*.c")]
    assert kernels and all(x86_flags(p) for p in kernels)
