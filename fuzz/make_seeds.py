"""Writes the seed corpora of tests/data/fuzz/<surface>/seeds/ (run once; the seeds are committed).

Each seed is small (libFuzzer mutates every byte of it), and each is taken from, or built
like, the project's test fixtures: the GGUF seeds are a tiny llama model written with the
`gguf` package (one layer, 32 tokens: small enough to mutate, whole enough to load and run)
and the heads of the synthetic models; the text seeds come from the fixtures of the tests
of each surface.  Needs the `gguf` package (the synthetic models' writer):

    python fuzz/make_seeds.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FUZZ_DATA = ROOT / "tests" / "data" / "fuzz"
SYNTH = ROOT / "tests" / "data" / "synth"


def write_seed(surface: str, name: str, data: bytes | str) -> None:
    folder = FUZZ_DATA / surface / "seeds"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def tiny_llama(path: Path) -> None:
    """A whole llama model of ~12 KiB: SentencePiece vocabulary of 32 pieces, n_embd 32."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    rng = np.random.default_rng(33)
    pieces = ["<unk>", "<s>", "</s>", "▁"] + [chr(c) for c in range(ord("a"), ord("a") + 28)]
    n_vocab, n_embd, n_ff = len(pieces), 32, 64
    writer = GGUFWriter(path, "llama")
    writer.add_name("fuzz-tiny")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(16)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores([-float(i) for i in range(n_vocab)])
    writer.add_token_types([2, 3, 3] + [1] * (n_vocab - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def matrix(name: str, n_out: int, n_in: int) -> None:
        data = (rng.standard_normal((n_out, n_in)) * 0.1).astype(np.float32)
        q8_0 = quants.quantize(data, GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, q8_0, raw_shape=q8_0.shape, raw_dtype=GGMLQuantizationType.Q8_0)

    matrix("token_embd.weight", n_vocab, n_embd)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    matrix("blk.0.attn_q.weight", n_embd, n_embd)
    matrix("blk.0.attn_k.weight", n_embd // 2, n_embd)
    matrix("blk.0.attn_v.weight", n_embd // 2, n_embd)
    matrix("blk.0.attn_output.weight", n_embd, n_embd)
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    matrix("blk.0.ffn_gate.weight", n_ff, n_embd)
    matrix("blk.0.ffn_up.weight", n_ff, n_embd)
    matrix("blk.0.ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_seeds() -> None:
    tiny = FUZZ_DATA / "gguf" / "seeds" / "tiny-llama.gguf"
    tiny.parent.mkdir(parents=True, exist_ok=True)
    tiny_llama(tiny)
    # the heads of a few synthetic models: header, metadata and the start of their tables
    for stem in ("llama-spm-q4_0", "qwen3moe-q8_0", "gemma2-q8_0", "phi3-q5_0"):
        write_seed("gguf", f"{stem}.head", (SYNTH / f"{stem}.gguf").read_bytes()[:4096])


def tokenizer_seeds() -> None:
    texts = ["Hello world", " leading space", "tabs\tand\nnewlines\n\n", "naïve café 東京 🚀",
             "x = [1, 2, 3]  # comment", "   ", "<s>ab</s> <|im_end|>", "aaaaaaaaaaaaaaaa",
             "ÅÄÖ ß İ ﬁ", "\u200b\ufeff\x00\x7f"]
    for i, text in enumerate(texts):
        write_seed("tokenizer", f"text{i}", bytes([i % 8]) + text.encode("utf-8"))


def gbnf_seeds() -> None:
    from pyengine.sample.json_schema import JSON_OBJECT_GRAMMAR

    grammars = [
        'root ::= "yes" | "no"',
        'root ::= [a-z]+ ("," [a-z]+)*',
        'root ::= item{2,4}\nitem ::= [0-9] " "?',
        'root ::= "(" root ")" | ""',
        'root ::= [^\\n"]* "\\n"',
        'root ::= "\\x41" [\\u00e9-\\u00ff] [\\U0001F600]',
        JSON_OBJECT_GRAMMAR,
    ]
    samples = ["yes", "ab,cd", "1 2 3", "(())", "hi\n", "Aé😀", '{"a": [1, 2.5e3, true, null]}']
    for i, (grammar, sample) in enumerate(zip(grammars, samples)):
        write_seed("gbnf", f"g{i}", grammar + "\0" + sample)


def schema_seeds() -> None:
    schemas = [
        {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
         "required": ["name"]},
        {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
        {"enum": ["a", 1, None, True]},
        {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "boolean"}]},
        {"$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/n"}}},
        {"type": "string", "pattern": "^[a-c]{2}x?$"},
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"const": {"k": [1, 2]}},
        {"type": "string", "format": "date"},
        True,
    ]
    for i, schema in enumerate(schemas):
        write_seed("json_schema", f"s{i}", json.dumps(schema))


def template_seeds() -> None:
    for i in range(8):
        write_seed("template", f"t{i}", bytes(range(i * 13, i * 13 + 40)))


def parser_seeds() -> None:
    outputs = [
        "<think>a plan</think>The answer.",
        '<tool_call>\n{"name": "get", "arguments": {"city": "Paris"}}\n</tool_call>',
        '[TOOL_CALLS]get[ARGS]{"x": 1}',
        '[TOOL_CALLS][{"name": "f", "arguments": {}}]',
        '<|python_tag|>{"name": "f", "parameters": {"a": "b"}}',
        '<|python_tag|>f.call(a="b")',
        "<think>unclosed",
        '<tool_call><function=f><parameter=a>1</parameter></function></tool_call>',
        "<|channel|>final<|message|>hi<|return|>",
    ]
    for i, text in enumerate(outputs):
        write_seed("parsers", f"p{i}", bytes([i, 7 * i % 256]) + text.encode("utf-8"))


def server_seeds() -> None:
    bodies = [
        (0, {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "stream": False}),
        (1, {"model": "fake", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}),
        (2, {"model": "fake", "input": ["a", "b"]}),
        (3, {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
             "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
        (4, {"model": "fake", "prompt": "Hi", "max_tokens": 2, "logprobs": 1}),
        (5, {"model": "fake", "input": "hello"}),
        (6, {"model": "fake"}),
        (7, {"model": "new", "from": "fake", "system": "be brief"}),
        (8, {"model": "fake", "input": "Hi", "max_output_tokens": 16}),
        (0, {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "format": {"type": "object"},
             "stream": True}),
    ]
    for i, (route, body) in enumerate(bodies):
        write_seed("server", f"b{i}", bytes([route]) + json.dumps(body).encode("utf-8"))


def main() -> int:
    gguf_seeds()
    tokenizer_seeds()
    gbnf_seeds()
    schema_seeds()
    template_seeds()
    parser_seeds()
    server_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
