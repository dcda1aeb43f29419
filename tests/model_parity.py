"""Running a model over recorded prompts and comparing with llama.cpp's outputs.

A golden case (tests/data/golden) holds a prompt's ids, llama.cpp's argmax at
every prompt position, its 64 largest logits at the last position and its
greedy continuation.  `run_case` feeds the prompt through `Forward` in chunks
of at most 512 tokens (positions continue, every row is an output), then
continues greedily one token at a time, keeping the logits of each step so a
divergence can be examined.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from pyengine.gguf import GGUFFile
from pyengine.kvcache import Cache, KVCache
from pyengine.ml.context import Backend
from pyengine.ml.nn import RecurrentSpec
from pyengine.models import load_model
from pyengine.runner.forward import Forward

DATA = Path(__file__).parent / "data"
# The golden files come from llama.cpp's builds, whose arithmetic depends on the
# batch a row is in; ours is one arithmetic for every row (a row's alone), so
# the records are met within tolerances (each test file's bounds), not bit for bit.
CHUNK = 512
DROP = object()            # a metadata value for rewrite(): remove the key


@dataclass
class CaseRun:
    ids: list[int]
    logits: np.ndarray          # [T, n_vocab]: our logits at every prompt position
    greedy: list[int]           # our greedy continuation
    greedy_logits: np.ndarray   # [n, n_vocab]: the logits each greedy token was chosen from


def load(path: Path):
    return load_model(GGUFFile(path))


def golden(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cases"]


def prompt_logits(fw: Forward, ids: list[int]) -> np.ndarray:
    ids_arr = np.asarray(ids, np.int32)
    rows = []
    for start in range(0, len(ids_arr), CHUNK):
        chunk = ids_arr[start:start + CHUNK]
        n = len(chunk)
        rows.append(fw(chunk, np.arange(start, start + n), np.zeros(n, np.int32), np.arange(n)).copy())
    return np.concatenate(rows)


def cache_for(layout, n_cells: int, **options) -> Cache | KVCache:
    """A KVCache of n_cells for `layout` (options: kv_type, head_dim), or for a layout with
    recurrent layers the composed Cache, with state rows for one sequence (the empty row,
    the row read and the row written)."""
    if any(isinstance(spec, RecurrentSpec) for spec in layout):
        return Cache.build(layout, n_cells, state_rows=3, **options)
    return KVCache(layout, n_cells, **options)


def run_case(model, backend: Backend, ids: list[int], n_greedy: int, **cache_options) -> CaseRun:
    """cache_options go to the KVCache (e.g. kv_type, head_dim)."""
    cache = cache_for(model.cache_layout(), len(ids) + n_greedy + 1, **cache_options)
    fw = Forward(model, backend, cache)
    logits = prompt_logits(fw, ids)
    step_logits, tokens = [logits[-1]], []
    for i in range(n_greedy):
        tokens.append(int(np.argmax(step_logits[-1])))
        if i + 1 < n_greedy:
            pos = len(ids) + i
            step_logits.append(fw(np.array([tokens[-1]], np.int32), np.array([pos], np.int32),
                                  np.zeros(1, np.int32), np.zeros(1, np.int32))[0].copy())
    return CaseRun(list(ids), logits, tokens, np.stack(step_logits))


@dataclass
class Agreement:
    """How our run compares with llama.cpp's record of one case."""

    argmax_equal: np.ndarray    # [T] bool
    tie_gaps: np.ndarray        # our max minus our logit of llama.cpp's argmax, where they differ
    top10_diff: float           # max |ours - llama.cpp| over llama.cpp's 10 largest logits
    greedy_match: int           # tokens equal before the first difference
    greedy_gap: float           # at that difference: our max minus our logit of llama.cpp's token


def compare(run: CaseRun, case: dict) -> Agreement:
    want = np.asarray(case["argmax"])
    ours = run.logits.argmax(axis=1)
    equal = ours == want
    rows = np.flatnonzero(~equal)
    gaps = run.logits[rows].max(axis=1) - run.logits[rows, want[rows]]
    top_ids = np.asarray(case["top_ids"][:10])
    top10 = float(np.abs(run.logits[-1][top_ids] - np.asarray(case["top_logits"][:10])).max())
    match = 0
    for a, b in zip(run.greedy, case["greedy"]):
        if a != b:
            break
        match += 1
    gap = 0.0
    if match < len(case["greedy"]):
        step = run.greedy_logits[match]
        gap = float(step.max() - step[case["greedy"][match]])
    return Agreement(equal, gaps, top10, match, gap)


# ---- variants of the synthetic models -------------------------------------------

@lru_cache(maxsize=None)
def reader(model: str) -> GGUFReader:
    return GGUFReader(DATA / "synth" / f"{model}.gguf")


def rewrite(tmp_path: Path, model: str, *, meta: dict | None = None, drop: tuple[str, ...] = (),
            add: dict[str, np.ndarray] | None = None, arch: str | None = None,
            retype: dict[str, GGMLQuantizationType] | None = None) -> Path:
    """A copy of synthetic `model` with metadata `meta` ({key: (value, type) or DROP})
    applied, the tensors named in `drop` left out, the float32 tensors in `add`
    (or (raw rows, block type) pairs) added, given `arch`, the architecture (and the prefix of its keys) renamed, and
    the tensors in `retype` given another block type of the same bytes per row."""
    meta = dict(meta or {})
    src = reader(model)
    old_arch = src.fields["general.architecture"].contents()
    arch = arch or old_arch
    out = tmp_path / f"{model}-broken.gguf"
    writer = GGUFWriter(out, arch)
    for old_key, field in src.fields.items():
        key = arch + old_key[len(old_arch):] if old_key.startswith(old_arch + ".") else old_key
        if key.startswith("GGUF.") or key == "general.architecture" or key in meta:
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    for key, change in meta.items():
        if change is not DROP:
            value, vtype = change
            writer.add_key_value(key, value, vtype)
    for t in src.tensors:
        if t.name not in drop:
            writer.add_tensor(t.name, t.data, raw_dtype=(retype or {}).get(t.name, t.tensor_type))
    for name, values in (add or {}).items():
        if isinstance(values, tuple):      # (raw rows, their block type): quantized as they are
            writer.add_tensor(name, values[0], raw_dtype=values[1])
        else:
            writer.add_tensor(name, np.asarray(values, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
