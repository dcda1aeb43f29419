"""Make the low-bit i-quant synthetic models and record llama.cpp's golden outputs for them.

For each target type T in IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M this writes

* tests/data/synth/llama-wide-<t>.gguf: the metadata and tensor list of
  llama-wide-iq4_xs.gguf (the template: which tensors llama.cpp quantizes),
  with every IQ4_XS tensor replaced by the BF16 source weights of
  llama-wide-bf16.gguf quantized to T by ggml's own quantizer
  (ggml_quantize_chunk, through ctypes, with an importance matrix of ones),
  and general.file_type set to llama.cpp's LLAMA_FTYPE_MOSTLY_<T>;
* tests/data/golden/synth/llama-wide-<t>.json: llama.cpp's logits over the
  prompts of llama-wide-iq4_xs.json, in the same schema (argmax at every
  prompt position, the 64 largest last-position logits, 32 greedy tokens).

It needs a llama.cpp build through llama-cpp-python (both the quantizer,
libggml-base.so, and the recorder come from it):

    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_iq_synth.py [--types IQ2_XXS,IQ1_M]
    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_iq_synth.py --record-only MODEL.gguf OUT.json

The second form only records a golden file for an existing model (used to
check the recorder against a golden file recorded earlier).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np
from gguf import (GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType,
                  quants)

ROOT = Path(__file__).resolve().parent.parent
SYNTH = ROOT / "tests" / "data" / "synth"
GOLDEN = ROOT / "tests" / "data" / "golden" / "synth"
SOURCE = SYNTH / "llama-wide-bf16.gguf"
TEMPLATE = SYNTH / "llama-wide-iq4_xs.gguf"
TEMPLATE_GOLDEN = GOLDEN / "llama-wide-iq4_xs.json"

TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
N_CONTINUE = 32   # greedy tokens per case, as in the existing golden files
N_TOP = 64        # largest last-position logits kept per case
LOGIT_DECIMALS = 5


# ---------------------------------------------------------------- quantizing

class GgmlQuantizer:
    """ggml's reference quantizers, from the libggml-base.so that llama-cpp-python ships.

    ggml's enum ggml_type and gguf.GGMLQuantizationType share their numbering
    (both are the on-disk GGUF type ids), so the gguf enum values are passed as is.
    """

    def __init__(self) -> None:
        import llama_cpp   # only to find its bundled libraries
        lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
        self.lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
        self.lib.ggml_quantize_init.argtypes = [ctypes.c_int]
        self.lib.ggml_quantize_init.restype = None
        self.lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                 ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self.lib.ggml_quantize_chunk.restype = ctypes.c_size_t

    def quantize(self, qtype: GGMLQuantizationType, weights: np.ndarray) -> np.ndarray:
        """(rows, n_per_row) float32 -> (rows, row bytes) uint8 in ggml's block layout."""
        weights = np.ascontiguousarray(weights, dtype=np.float32)
        nrows, n_per_row = weights.shape
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        assert n_per_row % block == 0, (qtype.name, weights.shape)
        row_bytes = n_per_row // block * block_bytes
        out = np.zeros((nrows, row_bytes), dtype=np.uint8)
        # IQ2_XXS/IQ2_XS/IQ1_S/IQ1_M refuse to run without an importance matrix;
        # ones weigh every column alike, i.e. plain least squares, for every type.
        imatrix = np.ones(n_per_row, dtype=np.float32)
        self.lib.ggml_quantize_init(int(qtype))   # builds the grids the i-quants search
        written = self.lib.ggml_quantize_chunk(int(qtype), weights.ctypes.data, out.ctypes.data, 0, nrows, n_per_row,
                                               imatrix.ctypes.data)
        assert written == out.nbytes, (qtype.name, written, out.nbytes)
        return out


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """BF16 stored as bytes (rows, 2 * n) -> float32 (rows, n): BF16 is the top half of an F32."""
    halves = np.ascontiguousarray(raw).view(np.uint16)
    return (halves.astype(np.uint32) << 16).view(np.float32)


def source_weights() -> dict[str, np.ndarray]:
    """Every BF16 tensor of the float source as float32 (rows, n_per_row)."""
    reader = GGUFReader(SOURCE)
    return {t.name: bf16_to_f32(t.data) for t in reader.tensors if t.tensor_type == GGMLQuantizationType.BF16}


# ---------------------------------------------------------------- writing

def copy_metadata(reader: GGUFReader, writer: GGUFWriter, file_type: int) -> None:
    """Every key of the template except those the writer owns, with the template's value types."""
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue   # the header and the architecture key are written by GGUFWriter itself
        vtype = field.types[0]
        value = field.contents()
        if key == "general.file_type":
            value = file_type
        sub_type = field.types[1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub_type)


def write_model(qtype: GGMLQuantizationType, quantizer: GgmlQuantizer, weights: dict[str, np.ndarray],
                path: Path) -> None:
    template = GGUFReader(TEMPLATE)
    arch = template.fields["general.architecture"].contents()
    file_type = int(LlamaFileType[f"MOSTLY_{qtype.name}"])
    writer = GGUFWriter(path, arch)
    copy_metadata(template, writer, file_type)
    for tensor in template.tensors:   # same order as the template
        if tensor.tensor_type == GGMLQuantizationType.IQ4_XS:
            data = quantizer.quantize(qtype, weights[tensor.name])
            # For a quantized raw_dtype the writer takes the byte shape (rows, row bytes)
            # and derives the element shape (the template's) from the block size.
            writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------- checking

