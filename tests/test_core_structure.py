"""The native core's shape (issue #25, backend-neutral core): csrc/core builds graphs, checks shapes and
plans memory and reaches nothing of csrc/cpu, directly or through another header; a backend is a table
(core/backend.h) the build selects folders for; the CPU's per-type kernel table stays small; Python
lists the devices the build computes on."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pyengine import _core
from pyengine.ml import device

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
# CMakeLists.txt's include directories, in its order (a quoted include looks beside its file first)
INCLUDE_DIRS = ["include", ".", "core", "cpu", "quant"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def resolve(name: str, beside: Path, root: Path) -> Path | None:
    for folder in [beside, *(root / d for d in INCLUDE_DIRS)]:
        path = folder / name
        if path.is_file():
            return path.resolve()
    return None


def cpu_reached(start: Path, root: Path) -> list[str]:
    """The chains of includes by which `start` reaches a file under root/cpu."""
    cpu = (root / "cpu").resolve()
    found, seen, todo = [], set(), [(start.resolve(), [start.name])]
    while todo:
        path, chain = todo.pop()
        for name in INCLUDE.findall(path.read_text(errors="replace")):
            target = resolve(name, path.parent, root)
            if target is None or target in seen:
                continue
            seen.add(target)
            if cpu in target.parents:
                found.append(" -> ".join([*chain, str(target.relative_to(root))]))
            else:
                todo.append((target, [*chain, name]))
    return found


def core_violations(root: Path) -> list[str]:
    core = sorted((root / "core").glob("*.[ch]"))
    assert core, f"no sources under {root / 'core'}"
    return [chain for path in core for chain in cpu_reached(path, root)]


def test_core_includes_nothing_of_cpu():
    assert core_violations(CSRC) == []


def test_the_check_finds_a_core_file_that_reaches_cpu(tmp_path):
    # a copy of the tree where one core file takes the CPU's shared header (or a quant/ header that does)
    tree = tmp_path / "csrc"
    shutil.copytree(CSRC, tree)
    bad = tree / "core" / "graph_ops.c"
    bad.write_text('#include "kquants.h"\n' + bad.read_text())
    found = core_violations(tree)
    assert found and all("cpu/kernels.h" in chain for chain in found)
    assert found[0].startswith("graph_ops.c -> kquants.h")


def test_the_executor_pool_and_kernel_tables_live_in_cpu():
    for name in ("exec.c", "pool.c", "dispatch.c", "kernels.h", "internal.h"):
        assert (CSRC / "cpu" / name).is_file(), name
    backend_h = (CSRC / "core" / "backend.h").read_text()
    for member in ("alloc", "free", "copy", "supports_op", "compute", "sync"):
        assert re.search(rf"\(\*{member}\)\(", backend_h), member


def struct_members(text: str, name: str) -> list[str]:
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
    assert body, name
    code = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    return [m.strip() for m in code.split(";") if m.strip()]


def test_the_per_type_kernel_table_has_at_most_8_members():
    members = struct_members((CSRC / "cpu" / "kernels.h").read_text(), "pe_type_kernels")
    assert 3 <= len(members) <= 8, members
    # what a type needs: from_float to its partner, the dot product, a tile, the optional repacks
    assert any(m.endswith(" from_float") for m in members) and any(m.endswith(" vec_dot") for m in members)


def test_the_member_count_sees_a_wide_table():
    wide = "typedef struct pe_type_kernels {\n" + "".join(f"    int f{i}; /* x; y */\n" for i in range(12)) + \
           "} pe_type_kernels;"
    assert len(struct_members(wide, "pe_type_kernels")) == 12


def test_the_build_lists_its_backends_cpu_first():
    found = _core.backends()
    assert found[0] == ("cpu", 1)
    assert device.backends()[0] == "cpu"
    devices = device.devices()
    cpu = devices[0]
    assert (cpu.backend, cpu.kind, cpu.index) == ("cpu", "cpu", 0)
    assert cpu.isa == _core.isa() and cpu.isa in cpu.isas and "scalar" in cpu.isas
    assert cpu.isas[-1] == _core.best_isa()
    assert cpu.cores == _core.physical_cores() >= 1 and cpu.logical >= 1
    assert cpu.isa in cpu.describe() and f"{cpu.cores} cores" in cpu.describe()
    assert [d for d in devices[1:] if d.kind != "gpu"] == []


def test_cmake_refuses_a_backend_the_tree_has_no_folder_for(tmp_path):
    cmake = shutil.which("cmake")
    assert cmake, "cmake is needed to build pyengine"
    run = subprocess.run([cmake, "-S", str(ROOT), "-B", str(tmp_path), "-DPYENGINE_BACKENDS=cpu;nosuchgpu"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "PYENGINE_BACKENDS names 'nosuchgpu'" in run.stderr.replace("\n", " ")


@pytest.mark.parametrize("name", ["cpu"])
def test_each_backend_in_the_registry_has_its_folder(name):
    registry = (CSRC / "core" / "backend.c").read_text()
    assert f"&pe_backend_{name}" in registry
    assert (CSRC / name).is_dir()
