"""Make the synthetic qwen3moe model with MXFP4 experts and record llama.cpp's golden outputs for it.

llama.cpp stores MXFP4 only in the experts (file type MOSTLY_MXFP4_MOE, as
gpt-oss ships), so this takes tests/data/synth/qwen3moe-q8_0.gguf (the
template: keys, tokenizer and every other tensor as they are) and replaces
each ffn_{gate,up,down}_exps tensor by its Q8_0 values requantized to MXFP4
by gguf's quantizer, writing

* tests/data/synth/qwen3moe-mxfp4.gguf, general.file_type MOSTLY_MXFP4_MOE;
* tests/data/golden/synth/qwen3moe-mxfp4.json: llama.cpp's logits over the
  prompts every synthetic model is recorded on (synth_common's recorder).

    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_qwen3moe_mxfp4.py [--no-golden]
"""

from __future__ import annotations

import sys
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

import synth_common

TEMPLATE = synth_common.SYNTH_DIR / "qwen3moe-q8_0.gguf"
EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def copy_keys(template: GGUFReader, writer: GGUFWriter) -> None:
    """Every key after general.architecture in the template's order, the file type
    changed to MOSTLY_MXFP4_MOE."""
    for key, field in template.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            writer.add_file_type(int(LlamaFileType.MOSTLY_MXFP4_MOE))
            continue
        value_type = field.types[0]
        element_type = field.types[1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), value_type, sub_type=element_type)


def write_model(path: Path) -> None:
    template = GGUFReader(TEMPLATE)
    writer = GGUFWriter(path, "qwen3moe")
    copy_keys(template, writer)
    for t in template.tensors:
        if t.name.endswith(EXPERTS):
            values = quants.dequantize(t.data, t.tensor_type)
            data, qtype = quants.quantize(values, GGMLQuantizationType.MXFP4), GGMLQuantizationType.MXFP4
        else:
            data, qtype = t.data, t.tensor_type
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            writer.add_tensor(t.name, data)
        else:   # the writer takes the byte shape of a quantized tensor
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    synth_common.main(sys.argv[1:], __doc__, "qwen3moe-mxfp4", write_model, synth_common.record_golden)
