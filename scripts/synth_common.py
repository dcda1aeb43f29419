"""What the make_synth_*.py scripts share: paths, the GGUF writing and the golden recording.

Each synthetic model borrows the tokenizer of llama-bpe-q5_1-tied.gguf, stores
its 2-D tensors in Q8_0 and the others in F32, and has its golden file recorded
by make_iq_synth.py's recorder over the prompts of llama-bpe-q5_1-tied.json.
The scripts keep only what is their architecture's own (hyper-parameters,
tensors, architecture keys, recorder options) and call these functions for the
rest.  Every function here writes the same bytes the scripts wrote before it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_iq_synth  # noqa: E402  (the golden recorder)

ROOT = Path(__file__).resolve().parent.parent
SYNTH_DIR = ROOT / "tests" / "data" / "synth"
GOLDEN_DIR = ROOT / "tests" / "data" / "golden" / "synth"
TOKENIZER_SOURCE = SYNTH_DIR / "llama-bpe-q5_1-tied.gguf"   # the 512-token BPE vocab every model borrows
PROMPTS_SOURCE = GOLDEN_DIR / "llama-bpe-q5_1-tied.json"    # the prompts every golden file is recorded over

# The arguments make_iq_synth.load_llama gives Llama(): one batch for the whole
# prompt, logits at every position, llama.cpp's plain attention.
RECORDER_CONTEXT_ARGS = {"n_ctx": 512, "n_batch": 512, "n_ubatch": 512, "logits_all": True, "n_threads": 2,
                         "flash_attn": False, "verbose": False}


def model_paths(stem: str) -> tuple[Path, Path]:
    """(model file, golden file) of the synthetic model `stem`, e.g. "glm4-q8_0"."""
    return SYNTH_DIR / f"{stem}.gguf", GOLDEN_DIR / f"{stem}.json"


# ---------------------------------------------------------------- writing the model

def read_tokenizer_source() -> GGUFReader:
    """The GGUF whose tokenizer.* keys every synthetic model copies."""
    return GGUFReader(TOKENIZER_SOURCE)


def vocab_size(tokenizer: GGUFReader) -> int:
    """Number of tokens in `tokenizer`'s vocabulary (the rows of token_embd)."""
    return len(tokenizer.fields["tokenizer.ggml.tokens"].contents())


class RandomWeights:
    """Seeded random float32 weights, each drawn from `rng` when asked for: the order of
    the calls fixes the values (and so the model's bytes).  `std` maps a kind of tensor
    (e.g. "attn_q", "bias_q") to the standard deviation of its entries."""

    def __init__(self, rng: np.random.Generator, std: dict[str, float]) -> None:
        self.rng, self.std = rng, std

    def matrix(self, kind: str, n_out: int, n_in: int) -> np.ndarray:
        """An [n_out, n_in] matrix (numpy order) of N(0, std[kind]) entries."""
        return (self.rng.standard_normal((n_out, n_in)) * self.std[kind]).astype(np.float32)

    def vector(self, kind: str, n: int) -> np.ndarray:
        """n entries of N(0, std[kind]), e.g. a bias."""
        return (self.rng.standard_normal(n) * self.std[kind]).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        """n RMS-norm weights of 1 +- 0.1: near the identity, yet not equal to it."""
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)


def embedding_and_output(w: RandomWeights, n_vocab: int, n_embd: int, *,
                         tied: bool = False) -> list[tuple[str, np.ndarray]]:
    """The embedding, the output norm and (unless `tied`) the output, drawn in that order."""
    out = [("token_embd.weight", w.matrix("token_embd", n_vocab, n_embd)),
           ("output_norm.weight", w.norm(n_embd))]
    if not tied:
        out.append(("output.weight", w.matrix("output", n_vocab, n_embd)))
    return out


