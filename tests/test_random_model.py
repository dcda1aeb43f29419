"""scripts/make_random_model.py: random-weight GGUFs at real shapes load, keep finite
activations through the depth, and carry llama.cpp's type mixes."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize

from pyengine import LLM

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_random_model.py"
spec = importlib.util.spec_from_file_location("make_random_model", SCRIPT)
mrm = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mrm   # dataclasses look their module up there
spec.loader.exec_module(mrm)

# 8 layers: use_more_bits picks 0 (first eighth), 7 (last eighth), 3 and 6 (every third between)
LLAMA8 = mrm.Shape("llama", 600, 256, 8, 512, 4, 2, 64, tied=True, rope_base=500000.0, llama3_rope_factor=32.0)
# rows of 160 do not split into 256-blocks: llama.cpp's fallbacks (Q5_0, Q8_0) take over
QWEN2_NARROW = mrm.Shape("qwen2", 512, 160, 2, 256, 5, 1, 32, tied=False, eps=1e-6)
GEMMA3 = mrm.Shape("gemma3", 700, 256, 2, 512, 2, 1, 128, tied=True, eps=1e-6, sliding_window=64)
PROMPT = [1, 40, 80, 120, 300, 7, 9]
# DeepSeek-V2-Lite's layout, small: a dense first layer, routed + shared experts, MLA without a q LoRA
DEEPSEEK2 = mrm.Shape("deepseek2", 600, 256, 3, 512, 4, 1, 96, tied=False, eps=1e-6, kv_lora_rank=128,
                      rope_dims=32, v_head_dim=64, n_dense_lead=1, n_expert=8, n_expert_used=2, n_ff_exp=128,
                      n_expert_shared=1, yarn_factor=40.0, yarn_orig_ctx=64, yarn_log_mul=0.0707)


def tensor_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def check_runs(path: Path, n_vocab: int) -> None:
    llm = LLM(str(path), n_ctx=64)
    try:
        logits = llm.forward_logits(PROMPT)
        assert logits.shape == (len(PROMPT), n_vocab)
        assert np.isfinite(logits).all()
        assert 0.3 < logits.std() < 3.0            # the RMS survived the depth: neither vanished nor grew
        done = llm.create_completion(PROMPT, max_tokens=4, temperature=0)
        assert done["usage"]["completion_tokens"] == 4     # the random weights never chose EOS here
    finally:
        llm.close()


@pytest.mark.parametrize("mix", ["q4_k_m", "q4_0", "q8_0", "f16"])
def test_llama_mixes_load_and_stay_finite(tmp_path, mix):
    path = mrm.write_model(tmp_path / f"llama-{mix}.gguf", LLAMA8, mix)
    types = tensor_types(path)
    more_bits = {0, 3, 6, 7}
    if mix == "q4_k_m":
        expected = {f"blk.{i}.{n}.weight": "Q6_K" if i in more_bits else "Q4_K"
                    for i in range(8) for n in ("attn_v", "ffn_down")}
        expected |= {f"blk.{i}.{n}.weight": "Q4_K" for i in range(8)
                     for n in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")}
        expected["token_embd.weight"] = "Q6_K"          # tied: quantized as the output
    else:
        main_type = {"q4_0": "Q4_0", "q8_0": "Q8_0", "f16": "F16"}[mix]
        expected = {name: main_type for name in types if name.endswith(".weight") and "norm" not in name
                    and name != "rope_freqs.weight"}
        expected["token_embd.weight"] = {"q4_0": "Q6_K"}.get(mix, main_type)
    assert {n: t for n, t in types.items() if n in expected} == expected
    assert all(types[n] == "F32" for n in types if n not in expected)
    assert "output.weight" not in types
    check_runs(path, LLAMA8.n_vocab)


def test_fallback_types_and_biases(tmp_path):
    path = mrm.write_model(tmp_path / "qwen2.gguf", QWEN2_NARROW, "q4_k_m")
    types = tensor_types(path)
    assert types["output.weight"] == "Q8_0"            # 160 columns: Q6_K's fallback
    assert types["token_embd.weight"] == "Q5_0"        # untied: Q4_K, whose fallback is Q5_0
    assert types["blk.0.attn_q.weight"] == "Q5_0"
    assert types["blk.0.attn_v.weight"] == "Q5_0"      # layer 0 of 2 is not picked for more bits
    assert types["blk.1.attn_v.weight"] == "Q8_0"      # layer 1 of 2 is (Q6_K, whose fallback is Q8_0)
    assert types["blk.0.ffn_down.weight"] == "Q4_K"    # 256 columns: no fallback
    assert types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.attn_k.bias"] == "F32"
    check_runs(path, QWEN2_NARROW.n_vocab)


def test_gemma3_shape_runs(tmp_path):
    path = mrm.write_model(tmp_path / "gemma3.gguf", GEMMA3, "q4_k_m")
    assert "blk.1.post_ffw_norm.weight" in tensor_types(path)
    check_runs(path, GEMMA3.n_vocab)


def test_deepseek2_shape_runs(tmp_path):
    path = mrm.write_model(tmp_path / "deepseek2.gguf", DEEPSEEK2, "q4_k_m")
    types = tensor_types(path)
    assert types["blk.1.ffn_gate_inp.weight"] == "F32" and "blk.0.ffn_gate_inp.weight" not in types
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in GGUFReader(path).tensors}
    assert shapes["blk.1.ffn_down_exps.weight"] == (128, 256, 8)     # GGML order [in, out, E]
    assert shapes["blk.2.attn_k_b.weight"] == (64, 128, 4)
    check_runs(path, DEEPSEEK2.n_vocab)


def test_deepseek_v2_lite_shape():
    s = mrm.SHAPES["deepseek-v2-lite"]
    names = [t.name for t in mrm.model_tensors(s)]
    assert "blk.0.ffn_gate.weight" in names and "blk.1.ffn_gate_exps.weight" in names
    assert "blk.5.attn_q.weight" in names and "blk.5.attn_q_a.weight" not in names   # no q LoRA


def test_weights_have_the_chosen_spread(tmp_path):
    """Every block type's random codes and scales give entries of mean ~0 and standard
    deviation ~1/sqrt(columns): what keeps each matmul's output at its input's RMS."""
    path = mrm.write_model(tmp_path / "narrow.gguf", QWEN2_NARROW, "q4_k_m")
    seen = set()
    for t in GGUFReader(path).tensors:
        if t.tensor_type.name == "F32":
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float64)
        sigma = 1 / math.sqrt(w.shape[-1])
        assert abs(w.mean()) < 0.1 * sigma, t.name
        assert 0.9 * sigma < w.std() < 1.1 * sigma, t.name
        seen.add(t.tensor_type.name)
    assert seen == {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}
    for qtype in (T.Q4_0, T.F16):
        rows = mrm.random_rows(qtype, 64, 512, 0.05, mrm.RandomBytes(np.random.default_rng(1)))
        w = dequantize(rows, qtype)
        assert abs(w.mean()) < 0.005 and 0.045 < w.std() < 0.055


def test_tokenizer_padded_to_the_shape(tmp_path):
    path = mrm.write_model(tmp_path / "llama.gguf", LLAMA8, "q8_0")
    reader = GGUFReader(path)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    token_types = reader.fields["tokenizer.ggml.token_type"].contents()
    source = GGUFReader(mrm.DEFAULT_TOKENIZER).fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == len(token_types) == LLAMA8.n_vocab == reader.fields["llama.vocab_size"].contents()
    assert tokens[:len(source)] == source
    assert tokens[len(source)] == f"<|reserved_{len(source)}|>" and len(set(tokens)) == len(tokens)
    assert set(token_types[len(source):]) == {3}
    llm = LLM(str(path), n_ctx=64)
    try:
        assert llm.detokenize(llm.tokenize("hello world", add_special=False)) == "hello world"
    finally:
        llm.close()


def test_llama3_rope_factors():
    factors = mrm.llama3_rope_factors(LLAMA8)
    assert factors.shape == (32,)
    assert factors[0] == 1.0 and factors[-1] == 32.0   # short wavelengths kept, long ones slowed
    assert np.all(np.diff(factors) >= 0)


def test_mix_rule_at_real_depths():
    def more_bits(n_layer):
        return [i for i in range(n_layer) if mrm.matrix_type("q4_k_m", "ffn_down", 4096, i, n_layer) == T.Q6_K]

    assert more_bits(16) == [0, 1, 4, 7, 10, 13, 14, 15]                               # Llama 3.2 1B
    assert more_bits(32) == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]   # Llama 3.1 8B
    assert mrm.matrix_type("q4_k_m", "output", 4096) == T.Q6_K
    assert mrm.matrix_type("q4_k_m", "token_embd", 4096) == T.Q4_K
    assert mrm.matrix_type("q4_0", "output", 896) == T.Q8_0     # Q6_K does not fit 896 columns
    assert mrm.matrix_type("q8_0", "output", 4096) == T.Q8_0


def test_specs():
    assert mrm.parse_spec("llama-3.2-1b") == ("llama-3.2-1b", "q4_k_m")
    assert mrm.parse_spec("qwen2.5-7b:Q8_0") == ("qwen2.5-7b", "q8_0")
    with pytest.raises(ValueError, match="unknown shape"):
        mrm.parse_spec("llama-9b:q4_0")
    with pytest.raises(ValueError, match="unknown type mix"):
        mrm.parse_spec("llama-3.2-1b:q3_k")
    with pytest.raises(ValueError, match="do not fit"):
        mrm.write_model("unused.gguf", mrm.Shape("llama", 100, 256, 1, 256, 4, 4, 64, tied=True), "q8_0")


def test_compare_takes_a_random_shape(tmp_path):
    """benchmarks/compare.py --random writes the shape's file once into --random-dir and measures it."""
    import subprocess

    compare = SCRIPT.parent.parent / "benchmarks" / "compare.py"
    cmd = [sys.executable, str(compare), "--random", "smollm2-135m:q4_0", "--random-dir", str(tmp_path),
           "--rounds", "1", "--n-prompt", "8", "--n-gen", "2", "--threads", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "smollm2-135m-q4_0.gguf").stat().st_size > 50_000_000
    row = next(line for line in out.stdout.splitlines() if line.startswith("smollm2-135m:q4_0") and "pyengine" in line)
    assert float(row.split()[2]) > 0                    # a prompt rate was measured
    bad = subprocess.run([sys.executable, str(compare), "--random", "llama-9b"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "unknown shape 'llama-9b'" in bad.stderr


# Qwen3-30B-A3B's kind of layer, small: 16 experts of 128 (4 chosen), q/k norms
QWEN3MOE = mrm.Shape("qwen3moe", 600, 256, 8, 768, 4, 2, 64, tied=False, eps=1e-6,
                     n_expert=16, n_expert_used=4, n_ff_exp=256)


def test_qwen3moe_experts_load_and_stay_finite(tmp_path):
    """Expert stacks are written 3-D in the Q4_K_M mix (ffn_down_exps by ffn_down's rule),
    the router float32, and the model runs."""
    path = mrm.write_model(tmp_path / "qwen3moe.gguf", QWEN3MOE, "q4_k_m")
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    more_bits = {0, 3, 6, 7}
    for i in range(8):
        p = f"blk.{i}."
        assert tensors[p + "ffn_gate_inp.weight"].tensor_type.name == "F32"
        assert [int(d) for d in tensors[p + "ffn_gate_exps.weight"].shape] == [256, 256, 16]
        assert [int(d) for d in tensors[p + "ffn_down_exps.weight"].shape] == [256, 256, 16]
        assert tensors[p + "ffn_gate_exps.weight"].tensor_type.name == "Q4_K"
        assert tensors[p + "ffn_down_exps.weight"].tensor_type.name == ("Q6_K" if i in more_bits else "Q4_K")
        assert p + "ffn_gate.weight" not in tensors and p + "attn_k_norm.weight" in tensors
    check_runs(path, QWEN3MOE.n_vocab)


# gpt-oss-20b's layout, small: biased projections, sinks, alternating windows, biased experts in MXFP4
GPT_OSS = mrm.Shape("gpt-oss", 600, 256, 4, 256, 8, 2, 64, tied=False, sliding_window=16, n_expert=8,
                    n_expert_used=2, n_ff_exp=256, yarn_factor=32.0, yarn_orig_ctx=64)


def test_gpt_oss_shape_runs_with_mxfp4_experts(tmp_path):
    path = mrm.write_model(tmp_path / "gpt-oss.gguf", GPT_OSS, "mxfp4_moe")
    types = tensor_types(path)
    assert {types[f"blk.3.{n}_exps.weight"] for n in ("ffn_gate", "ffn_up", "ffn_down")} == {"MXFP4"}
    assert types["blk.0.attn_q.weight"] == types["output.weight"] == "Q8_0"
    assert types["blk.1.ffn_gate_inp.weight"] == types["blk.1.ffn_up_exps.bias"] == types["blk.1.attn_sinks.weight"] \
        == "F32"
    check_runs(path, GPT_OSS.n_vocab)
    reader = GGUFReader(path)
    w = dequantize(next(t for t in reader.tensors if t.name == "blk.0.ffn_up_exps.weight").data, T.MXFP4)
    sigma = 1 / math.sqrt(GPT_OSS.n_embd)
    assert abs(w.mean()) < 0.1 * sigma and 0.7 * sigma < w.std() < 1.4 * sigma   # a power-of-two scale


def test_gpt_oss_20b_shape_holds_its_parameters():
    s = mrm.SHAPES["gpt-oss-20b"]
    n_params = sum(math.prod(t.shape) for t in mrm.model_tensors(s))
    assert 20.5e9 < n_params < 21.5e9                   # "gpt-oss-20b": 20.9B parameters
    names = {t.name for t in mrm.model_tensors(s)}
    assert {"blk.23.attn_sinks.weight", "blk.23.ffn_down_exps.bias", "output.weight"} <= names
# the hybrids, small: LFM2 (short convolutions in layers 0 and 2), Qwen3.5 (the delta rule in 0-2)
LFM2 = mrm.Shape("lfm2", 600, 256, 4, 512, 4, 2, 64, tied=True, attn_layers=(1, 3), conv_kernel=3)
QWEN35 = mrm.Shape("qwen35", 600, 256, 4, 512, 2, 1, 128, tied=True, eps=1e-6, rope_dims=32,
                   full_attention_interval=4, conv_kernel=4, ssm_state=64, ssm_groups=2, ssm_v_heads=4,
                   rope_sections=(4, 4, 4, 4))


@pytest.mark.parametrize("shape", [LFM2, QWEN35], ids=["lfm2", "qwen35"])
def test_hybrid_shapes_run(tmp_path, shape):
    """The convolution taps stay F32 (rows of 3-4 taps), the other matrices take the mix,
    and the model runs with finite, unshrunk activations."""
    path = mrm.write_model(tmp_path / f"{shape.arch}.gguf", shape, "q4_k_m")
    types = tensor_types(path)
    taps = "blk.0.shortconv.conv.weight" if shape.arch == "lfm2" else "blk.0.ssm_conv1d.weight"
    assert types[taps] == "F32"
    assert ("blk.1.attn_q.weight" in types) == (shape.arch == "lfm2")     # layer 1 attends in LFM2 only
    check_runs(path, shape.n_vocab)


def test_hybrid_real_shapes():
    """LFM2-1.2B attends in 6 of its 16 layers; Qwen3.5-2B in every 4th of 24, with a gate per
    query head."""
    lfm2 = {t.name: t.shape for t in mrm.model_tensors(mrm.SHAPES["lfm2-1.2b"])}
    assert sum(f"blk.{i}.attn_q.weight" in lfm2 for i in range(16)) == 6
    assert lfm2["blk.0.shortconv.in_proj.weight"] == (3 * 2048, 2048)
    qwen = {t.name: t.shape for t in mrm.model_tensors(mrm.SHAPES["qwen3.5-2b"])}
    assert [i for i in range(24) if f"blk.{i}.attn_q.weight" in qwen] == [3, 7, 11, 15, 19, 23]
    assert qwen["blk.3.attn_q.weight"] == (2 * 8 * 256, 2048)
    assert qwen["blk.0.attn_qkv.weight"] == (2 * 16 * 128 + 16 * 128, 2048)
