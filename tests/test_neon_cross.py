"""The arm64 build: every native source compiles for aarch64, and the NEON
kernels pass their C checks against the scalar reference under qemu.

Needs the Debian packages gcc-aarch64-linux-gnu and qemu-user (.ci/run
installs them)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CC = "aarch64-linux-gnu-gcc"
FLAGS = ["-O2", "-march=armv8.2-a+dotprod+fp16", "-DPE_ARCH_ARM=1", "-static",
         "-Icsrc/include", "-Icsrc/core", "-Icsrc/quant"]


def tools() -> None:
    missing = [t for t in (CC, "qemu-aarch64") if shutil.which(t) is None]
    assert not missing, f"install gcc-aarch64-linux-gnu and qemu-user (missing: {missing})"


def test_every_source_compiles_for_arm64(tmp_path):
    tools()
    sources = [p for p in (ROOT / "csrc").rglob("*.c") if "/x86/" not in p.as_posix()]
    for src in sources:
        subprocess.run([CC, *FLAGS, "-Wall", "-Werror=implicit-function-declaration", "-c",
                        str(src.relative_to(ROOT)), "-o", str(tmp_path / (src.stem + ".o"))],
                       cwd=ROOT, check=True, capture_output=True, text=True)


@pytest.mark.parametrize("check, sources", [
    ("neon_legacy_check.c", ["csrc/quant/ref_float.c", "csrc/quant/ref_legacy.c", "csrc/cpu/arm/neon_legacy.c"]),
    ("neon_kquants_check.c", ["csrc/cpu/arm/neon_kquants.c", "csrc/quant/ref_kquants.c", "csrc/quant/ref_iq4.c",
                              "csrc/quant/ref_kquants_quantize.c", "csrc/quant/ref_legacy.c"]),
])
def test_neon_kernels_match_reference_under_qemu(tmp_path, check, sources):
    tools()
    exe = tmp_path / "check"
    subprocess.run([CC, *FLAGS, f"tests/c/{check}", *sources, "-lm", "-o", str(exe)],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    run = subprocess.run(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(exe)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