def attention_tensors(w: RandomWeights, prefix: str, *, n_embd: int, q_dim: int, kv_dim: int,
                      biases: bool = False) -> list[tuple[str, np.ndarray]]:
    """A block's attn_norm, q, k, v and attn_output, drawn in that order; with `biases`, each
    of q, k and v followed by its bias (kinds bias_q, bias_k, bias_v)."""
    out = [(prefix + "attn_norm.weight", w.norm(n_embd))]
    for proj, n_out in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
        out.append((prefix + f"attn_{proj}.weight", w.matrix(f"attn_{proj}", n_out, n_embd)))
        if biases:
            out.append((prefix + f"attn_{proj}.bias", w.vector(f"bias_{proj}", n_out)))
    out.append((prefix + "attn_output.weight", w.matrix("attn_output", n_embd, q_dim)))
    return out


def mamba2_tensors(w: RandomWeights, prefix: str, *, n_embd: int, d_inner: int, d_state: int, n_head: int,
                   n_group: int, d_conv: int, norm: bool = True) -> list[tuple[str, np.ndarray]]:
    """A Mamba-2 mixer's tensors, drawn in this order: ssm_in, the conv taps and bias (kinds
    conv, conv_b), the dt bias (dt_b), A = -exp(U[0, 1.6)) (decays from near 1 to near 0 over
    a token), D around 1, the grouped norm (unless `norm` is False), ssm_out."""
    n_conv = d_inner + 2 * n_group * d_state
    out = [(prefix + "ssm_in.weight", w.matrix("ssm_in", d_inner + n_conv + n_head, n_embd)),
           (prefix + "ssm_conv1d.weight", w.matrix("conv", n_conv, d_conv)),
           (prefix + "ssm_conv1d.bias", w.vector("conv_b", n_conv)),
           (prefix + "ssm_dt.bias", w.vector("dt_b", n_head)),
           (prefix + "ssm_a", -np.exp(w.rng.uniform(0.0, 1.6, (n_head, 1))).astype(np.float32)),
           (prefix + "ssm_d", (1.0 + 0.3 * w.rng.standard_normal((n_head, 1))).astype(np.float32))]
    if norm:
        out.append((prefix + "ssm_norm.weight", w.norm(d_inner).reshape(n_group, d_inner // n_group)))
    out.append((prefix + "ssm_out.weight", w.matrix("ssm_out", n_embd, d_inner)))
    return out


def add_mamba2_keys(writer: GGUFWriter, *, d_inner: int, d_state: int, n_head: int, n_group: int,
                    d_conv: int) -> None:
    """Mamba-2's ssm.* keys (mamba2_tensors' dimensions), in the order the scripts write them."""
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(n_head)
    writer.add_ssm_group_count(n_group)


# a Mamba-2 mixer's 2-D tensors kept in F32: the 4-tap kernels and the grouped norms (rows Q8_0
# cannot block), A and D
MAMBA2_KEPT_F32 = ("ssm_conv1d.weight", "ssm_norm.weight", "ssm_a", "ssm_d")


def q8_0_matrices_but_mamba2_vectors(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """q8_0_matrices, except for the tensors in MAMBA2_KEPT_F32 (F32)."""
    return q8_0_matrices(name, data) if not name.endswith(MAMBA2_KEPT_F32) else None


def gated_mlp_tensors(w: RandomWeights, prefix: str, *, n_embd: int, n_ff: int,
                      norm: str = "ffn_norm.weight") -> list[tuple[str, np.ndarray]]:
    """A block's MLP norm (named `norm`: Falcon-H1's has no `.weight`), gate, up and down,
    drawn in that order."""
    return [(prefix + norm, w.norm(n_embd)),
            (prefix + "ffn_gate.weight", w.matrix("ffn_gate", n_ff, n_embd)),
            (prefix + "ffn_up.weight", w.matrix("ffn_up", n_ff, n_embd)),
            (prefix + "ffn_down.weight", w.matrix("ffn_down", n_embd, n_ff))]


def add_head_keys(writer: GGUFWriter, *, head_dim: int, eps: float, rope_base: float) -> None:
    """Key and value head sizes, the RMS epsilon, the rope base and (all of a head) its dimensions."""
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_freq_base(rope_base)
    writer.add_rope_dimension_count(head_dim)


def llama_tensors(w: RandomWeights, *, n_vocab: int, n_embd: int, n_layer: int, q_dim: int, kv_dim: int, n_ff: int,
                  tied: bool = False, after_attention=None) -> list[tuple[str, np.ndarray]]:
    """Llama's tensors, (name, float32 array in numpy order [out, in]), drawn from `w` in
    llama.cpp's usual file order (the order fixes the values): the embedding, the output
    norm and (unless `tied`) the output, then per block its norms, q/k/v/output and
    gate/up/down.  after_attention(prefix), when given, returns a block's extra tensors,
    drawn and placed right after its attn_output (e.g. q/k norms)."""
    out = embedding_and_output(w, n_vocab, n_embd, tied=tied)
    for i in range(n_layer):
        p = f"blk.{i}."
        out += attention_tensors(w, p, n_embd=n_embd, q_dim=q_dim, kv_dim=kv_dim)
        if after_attention is not None:
            out += after_attention(p)
        out += gated_mlp_tensors(w, p, n_embd=n_embd, n_ff=n_ff)
    return out


def start_model(path: Path, arch: str, *, name: str, n_layer: int, n_ctx: int, n_embd: int, n_ff: int,
                n_head: int, n_head_kv: int) -> GGUFWriter:
    """A GGUFWriter for `path` holding the keys every synthetic model opens with, in this order:
    general.name, then block count, context, embedding and feed-forward lengths, head counts.
    The caller adds its architecture's keys next, then calls finish_q8_0_model."""
    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    return writer


def copy_tokenizer(tokenizer: GGUFReader, writer: GGUFWriter) -> None:
    """Every tokenizer.* key of `tokenizer`, in its order and with its value types
    (an array keeps its element type), so llama.cpp tokenizes as with the source."""
    for key, field in tokenizer.fields.items():
        if key.startswith("tokenizer."):
            value_type = field.types[0]
            element_type = field.types[1] if value_type == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), value_type, sub_type=element_type)


def q8_0_matrices(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """Q8_0 for a 2-D tensor (a matrix), None (F32) for the others (norms, biases, factors)."""
    return GGMLQuantizationType.Q8_0 if data.ndim == 2 else None


def q8_0_matrices_and_stacks(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """Q8_0 for a matrix or an expert stack (2-D or 3-D), None (F32) for 1-D norms and biases."""
    return GGMLQuantizationType.Q8_0 if data.ndim >= 2 else None


def matrix_stack(w: RandomWeights, kind: str, n: int, n_out: int, n_in: int) -> np.ndarray:
    """[n, n_out, n_in] (numpy order of a GGUF [n_in, n_out, n] stack, e.g. one matrix per
    expert), drawn matrix by matrix."""
    return np.stack([w.matrix(kind, n_out, n_in) for _ in range(n)])


def expert_bias_stack(w: RandomWeights, kind: str, n_expert: int, n: int) -> np.ndarray:
    """[n_expert, n]: one bias row per expert."""
    return np.stack([w.vector(kind, n) for _ in range(n_expert)])


def add_q8_0_tensors(writer: GGUFWriter, tensors: Iterable[tuple[str, np.ndarray]],
                     quantize_as: Callable[[str, np.ndarray], GGMLQuantizationType | None] = q8_0_matrices) -> None:
    """Each (name, float32 array in numpy order) in order, in the type quantize_as(name, array)
    names (gguf's quantizer), or kept in F32 where it names None."""
    for name, data in tensors:
        qtype = quantize_as(name, data)
        if qtype is not None:   # the writer takes the byte shape (rows, row bytes) of a quantized tensor
            blocks = quants.quantize(data, qtype)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(name, data)


def finish_q8_0_model(writer: GGUFWriter, tokenizer: GGUFReader, tensors: Iterable[tuple[str, np.ndarray]], *,
                      with_vocab_size: bool = True,
                      quantize_as: Callable[[str, np.ndarray], GGMLQuantizationType | None] = q8_0_matrices) -> None:
    """Add the vocabulary size, file type MOSTLY_Q8_0, the tokenizer and the tensors
    (see add_q8_0_tensors; quantize_as picks each tensor's type), then write the file and close it.

    with_vocab_size=False leaves out the vocabulary size, for a model that wrote it
    earlier among its own keys (the key order is part of the file's bytes)."""
    if with_vocab_size:
        writer.add_vocab_size(vocab_size(tokenizer))
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q8_0))
    copy_tokenizer(tokenizer, writer)
    add_q8_0_tensors(writer, tensors, quantize_as)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------- recording the golden file

@contextlib.contextmanager
def llama_extra_buffer_types_off() -> Iterator[None]:
    """Models loaded inside this block get use_extra_bufts=False (no AMX, no repacked weights).

    Llama() has no argument for it, so the default model parameters it starts from
    are changed, and restored on leaving.  llama-cpp-python's AVX-512 build crashes
    on an AMX host with them on, and pyengine follows no such path."""
    import llama_cpp.llama_cpp as lib   # Llama() takes its model parameters from here

    defaults = lib.llama_model_default_params

    def without_extra_buffer_types():
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without_extra_buffer_types
    try:
        yield
    finally:
        lib.llama_model_default_params = defaults


def record_golden(model: Path, out: Path, *, extra_buffer_types: bool = True, **context_args) -> None:
    """make_iq_synth's recorder (same cases, schema and formatting) for `model`, over the
    prompts of llama-bpe-q5_1-tied.json, written to `out`.

    extra_buffer_types=False loads the model without them (see llama_extra_buffer_types_off);
    `context_args` are Llama() arguments that replace or add to those of make_iq_synth's
    load_llama (e.g. swa_full=True).  make_iq_synth is left as it was afterwards."""
    from llama_cpp import Llama

    def load_llama(path: Path):
        return Llama(str(path), **{**RECORDER_CONTEXT_ARGS, **context_args})

    saved = make_iq_synth.TEMPLATE_GOLDEN, make_iq_synth.load_llama
    make_iq_synth.TEMPLATE_GOLDEN = PROMPTS_SOURCE   # the recorder takes its prompts from this file
    if context_args:
        make_iq_synth.load_llama = load_llama
    try:
        with llama_extra_buffer_types_off() if not extra_buffer_types else contextlib.nullcontext():
            make_iq_synth.record_golden(model, out)
    finally:
        make_iq_synth.TEMPLATE_GOLDEN, make_iq_synth.load_llama = saved


# ---------------------------------------------------------------- command line

def main(argv: list[str], doc: str, stem: str, write_model: Callable[[Path], None],
         record: Callable[[Path, Path], None], *, golden_flag: str = "--no-golden") -> None:
    """Write the model `stem` with write_model(path), then record its golden file with
    record(model, golden) unless told otherwise.

    golden_flag names the script's option: one starting "--no-" skips the golden
    file (recorded by default); any other ("--record") asks for it."""
    model, golden = model_paths(stem)
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    skips = golden_flag.startswith("--no-")
    parser.add_argument(golden_flag, action="store_true", dest="flag",
                        help="only write the model" if skips else "also record the golden file with llama.cpp")
    args = parser.parse_args(argv)
    write_model(model)
    print(f"{model.relative_to(ROOT)}: {model.stat().st_size} B")
    if args.flag != skips:
        record(model, golden)
        print(f"{golden.relative_to(ROOT)}: recorded with llama.cpp")
