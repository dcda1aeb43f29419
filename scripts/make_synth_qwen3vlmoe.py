"""Make the synthetic Qwen3-VL-MoE text model and record llama.cpp's golden outputs for it.

Takes tests/data/synth/qwen3moe-q8_0.gguf (2 layers of n_embd 64, 4 heads of 32
over 2 key/value heads with q/k head norms, 4 experts of 64 with 2 used) as the
template - tokenizer and tensors as they are, the keys renamed to the
architecture - and adds interleaved M-RoPE sections 4/2/2/8 of the 16 rotated
pairs and one deepstack layer, writing

* tests/data/synth/qwen3vlmoe-q8_0.gguf: `general.architecture = qwen3vlmoe`;
  under the interleaved sections the time stream turns pairs 0, 3, 6, 9, the
  row and column streams 1, 4 and 2, 5, and the fourth stream, which llama.cpp
  holds at 0 for text, the other 8 - so text tokens leave half the pairs
  unturned, unlike NeoX rope, and the interleaving differs from runs of pairs;
* tests/data/golden/synth/qwen3vlmoe-q8_0.json: llama.cpp's logits over the
  prompts every synthetic model is recorded on (synth_common's recorder, extra
  buffer types off).

    PYTHONPATH=<dir holding llama_cpp> python scripts/make_synth_qwen3vlmoe.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

import synth_common

TEMPLATE = synth_common.SYNTH_DIR / "qwen3moe-q8_0.gguf"
ARCH, OLD_ARCH = "qwen3vlmoe", "qwen3moe"
SECTIONS = (4, 2, 2, 8)
N_DEEPSTACK = 1


def write_model(path: Path) -> None:
    template = GGUFReader(TEMPLATE)
    writer = GGUFWriter(path, ARCH)
    for key, field in template.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.name":
            writer.add_name("synthetic-qwen3vlmoe")
            continue
        new_key = ARCH + key[len(OLD_ARCH):] if key.startswith(OLD_ARCH + ".") else key
        sub_type = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(new_key, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_rope_dimension_sections(list(SECTIONS))
    writer.add_num_deepstack_layers(N_DEEPSTACK)
    for t in template.tensors:
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            writer.add_tensor(t.name, t.data)
        else:   # the writer takes the byte shape of a quantized tensor
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


record_golden = functools.partial(synth_common.record_golden, extra_buffer_types=False)


if __name__ == "__main__":
    synth_common.main(sys.argv[1:], __doc__, "qwen3vlmoe-q8_0", write_model, record_golden)
