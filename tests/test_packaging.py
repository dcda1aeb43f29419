"""Packaging: the wheel matrix cibuildwheel would build, a wheel built here that
auditwheel accepts and that runs from a fresh environment with no compiler on PATH,
and a source build that says what is missing when the machine has no C compiler."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import sysconfig
import zipfile

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYTHONS = ("cp310", "cp311", "cp312", "cp313")
MATRIX = {
    "linux": ("manylinux_x86_64", "manylinux_aarch64", "musllinux_x86_64"),
    "macos": ("macosx_x86_64", "macosx_arm64"),
    "windows": ("win_amd64", "win_arm64"),
}


def tool(package: str, name: str) -> str:
    """A build tool's binary from its PyPI package (PATH may hold only shims)."""
    module = __import__(package)
    return str(pathlib.Path(getattr(module, "CMAKE_BIN_DIR" if package == "cmake" else "BIN_DIR")) / name)


@pytest.mark.parametrize("platform", MATRIX)
def test_cibuildwheel_builds_every_platform_of_the_matrix(platform):
    run = subprocess.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", platform,
                          str(ROOT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    identifiers = set(run.stdout.split())
    assert identifiers == {f"{python}-{tag}" for python in PYTHONS for tag in MATRIX[platform]}


def test_the_workflow_builds_wheels_on_each_platform_and_an_sdist():
    workflow = yaml.safe_load((ROOT / ".github/workflows/wheels.yml").read_text())
    jobs = workflow["jobs"]
    assert set(jobs) == {"wheels", "sdist"}
    runners = [entry["os"] for entry in jobs["wheels"]["strategy"]["matrix"]["include"]]
    assert any(r.startswith("ubuntu") and r.endswith("-arm") for r in runners)
    assert any(r.startswith("macos") for r in runners) and any(r.startswith("windows") for r in runners)
    assert any(step.get("uses", "").startswith("pypa/cibuildwheel@") for step in jobs["wheels"]["steps"])


def test_a_source_build_without_a_compiler_says_what_to_install(tmp_path):
    bin_dir = tmp_path / "bin"   # only the build tools, no compiler
    bin_dir.mkdir()
    (bin_dir / "ninja").symlink_to(tool("ninja", "ninja"))
    run = subprocess.run([tool("cmake", "cmake"), "-G", "Ninja", "-S", str(ROOT), "-B", str(tmp_path / "build")],
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "no C compiler was found" in run.stderr and "binary wheel" in run.stderr


@pytest.mark.slow
def test_a_built_wheel_is_manylinux_and_runs_without_a_compiler(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=1200)
    [wheel] = wheels.glob("pyengine-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("pyengine/_core") for n in names)
    assert not any(n.startswith(("tests/", "csrc/")) for n in names)
    repaired = tmp_path / "repaired"
    show = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "-w", str(repaired), str(wheel)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert show.returncode == 0, show.stderr[-2000:]
    [fixed] = repaired.glob("*.whl")
    assert "manylinux" in fixed.name
    # nothing grafted in: the core needs only the C library, libm and threads
    assert not any(".libs/" in n for n in zipfile.ZipFile(fixed).namelist())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(fixed)], check=True,
                   capture_output=True, timeout=300)
    # then the dependencies from this environment, after the venv's own packages: a plain path
    # in a .pth file (written after the install, or pip would find pyengine there and skip it),
    # so that no editable install of pyengine here is activated in the venv either
    site_dir = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    (pathlib.Path(site_dir) / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = ("import pyengine, sys; from pyengine import LLM; "
            "assert pyengine.__file__.startswith(sys.prefix), pyengine.__file__; "
            f"print(LLM({str(ROOT / 'tests/data/synth/llama-spm-q4_0.gguf')!r}, n_ctx=64)"
            ".generate('Hello', max_tokens=4, temperature=0))")
    run = subprocess.run([str(python), "-c", code], env={"PATH": str(venv / "bin"), "HOME": str(tmp_path)},
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