def check_like_template(path: Path, qtype: GGMLQuantizationType) -> None:
    """Same keys, values, tensor names, order and shapes as the template; only the types differ."""
    template, made = GGUFReader(TEMPLATE), GGUFReader(path)
    skip = {"GGUF.kv_count", "general.file_type"}
    t_keys = [k for k in template.fields if k not in skip]
    m_keys = [k for k in made.fields if k not in skip]
    assert t_keys == m_keys, (t_keys, m_keys)
    for key in t_keys:
        a, b = template.fields[key], made.fields[key]
        assert a.types == b.types and a.contents() == b.contents(), key
    assert made.fields["general.file_type"].contents() == int(LlamaFileType[f"MOSTLY_{qtype.name}"])
    assert [t.name for t in template.tensors] == [t.name for t in made.tensors]
    for a, b in zip(template.tensors, made.tensors):
        assert a.shape.tolist() == b.shape.tolist(), a.name
        want = qtype if a.tensor_type == GGMLQuantizationType.IQ4_XS else a.tensor_type
        assert b.tensor_type == want, (a.name, b.tensor_type)
        if b.tensor_type != qtype:
            assert np.array_equal(np.array(a.data), np.array(b.data)), a.name


def relative_rms_error(path: Path, qtype: GGMLQuantizationType, weights: dict[str, np.ndarray]) -> float:
    """RMS(dequantized - source) / RMS(source) over all quantized tensors (gguf-py's decoder)."""
    err = ref = 0.0
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type != qtype:
            continue
        decoded = quants.dequantize(np.array(tensor.data), qtype)
        source = weights[tensor.name]
        assert decoded.shape == source.shape and np.isfinite(decoded).all(), tensor.name
        err += float(np.sum((decoded.astype(np.float64) - source) ** 2))
        ref += float(np.sum(source.astype(np.float64) ** 2))
    return (err / ref) ** 0.5


# ---------------------------------------------------------------- golden outputs

def load_llama(model: Path):
    from llama_cpp import Llama
    # One batch for the whole prompt, logits at every position, and llama.cpp's
    # plain attention, as the existing golden files were recorded.
    return Llama(str(model), n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True, n_threads=2, flash_attn=False,
                 verbose=False)


def record_case(llm, ids: list[int]) -> dict:
    llm.reset()   # n_tokens = 0: the next eval also clears the KV cache
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
    last = logits[-1]
    top = np.argsort(-last, kind="stable")[:N_TOP]
    greedy = []
    for _ in range(N_CONTINUE):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(token)
        llm.eval([token])
    return {
        "prompt": list(ids),
        "ids": list(ids),
        "argmax": [int(i) for i in np.argmax(logits, axis=1)],
        "top_ids": [int(i) for i in top],
        "top_logits": [round(float(last[i]), LOGIT_DECIMALS) for i in top],
        "greedy": greedy,
        # Like the existing files: the bytes of the tokens, invalid UTF-8 replaced.
        "greedy_text": llm.detokenize(greedy).decode("utf-8", errors="replace"),
    }


def record_golden(model: Path, out: Path) -> dict:
    """llama.cpp's outputs for `model` over the prompts of llama-wide-iq4_xs.json, written to `out`."""
    prompts = [case["ids"] for case in json.loads(TEMPLATE_GOLDEN.read_text(encoding="utf-8"))["cases"]]
    llm = load_llama(model)   # held until the end: its context is freed with it
    golden = {"model": model.name, "n_continue": N_CONTINUE, "cases": [record_case(llm, ids) for ids in prompts]}
    llm.close()
    # Byte for byte the formatting of the existing golden files.
    out.write_text(json.dumps(golden, indent=1, ensure_ascii=False), encoding="utf-8")
    return golden


# ---------------------------------------------------------------- main

def make_all(types: list[str]) -> None:
    quantizer = GgmlQuantizer()
    weights = source_weights()
    for name in types:
        qtype = GGMLQuantizationType[name]
        model = SYNTH / f"llama-wide-{name.lower()}.gguf"
        write_model(qtype, quantizer, weights, model)
        check_like_template(model, qtype)
        rel = relative_rms_error(model, qtype, weights)
        golden = GOLDEN / f"llama-wide-{name.lower()}.json"
        record_golden(model, golden)
        print(f"{name:8s} {model.stat().st_size:8d} B  rel. RMS error {rel:.4f}  -> {model.name}, {golden.name}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated GGML types (default: all)")
    parser.add_argument("--record-only", nargs=2, metavar=("MODEL", "OUT"), help="only record a golden file")
    args = parser.parse_args(argv)
    if args.record_only:
        record_golden(Path(args.record_only[0]), Path(args.record_only[1]))
    else:
        make_all([t.strip().upper() for t in args.types.split(",") if t.strip()])


if __name__ == "__main__":
    main(sys.argv[1:])
