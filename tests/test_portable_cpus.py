"""The installed build runs on older x86-64 CPUs: under qemu's models of a Haswell
(AVX2, no AVX-512) and a Sandy Bridge (AVX but no AVX2 or FMA: numpy 2.4's wheels no
longer start on a Nehalem) it picks the AVX2 and scalar tables,
executes no instruction those CPUs lack, and computes the same logits, bit for bit, as
this machine does with PYENGINE_ISA forcing the same table.

Needs Debian's qemu-user (.ci/run installs it); x86-64 hosts only, as CI's is."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import SYNTH

MODELS = ["llama-wide-q4_k_s.gguf", "llama-wide-q4_0.gguf", "qwen3-q4_1.gguf"]
TOKENS = [1, 5, 17, 42, 99, 7, 3, 250, 11, 64]
CHILD = """
import sys, numpy as np
from pyengine import LLM, _core
out = {"isa": np.array(_core.isa())}
for i, path in enumerate(sys.argv[2:]):
    out[f"m{i}"] = LLM(path, n_ctx=32, n_threads=2).forward_logits(%r)
np.savez(sys.argv[1], **out)
""" % (TOKENS,)


def child_logits(tmp_path, name: str, prefix: list[str], env: dict) -> dict:
    result = tmp_path / f"{name}.npz"
    run = subprocess.run([*prefix, sys.executable, "-c", CHILD, str(result), *(str(SYNTH / m) for m in MODELS)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(np.load(result))


@pytest.mark.parametrize("cpu, isa", [("Haswell", "avx2"), ("SandyBridge", "scalar")])
def test_older_cpus_pick_their_table_and_give_its_bits(tmp_path, cpu, isa):
    assert platform.machine().lower() in ("x86_64", "amd64"), "this check is for x86-64 hosts"
    qemu = shutil.which("qemu-x86_64")
    assert qemu, "install qemu-user (.ci/run does)"
    env = {k: v for k, v in os.environ.items() if k != "PYENGINE_ISA"}
    emulated = child_logits(tmp_path, cpu, [qemu, "-cpu", cpu], env)
    native = child_logits(tmp_path, isa, [], {**env, "PYENGINE_ISA": isa})
    assert str(emulated["isa"]) == isa
    for i, _ in enumerate(MODELS):
        assert np.array_equal(emulated[f"m{i}"].view(np.uint32), native[f"m{i}"].view(np.uint32)), MODELS[i]
